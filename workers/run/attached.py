"""A view of a run that another process started (`launch.py --headless --workers 2`, or a
window): Run.attach gives one.

It owns no workers: progress comes from the workers' metrics records (tail.py),
and pause, resume, checkpoint, stop and worker changes go to the owner as requests
(workers/rundir/requests.py), which it serves (Run.serve_requests). Events, knobs and its own
showcase work as for the owner.
"""

from __future__ import annotations

from pathlib import Path

from agent.config import Config
from agent.errors import ConfigError, UserError
from workers.run.base import BaseRun, Workers
from workers.run.commands import (
    AddWorker,
    Checkpoint,
    Command,
    Pause,
    RemoveWorker,
    RestartWorker,
    Resume,
    Stop,
    request_fields,
)
from workers.run.handle import handle
from workers.run.wording import ATTACHED
from workers.rundir.paths import RUN
from workers.rundir.settings import RunSettings, read_record

TORCHRUN_JOB = (
    "this run is a torchrun job of {ranks} ranks: it takes knobs from the window, but pause, "
    "checkpoint, restarts and adding or removing workers are not served; stop it with Ctrl+C "
    "or SIGTERM to its torchrun launcher (every rank writes a checkpoint)"
)
NOT_SERVED = (
    "no process is training this run now (no worker has written a record for a minute), so "
    "nobody would serve the request: continue the run with --resume {path}"
)


class AttachedRun(BaseRun):
    attached = True
    wording = ATTACHED
    do = handle

    def __init__(self, path: Path, cfg: Config, settings: RunSettings) -> None:
        super().__init__(path, cfg, settings, resumed=True)
        self._settings_changed = 0  # run.json's mtime when last read
        self.workers = AttachedWorkers(self)

    @classmethod
    def open(cls, path: str | Path) -> AttachedRun:
        """Attach to the run in `path` (UserError if it is not a run, or damaged)."""
        path = Path(path)
        cfg, settings = read_record(path)
        run = cls(path, cfg, settings)
        run._check_knob_history()
        return run

    def start(self, nice: int = 0) -> None:
        raise UserError("an attached run cannot start workers: it watches another process's")

    def launch(self, nice: int = 0) -> None:
        pass  # the workers are another process's

    def is_paused(self) -> bool:
        rows = self.workers.progress()
        return any(w["state"] == "paused" for w in rows if w["state"] != "removed")

    def _ask_owner(self, command: Command) -> None:
        """Pass a request to the process that owns the run (see Run.serve_requests)."""
        if self.settings.ranks:
            raise UserError(TORCHRUN_JOB.format(ranks=self.settings.ranks))
        # Workers not heard from yet may still be starting: only silence after records, or
        # every worker ended, shows that nobody is there.
        if not any(w["alive"] or not w["heartbeat"] for w in self.workers.progress()):
            raise UserError(NOT_SERVED.format(path=self.path))
        self.requests.send(command.action, **request_fields(command))

    def pause(self) -> None:
        self._ask_owner(Pause())

    def resume_training(self) -> None:
        self._ask_owner(Resume())

    def checkpoint(self) -> None:
        self._ask_owner(Checkpoint())

    def request_stop(self) -> None:
        """Ask the owner to stop training (compare stop(), which only lets go of the run)."""
        self._ask_owner(Stop())

    def stop(self, timeout: float = 120.0) -> None:
        """Stop this view's showcase player only: the workers are another process's (to stop
        them, request_stop)."""
        self.showcase.stop()

    def _poll(self) -> None:
        self._follow_settings()
        super()._poll()

    def _follow_settings(self) -> None:
        """The owner can add or remove workers: follow its run.json."""
        try:
            changed = (self.path / RUN).stat().st_mtime_ns
            if changed != self._settings_changed:
                self._settings_changed = changed
                self.settings = read_record(self.path)[1]
        except (OSError, UserError):
            pass  # being replaced right now, or damaged: keep the last good settings


class AttachedWorkers(Workers):
    """`run.workers` of a view: progress from the workers' records; adding, removing and
    restarting asked of the process that owns them."""

    def __init__(self, run: AttachedRun):
        super().__init__(run.path, lambda: run.settings, run.knobs.merge_every)
        self._run = run

    def restart(self, index: int) -> None:
        self._check_restartable(index)
        self._run._ask_owner(RestartWorker(index))

    def add(self, lane: int | None = None) -> int:
        """Ask the owner to add a worker (to lane `lane` in a race); returns the index it
        will have."""
        try:
            self._check_merged_weights(self._run.race.lane_for_new(lane))
        except ConfigError as err:
            raise UserError(str(err)) from None
        self._run._ask_owner(AddWorker(lane))
        return self._run.settings.workers

    def remove(self, index: int) -> None:
        self._check_removable(index)
        self._run._ask_owner(RemoveWorker(index))

    def progress(self) -> list[dict]:
        """The owner's keys, from the workers' metrics records read so far: state
        seeding/pretraining/training/paused as recorded if a record arrived within
        ATTACHED_IDLE_S, else 'attached-idle', or done/stopped/crashed as recorded; exitcode
        None."""
        run = self._run
        run._poll()
        settings = run.settings
        rows = [run._tail.seen(i).progress(i) for i in range(settings.workers)]
        for row in rows:
            if row["worker"] in settings.removed and not row["alive"]:
                row["state"] = "removed"
        # Nothing trains (paused or ended): this view's showcase may use the free cores,
        # as the owner's does while it pauses (the event is local to an attached run).
        resting = all(r["state"] == "paused" or (not r["alive"] and r["heartbeat"]) for r in rows)
        (run._pause.set if rows and resting else run._pause.clear)()
        return rows
