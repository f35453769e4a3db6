"""Montages made for the window: each rendered in a process of its own at a low priority, so
the frame loop never stalls and training keeps its cores; its progress and its end come back
as one-line notices (`lines()`), which the window shows in its status line."""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass
from pathlib import Path

from agent.errors import UserError
from workers.host.signals import child_signals
from workers.showcase.montage_plan import montage_path, plan_montage

PROGRESS_STEP = 0.1  # a notice each time this much more of the frames is done
NICE = 10  # as the showcase player: below the workers


@dataclass(frozen=True)
class MontageRequest:
    run_path: str
    out: str
    episodes: int = 8
    worker: int | None = None
    lane: int | None = None
    kind: str = "train"


def montage_main(request: MontageRequest, notices) -> None:
    """The montage process: render, saying how far it got; SIGTERM (the window closes) ends
    it, leaving no file."""
    term = child_signals()
    os.nice(NICE)
    os.environ.setdefault("LP_NUM_THREADS", "1")  # software GL: one render thread
    from workers.showcase.montage import render_montage  # after nice: imports take seconds

    started, said = time.monotonic(), 0.0

    def progress(done: int, total: int) -> None:
        nonlocal said
        if done / total >= said + PROGRESS_STEP and done < total:
            said = done / total
            notices.put(f"montage: {done / total:.0%} rendered ({done} of {total} frames)")

    try:
        plan = plan_montage(
            request.run_path, request.episodes, request.worker, request.lane, request.kind
        )
        path = render_montage(plan, request.out, progress=progress, stop=term.is_set)
    except UserError as err:
        notices.put(f"error: montage: {err}")
        return
    except KeyboardInterrupt:
        notices.put("montage stopped: no file written")
        return
    except Exception as err:  # said in the window; the process ends anyway
        notices.put(f"error: montage failed ({type(err).__name__}: {err})")
        return
    seconds = time.monotonic() - started
    notices.put(f"montage written in {seconds:.0f} s: {path}")


class MontageJobs:
    """A run's montages made for the window: started (`start`), reported (`lines`)."""

    def __init__(self, ctx, run_path: str | Path):
        self._ctx, self._run_path = ctx, Path(run_path)
        self._notices = None  # a queue once a montage starts: most runs never make one
        self._processes: list = []

    def start(
        self, episodes: int = 8, worker: int | None = None, lane: int | None = None
    ) -> tuple[Path, int]:
        """Render a montage in a new process into the run's media/ folder; returns the file it
        will be and its episodes (fewer than asked in a short album). UserError (nothing
        started) when the run or its album allows none."""
        if self.running():
            raise UserError("a montage is being made already: the status line says how far")
        plan = plan_montage(self._run_path, episodes, worker, lane)  # refused here, not later
        out = montage_path(self._run_path)
        try:
            out.parent.mkdir(exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot write {out}: {err.strerror or err}") from None
        request = MontageRequest(str(self._run_path), str(out), episodes, worker, lane)
        if self._notices is None:
            self._notices = self._ctx.Queue()
        # daemon: a closing window ends it (SIGTERM), and it removes its partial file
        process = self._ctx.Process(
            target=montage_main, args=(request, self._notices), name="montage", daemon=True
        )
        process.start()
        self._processes.append(process)
        return out, plan.episodes

    def wait(self, timeout: float) -> bool:
        """Wait until no montage is being made (tests, a command line); False at the deadline."""
        deadline = time.monotonic() + timeout
        for process in list(self._processes):
            process.join(max(0.0, deadline - time.monotonic()))
        return not self.running()

    def running(self) -> int:
        """How many montages are being rendered now."""
        return sum(p.is_alive() for p in self._processes)

    def lines(self) -> list[str]:
        """Notices since the last call (a process that died without a word too); never
        waits."""
        out = []
        while self._notices is not None:
            try:
                out.append(self._notices.get_nowait())
            except (queue.Empty, OSError, ValueError):
                break
        for process in [p for p in self._processes if not p.is_alive()]:
            self._processes.remove(process)
            if process.exitcode:  # every ending it foresees exits 0, having said so
                out.append(f"error: the montage process died (exit code {process.exitcode})")
        return out
