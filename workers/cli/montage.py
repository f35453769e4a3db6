"""`launch.py montage RUN_DIR`: a learning montage of a run as an MP4 (workers/showcase/
montage.py renders it), with a progress bar, then the file's path. Bad input: one line, exit 2,
nothing written; Ctrl+C: exit 130, nothing written."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from agent.errors import UserError
from workers.cli.parser import CliParser

EPILOG = """examples:
  python3 launch.py montage runs/cartpole-balance-20260101-120000
  python3 launch.py montage runs/X --episodes 12 --out ~/learning.mp4
  python3 launch.py montage runs/X --lane 1     # a race: only lane 1 (default: lanes side by side)
  python3 launch.py montage runs/X --eval       # evaluation episodes instead of training ones
  python3 launch.py montage runs/X --no-agent-view   # a run from pixels without its frames"""


def _size(text: str) -> tuple[int, int]:
    """WIDTHxHEIGHT as (height, width)."""
    match = re.fullmatch(r"(\d+)x(\d+)", text.strip())
    if not match or min(int(match[1]), int(match[2])) < 16:
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT of 16 pixels or more")
    return int(match[2]), int(match[1])


def build_montage_parser() -> CliParser:
    parser = CliParser(
        prog="launch.py montage",
        usage="launch.py montage RUN_DIR [--out FILE.mp4] [--episodes N] [--worker K | --lane L]",
        description="Replay album episodes of a run at increasing steps, one after another at "
        "1x, each\nwith its step, its return and the learning curve, into one MP4.",
        epilog=EPILOG,
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory")
    parser.add_argument(
        "--out",
        default=None,
        metavar="FILE.mp4",
        help="the MP4 to write (default: RUN_DIR/media/montage-TIME.mp4)",
    )
    parser.add_argument(
        "--episodes",
        type=int,
        default=8,
        metavar="N",
        help="episodes, spread evenly over the album",
    )
    parser.add_argument(
        "--worker",
        type=int,
        default=None,
        metavar="K",
        help="whose episodes (default: worker 0, or the first with some)",
    )
    parser.add_argument(
        "--lane",
        type=int,
        default=None,
        metavar="L",
        help="a race: only this lane's (default: every lane side by side)",
    )
    parser.add_argument(
        "--eval", action="store_true", help="evaluation episodes instead of training ones"
    )
    parser.add_argument(
        "--agent-view",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the agent's frames beside each episode (default: for a run from pixels, --obs rgb)",
    )
    parser.add_argument(
        "--task",
        default=None,
        metavar="MODULE:ID",
        help="the run's gymnasium task named again, to let its module be imported (a run "
        "directory is data: its own task imports nothing)",
    )
    parser.add_argument(
        "--size",
        type=_size,
        default=None,
        metavar="WxH",
        help="pixels of each tile (default: 640x480, a race's lanes 480x360)",
    )
    return parser


def make_montage(args: argparse.Namespace) -> Path:
    """Plan, check the target, render with a progress bar; returns the file written."""
    from tqdm import tqdm

    from workers.showcase.montage import render_montage
    from workers.showcase.montage_plan import montage_path, plan_montage

    kind = "eval" if args.eval else "train"
    plan = plan_montage(args.run_dir, args.episodes, args.worker, args.lane, kind)
    if args.out is None:
        out = montage_path(plan.run_path)
        try:
            out.parent.mkdir(exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot write {out}: {err.strerror or err}") from None
    else:
        out = Path(args.out).expanduser()
    bars = []  # made at the first frame: a target refused before shows no bar

    def progress(done: int, total: int) -> None:
        if not bars:
            bars.append(tqdm(total=total, unit="frame", desc="montage", file=sys.stderr))
        bars[0].update(done - bars[0].n)

    try:
        return render_montage(plan, out, args.size, progress=progress, agent_view=args.agent_view)
    finally:
        for bar in bars:
            bar.close()


def main(argv: list[str]) -> int:
    """`launch.py montage ...`: argv as launch.py has it, `montage` first. 2 after bad input
    (a line on stderr), 130 when interrupted."""
    try:
        args = build_montage_parser().parse_args(argv[1:])
        print(make_montage(args))
        return 0
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: no montage written", file=sys.stderr)
        return 130
