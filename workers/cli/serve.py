"""`launch.py serve RUN_DIR`: serve a run that is going on (or finished) to windows on other
machines (workers/remote/server.py), until Ctrl+C. `--serve` beside a headless run does the
same from the training process (headless.py). Bad input: one line, exit 2."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from agent.errors import UserError
from workers.cli.flags import SERVE_PORT
from workers.cli.parser import CliParser
from workers.remote.server import RunServer
from workers.rundir.settings import read_record

EPILOG = """examples:
  python3 launch.py serve runs/humanoid-walk-20261205-120000
  python3 launch.py serve runs/X --port 9000 --read-only
  python3 launch.py serve runs/X --new-token        # the old tokens stop working
  python3 launch.py serve runs/X --host 0.0.0.0     # every network: the token is the only lock"""


def port(text: str) -> int:
    """A TCP port (0: any free one), for argparse: a one-line error otherwise."""
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1-65535 (0: any free one), got {text!r}")
    return int(text)


def build_serve_parser() -> CliParser:
    parser = CliParser(
        prog="launch.py serve",
        usage="launch.py serve RUN_DIR [--port P] [--host H] [--read-only] [--new-token]",
        description="Serve a run to windows on other machines (launch.py --connect URL).",
        epilog=EPILOG,
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory")
    parser.add_argument("--port", type=port, default=SERVE_PORT, help=f"default {SERVE_PORT}")
    parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (loopback)")
    parser.add_argument("--read-only", action="store_true", help="take no command")
    parser.add_argument(
        "--new-token",
        action="store_true",
        help="new tokens: the old ones stop working (a server of this run already going on "
        "takes the new ones too)",
    )
    return parser


def main(argv: list[str]) -> int:
    """`launch.py serve ...`: argv as launch.py has it, `serve` first."""
    args = build_serve_parser().parse_args(argv[1:])
    try:
        read_record(Path(args.run_dir))  # a run directory, or UserError
        server = RunServer(args.host, args.port)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        server.start(args.run_dir, args.read_only, new_token=args.new_token)
    except UserError as err:  # the token file: unwritable, unsafe
        server.stop()
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(server.instructions(), file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(0.5)
            for line in server.notices():
                print(line, file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("stopped serving", file=sys.stderr)
    finally:
        server.stop()
    return 0
