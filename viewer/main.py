"""`python launch.py` without --headless: open the window on a run (demo, flags, resume, attach)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

from agent.errors import UserError
from viewer.runs import initial_run
from workers.door import (
    WINDOW_THREADS,
    apply_threads,
    build_parser,
    check_threads,
    describe_precision,
)


def check_display() -> None:
    """Fail with a message, not SIGABRT inside GLFW, when there is no display to open."""
    hint = (
        "run it on a desktop, under Xvfb (xvfb-run -a python3 launch.py), "
        "or train without a window (--headless)"
    )
    display = os.environ.get("DISPLAY")
    if not display and not os.environ.get("WAYLAND_DISPLAY"):
        raise UserError(f"no display to open the window on: {hint}")
    if display:
        try:
            x11 = ctypes.CDLL(ctypes.util.find_library("X11") or "libX11.so.6")
        except OSError:
            return  # no Xlib to ask: let the window try
        x11.XOpenDisplay.restype = ctypes.c_void_p
        x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
        connection = x11.XOpenDisplay(display.encode())
        if not connection:
            raise UserError(f"cannot open display {display}: {hint}")
        x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
        x11.XCloseDisplay(connection)


def _already_stopping(signum: int, frame: object) -> None:
    print("already stopping: the workers are writing their checkpoints", file=sys.stderr)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_threads(args.threads)
        make_run = initial_run(args)  # bad flags fail here, before anything is written
        check_display()
        run = make_run()  # creates the run directory (or reads the one to resume/attach)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # nothing started yet
        print("interrupted", file=sys.stderr)
        return 130
    # This process draws and reads records; the workers it starts set their own threads.
    apply_threads(WINDOW_THREADS)
    # Imported only now: Dear PyGui is not needed to report bad input.
    from viewer.app import FRAME_H, FRAME_W, App
    from viewer.controller import Controller

    print(f"opening the window; run directory {run.path}", file=sys.stderr)
    threads = run.workers.describe_threads()
    if threads:
        print(threads, file=sys.stderr)
    print(describe_precision(run.cfg.bf16, run.cfg.device), file=sys.stderr)
    controller = Controller((FRAME_H, FRAME_W), viewport=args.viewport)
    try:
        stats = App(controller, open_first=lambda: run).run()
        print(
            f"window closed after {stats['seconds']:.0f} s at {stats['fps']:.0f} fps",
            file=sys.stderr,
        )
    except KeyboardInterrupt:  # Ctrl+C while the window was still being built
        pass
    finally:  # whatever ended the window, the workers stop cleanly and write checkpoints
        # A second Ctrl+C (or a SIGTERM) must not cut the checkpoints short.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _already_stopping)
        wording = controller.view.wording  # (the run shown last, maybe not the first)
        print(wording.closing, file=sys.stderr)
        controller.shutdown()
    if wording.after_close:
        path = controller.view.run_path or run.path
        print(wording.after_close.format(path=path), file=sys.stderr)
    return 0
