"""Stops: Ctrl+C and SIGTERM end a run cleanly, and no child process prints a traceback.

Ctrl+C in a terminal sends SIGINT to the whole process group: the program's own process and
every worker and showcase process it started. Only the program's process acts on it: it stops
the children itself, each writing its checkpoint. So SIGINT cannot reach a child before it
ignores it (blocked from its start: see children_ignore_ctrl_c), and children treat SIGTERM,
which a service manager sends to every process of the group, as a request for the same clean
stop.
"""

from __future__ import annotations

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
    """In a child process: leave Ctrl+C to the parent (ignored, then let through: one that
    came while the child started is dropped, see children_ignore_ctrl_c); SIGTERM sets the
    returned flag, which the child reads as a request to stop cleanly."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    flag = StopFlag()
    signal.signal(signal.SIGTERM, lambda signum, frame: flag.set())
    return flag


@contextmanager
def children_ignore_ctrl_c() -> Iterator[None]:
    """Processes started inside never see a Ctrl+C before they choose to ignore it, and this
    process loses none. The starting thread blocks SIGINT: a new process inherits that mask
    across exec, so a Ctrl+C to the group waits in it, unseen, until child_signals ignores it
    (and a child interrupted while it still imports torch prints nothing). Here, a Ctrl+C meanwhile
    is held and given to this process's own handler once the start is done (in the main
    thread; elsewhere, as the window starts its runs, the main thread takes it as usual)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    held: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    handler = (
        signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum)) if main else None
    )
    try:
        yield
    finally:
        if main:  # None: a handler not set from Python; the default is the closest
            signal.signal(signal.SIGINT, signal.SIG_DFL if handler is None else handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # one pending here is taken now
        if held:  # one that another thread took while the start went on
            signal.raise_signal(signal.SIGINT)


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
