"""Stops: Ctrl+C and SIGTERM end a run cleanly, and no child process prints a traceback.

Ctrl+C in a terminal sends SIGINT to the whole process group: the program's own process and
every worker and showcase process it started. Only the program's process acts on it: it stops
the children itself, each writing its checkpoint. So children ignore SIGINT from their first
instruction (inherited at their start: see children_ignore_ctrl_c) and treat SIGTERM, which a
service manager sends to every process of the group, as a request for the same clean stop.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class StopFlag:
    """Set by a signal handler and read like an Event (an Event's lock is not safe to take in
    a handler that may interrupt its owner)."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


def child_signals() -> StopFlag:
    """In a child process: leave Ctrl+C to the parent; SIGTERM sets the returned flag, which
    the child reads as a request to stop cleanly."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    flag = StopFlag()
    signal.signal(signal.SIGTERM, lambda signum, frame: flag.set())
    return flag


_SIG_IGN = 1  # the C value of SIG_IGN


def _sigaction(signum: int, handler: bytes | None) -> bytes | None:
    """Linux: swap the C-level disposition of `signum` (any thread may); returns the old
    struct sigaction. None when libc cannot be used this way."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    old = ctypes.create_string_buffer(256)  # larger than struct sigaction on any Linux
    new = None
    if handler is not None:
        new = ctypes.create_string_buffer(handler, 256)
    if libc.sigaction(signum, new, old) != 0:
        return None
    return old.raw


@contextmanager
def children_ignore_ctrl_c() -> Iterator[None]:
    """Processes started inside ignore SIGINT from their start: a disposition of SIG_IGN is
    what a new process inherits (a Python handler is not), and Python then installs no
    KeyboardInterrupt of its own, so a child interrupted while it still imports torch prints
    nothing either. Outside the main thread (the window starts its runs from a worker thread)
    the C-level disposition is swapped and restored, keeping Python's handler as it was.
    The disposition is the whole process's: a Ctrl+C in the milliseconds a start takes is
    lost to this process too (pressed again, it stops the run)."""
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
        return
    ignore = _SIG_IGN.to_bytes(ctypes.sizeof(ctypes.c_void_p), sys.byteorder)
    old = _sigaction(signal.SIGINT, ignore)
    try:
        yield
    finally:
        if old is not None:
            _sigaction(signal.SIGINT, old)


class StopSignals:
    """The command line's Ctrl+C and SIGTERM: the first raises KeyboardInterrupt where the
    program is (training ends cleanly there, saving what it has); later ones only say that the
    stop is under way, so that writing the weights and checkpoints is not cut short. SIGTERM
    is a stop asked for: exit code 0 once it is done; Ctrl+C is an interruption: 130."""

    def __init__(self) -> None:
        self.first: int | None = None

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._received)
        signal.signal(signal.SIGTERM, self._received)

    def _received(self, signum: int, frame: object) -> None:
        if self.first is None:
            self.first = signum
            raise KeyboardInterrupt
        print("already stopping: the weights and checkpoints are being written", file=sys.stderr)

    @property
    def exit_code(self) -> int:
        """0 when nothing or SIGTERM stopped the program, 130 after Ctrl+C."""
        return 130 if self.first == signal.SIGINT else 0
