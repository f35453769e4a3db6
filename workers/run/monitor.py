"""The owning run's monitor thread: it sees a worker's exit at once, takes it out of the
merges, records why (a "crashed" record), restarts it with a back-off, tells the user what the
workers recorded that needs saying (worker_notices.py: a refused knob record, a resume, a full
disk) and stops the workers when the run directory vanished.

A component of owner.py Run: it is given the run's process handles, lock and stop event, and
calls back into the run for what only the run does (notices, respawning a pack, the step to
join at, members.json). It keeps its own restart bookkeeping, which the run's by-hand actions
(restart, remove) reset through it.
"""

from __future__ import annotations

import multiprocessing.connection
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workers.run.spawn import WorkerProcess
from workers.run.tail import newest_error
from workers.run.worker_notices import WorkerNotices
from workers.rundir.directory import RunDir
from workers.rundir.paths import metrics_name
from workers.rundir.records import Crashed
from workers.rundir.settings import RunSettings
from workers.training.disk_guard import dir_identity
from workers.training.spec import DOES_NOT_FIT, SPLIT_PACK, STATES

MONITOR_S = 0.25  # the monitor thread looks at least this often (a worker's exit: at once)


class WorkerMonitor:
    """Watches the worker processes of one owning run."""

    def __init__(
        self,
        path: Path,
        settings: Callable[[], RunSettings],
        procs: dict[int, WorkerProcess],
        lock: Any,
        stop: Any,
        note: Callable[..., None],
        respawn: Callable[[list[int], int], None],
        split: Callable[[list[WorkerProcess]], None],
        join_step: Callable[[int], int],
        members_changed: Callable[[], None],
        restart_backoff_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`settings()`: the run's current settings; `procs`: its handles by worker (shared,
        guarded by `lock`); `stop`: its stop event; `note(text, in_record=False)`: tell the
        user; `respawn(pack, join_step)`: start a pack again from the merged weights;
        `split(handles)`: start a pack's workers again, each in a process of its own;
        `join_step(k)`: the step worker k joins the others of its pool at;
        `members_changed()`: rewrite members.json (see down()); `clock`: when restarts fall
        due (a test's own clock restarts without waiting)."""
        self.path, self._settings, self._procs = path, settings, procs
        self._lock, self._stop, self._note = lock, stop, note
        self._respawn, self._join_step, self._members_changed = respawn, join_step, members_changed
        self._split, self._clock = split, clock
        self.restart_backoff_s = restart_backoff_s  # before the first automatic restart; doubles
        self.gone: str | None = None  # why the run stopped: its directory vanished
        self._down: dict[int, str] = {}  # merging workers not running now, with why
        self._restarts: dict[int, int] = {}  # automatic restarts so far, per worker
        self._restart_at: dict[int, float] = {}  # scheduled restarts (on `clock`)
        self._rejoin: set[int] = set()  # restarted: back in the merges once past "starting"
        self.thread: threading.Thread | None = None
        self._dir_id: tuple[int, int] | None = None  # the run directory's, when started
        self.notices = WorkerNotices(path, settings, note)

    @property
    def settings(self) -> RunSettings:
        return self._settings()

    def down(self) -> dict[int, str]:
        """Merging workers not running now, with why (nobody waits for them in a merge)."""
        with self._lock:
            return dict(self._down)

    def restarted_by_hand(self, pack: list[int]) -> None:
        """A pack restarted by hand: a fresh allowance of automatic restarts; it merges again
        once it runs."""
        with self._lock:
            for member in pack:
                self._restarts.pop(member, None)
                self._restart_at.pop(member, None)
                self._rejoin.add(member)

    def removed(self, index: int) -> None:
        """A worker taken out of the run: not waited for, not restarted."""
        with self._lock:
            self._down.pop(index, None)
            self._restart_at.pop(index, None)
            self._rejoin.discard(index)

    def mark_start(self) -> None:
        """Before the workers spawn: the directory to watch, and records to tell of from now."""
        self._dir_id = dir_identity(self.path)
        self.notices.from_now()

    def start(self) -> None:
        self.thread = threading.Thread(target=self._watch, name="run-monitor", daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> None:
        # A Ctrl+C can land inside the thread's start(): a thread not yet running is not
        # joined (it sees the stop as soon as it runs).
        if self.thread is not None and self.thread.ident is not None:
            self.thread.join(timeout)

    @property
    def restarting(self) -> bool:
        """True while a crashed worker waits for its automatic restart or is starting again."""
        with self._lock:
            return bool(self._restart_at or self._rejoin)

    def _watch(self) -> None:
        """The monitor thread: sees a worker's exit within MONITOR_S, takes it out of the
        merges at once, records why and restarts it with a back-off (see _ended)."""
        while not self._stop.is_set():
            with self._lock:
                # A pack's workers share one process: wait on it once.
                waiting = list({p.process.sentinel for p in self._procs.values() if not p.handled})
            try:
                # Returns as soon as a worker exits; else after MONITOR_S.
                multiprocessing.connection.wait(waiting, timeout=MONITOR_S)
            except (OSError, ValueError):  # a sentinel closed meanwhile: look again
                time.sleep(MONITOR_S)
            if self._stop.is_set():
                return
            try:
                self.check()
            except Exception as err:  # the monitor must outlive anything it finds
                self._note(f"error: run monitor: {type(err).__name__}: {err}")
                time.sleep(1.0)

    def check_run_dir(self) -> str | None:
        """Once the run directory is deleted or moved, stop the workers (they write
        nothing more, so no partial run is made where it was) and say so; returns why."""
        with self._lock:
            if self.gone is None and self._dir_id is not None:
                if dir_identity(self.path) != self._dir_id:
                    self.gone = (
                        f"the run directory {self.path} vanished (deleted or moved) while the "
                        "run went on: the workers stopped and wrote nothing elsewhere; if it "
                        "was moved, continue with --resume NEW_PATH"
                    )
                    self._note(f"error: {self.gone}")
                    self._stop.set()
            return self.gone

    def check(self) -> None:
        """One look (the thread's, after each wait; a test's, on its own clock): the run
        directory, the workers' records, their ends, the restarts due, the restarted."""
        with self._lock:
            if self.check_run_dir():
                return
            self.notices.scan_records()
            self.notices.watch_disk(self._procs)
            for index, p in list(self._procs.items()):
                if not p.handled and not p.process.is_alive():
                    p.handled = True
                    self._ended(index, p)
            now = self._clock()
            for index, when in list(self._restart_at.items()):
                if now >= when and not self._stop.is_set():
                    del self._restart_at[index]
                    self._restart(index)
            for index in list(self._rejoin):
                self._follow_rejoin(index)

    def _ended(self, index: int, p: WorkerProcess) -> None:
        """A worker process ended: a crash is recorded, taken out of the merges and restarted
        (or left out for good after max_restarts)."""
        state = STATES[int(p.value("state"))]
        self._rejoin.discard(index)
        if p.process.exitcode == SPLIT_PACK and not self._stop.is_set():
            self._split_pack(index, p)
            return
        if state in ("done", "stopped") or index in self.settings.removed or self._stop.is_set():
            return
        code = p.process.exitcode
        if code is not None and code < 0:
            try:
                why = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                why = f"killed by signal {-code}"
        else:
            why = f"exit code {code}"
        last_error = newest_error(self.path / metrics_name(index), since=p.started)
        done = self._restarts.get(index, 0)
        limit = self.settings.max_restarts
        final = done >= limit or code == DOES_NOT_FIT
        if code == DOES_NOT_FIT:
            then = "not restarted: it would not fit again"
            down = "out of GPU memory: left out"
        elif final:
            if limit == 0:
                then = "automatic restarts are off (--max-restarts 0): restart it by hand"
            else:
                then = f"left out for good after {done} restart{'s' * (done != 1)}"
            down = f"crashed ({why}): left out for good"
        else:
            delay = self.restart_backoff_s * 2**done
            then = (
                f"restarting it from the merged weights in {delay:g} s "
                f"(restart {done + 1} of {limit})"
            )
            self._restart_at[index] = self._clock() + delay
            down = f"crashed ({why}), restarting"
        message = f"worker {index} died ({why}"
        message += f"; last error: {last_error})" if last_error else ")"
        message += f"; the others go on without waiting for it; {then}"
        if index in self.settings.merging:
            self._down[index] = down
            self._members_changed()
        self._note(message, in_record=True)
        record = Crashed(
            step=int(p.value("step")),
            message=message,
            exitcode=code,
            signal=signal.Signals(-code).name if code is not None and code < 0 else None,
            last_error=last_error,
            restarts=done,
            final=final,
        )
        try:
            log = RunDir(self.path, metrics=metrics_name(index))
            log.log(record)
            log.close()
        except OSError as err:  # the directory itself may be gone: the notice still says it
            self._note(f"could not record worker {index}'s crash: {err}")

    def _split_pack(self, index: int, p: WorkerProcess) -> None:
        """The pack's self-check found it unsound (its SelfCheck records say why): once every
        member's end is seen, its workers start again, each alone. Not a crash."""
        members = [
            q
            for q in self._procs.values()
            if q.process is p.process and q.spec.index not in self.settings.removed
        ]
        if all(q.handled for q in members):
            self._split(members)
            self._note(
                f"workers {', '.join(str(q.spec.index) for q in members)} go on in a process "
                "each: the self-check found their pack unsound"
            )

    def _restart(self, index: int) -> None:
        """An automatic restart, from the merged weights at the step of the running workers
        (it joins the merges again once it runs: _follow_rejoin). A pack starts again as a
        whole: the first of its workers due spawns it, the others find it running."""
        self._restarts[index] = self._restarts.get(index, 0) + 1
        self._rejoin.add(index)
        if self._procs[index].process.is_alive():
            return
        self._respawn(self.settings.pack_of(index), self._join_step(index))

    def _follow_rejoin(self, index: int) -> None:
        """While a restarted worker starts, keep its starting step at the others' step (it
        reads it once ready); once it runs, it takes part in the merges again."""
        p = self._procs[index]
        state = STATES[int(p.value("state"))]
        if state == "starting":
            if p.process.is_alive():
                p.join.value = self._join_step(index)
            return
        self._rejoin.discard(index)
        if self._down.pop(index, None) is not None:
            self._members_changed()
        step = int(p.value("step"))
        self._note(f"worker {index} runs again from step {step}: it merges again")
