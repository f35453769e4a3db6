"""How the window gets a run: from the command line at start-up, or from the directory picker.

Each function validates its input at once (bad input: a UserError with one clear message) and
returns a callable that the controller thread calls to create, resume or attach the run. What a
new run is made of is decided in workers/cli/new_run.py, once for the command line, the window's
start-up and its new-run dialog (viewer/panels/dialogs.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from workers.door import (
    BaseRun,
    ConnectedRun,
    Run,
    check_run_flags,
    resumable,
    resume_from_args,
    split_url,
    token_from,
    window_run_from_args,
)


def initial_run(args: argparse.Namespace) -> Callable[[], BaseRun]:
    """What creates the run the window opens on, from launch.py's flags. The flags are checked
    now; the run directory is written only when the returned callable is called."""
    if args.connect:
        check_run_flags(args)
        return connect_run(args.connect, args.mirror, args.token_file)
    if args.attach:
        return attach_run(args.attach)
    if args.resume:
        check_run_flags(args)
        resumable(args.resume)  # or a UserError now; reads only
        return lambda: resume_from_args(args)
    return window_run_from_args(args).create


def resume_run(path: str) -> Callable[[], BaseRun]:
    """Resume the run in `path` (the directory picker): checked now, so that a directory this
    process cannot resume is refused before the window stops the run it shows."""
    resumable(path)
    return lambda: Run.resume(path)


def attach_run(path: str) -> Callable[[], BaseRun]:
    Run.attach(path)  # checks the directory; reads only
    return lambda: Run.attach(path)


def connect_run(
    url: str, mirror: str | None, token_file: str | None = None
) -> Callable[[], BaseRun]:
    """A served run on another machine, through a local mirror (workers/remote/connected.py):
    checked now (the server must answer and take the token: from the address, the file, the
    environment, or typed at the terminal); the callable copies the run."""
    base, in_url = split_url(url)
    token = token_from(in_url, token_file, ask=sys.stdin.isatty())
    ConnectedRun.check(base, token)

    def connect() -> BaseRun:
        print(f"copying the served run from {base}...", file=sys.stderr)
        return ConnectedRun.connect(base, mirror, token)

    return connect
