"""The owning run's workers (`run.workers` of owner.py Run): its child processes, one per pack.

Started here through `start_process` (spawn.py's spawn, bound to the run's multiprocessing
context, pause and stop events), watched by the run's monitor (monitor.py), which calls back
respawn, split and join_step; added, removed and restarted here. What it shares with its run
comes in explicitly (RunSide): the run's lock, its settings and how to save them (run.json,
members.json), the knobs and race in force, and the monitor's bookkeeping of restarts.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.config import Config
from agent.envs import obs_action_dims
from agent.errors import ConfigError, UserError
from workers.host.memory import check_added_worker
from workers.host.threads import choose_threads
from workers.merging.files import merged_step
from workers.race.control import RaceControl
from workers.run.base import Workers
from workers.run.spawn import WorkerProcess, worker_spec
from workers.rundir.settings import RunSettings
from workers.training.spec import SNAPSHOT_FIELDS, STATES, WorkerSpec


@dataclass(frozen=True)
class RunSide:
    """What the processes take from their run, each named (owner.py Run makes it)."""

    path: Path
    cfg: Config
    resumed: bool
    """Workers start from their checkpoints (Run.resume)."""
    lock: Any
    """The run's lock, shared with its monitor thread: `procs` and the settings change under it."""
    settings: Callable[[], RunSettings]
    """The run's settings now."""
    save_settings: Callable[[RunSettings], None]
    """Record new settings (run.json, then members.json), as the run's own."""
    merge_every: Callable[[], int]
    """The merge frequency in force (knobs.json), which a new worker starts with."""
    race: RaceControl
    start_process: Callable[[list[WorkerSpec]], list[WorkerProcess]]
    """One process for these workers, started (spawn.py spawn, with the run's events)."""
    restarting: Callable[[], bool]
    """Whether the monitor waits to restart a worker, or one is starting again."""
    restarted_by_hand: Callable[[list[int]], None]
    """Tell the monitor that a pack was started again by hand (a fresh allowance)."""
    removed: Callable[[int], None]
    """Tell the monitor that a worker leaves on purpose (its exit is no crash)."""


class WorkerProcesses(Workers):
    def __init__(self, side: RunSide):
        super().__init__(side.path, side.settings, side.merge_every)
        self._side = side
        self.procs: dict[int, WorkerProcess] = {}  # by worker; a pack's share one process
        self._nice = 0

    # processes ----------------------------------------------------------------------------
    def pids(self) -> list[int]:
        pids = [p.process.pid for p in self.procs.values() if p.process.is_alive()]
        return [pid for pid in pids if pid is not None]

    @property
    def started(self) -> bool:
        return bool(self.procs)

    @property
    def restarting(self) -> bool:
        return self._side.restarting()

    def describe_threads(self) -> str:
        s = self._settings()
        return choose_threads(len(s.active), s.threads_per_worker or None).describe()

    def _spec(
        self, index: int, resume: bool, from_merged: bool = False, join_step: int = 0
    ) -> WorkerSpec:
        side = self._side
        return worker_spec(
            side.path,
            side.cfg,
            self._settings(),
            index,
            self._merge_every(),
            self._nice,
            resume,
            from_merged,
            join_step,
        )

    def _spawn(self, specs: list[WorkerSpec]) -> None:
        handles = self._side.start_process(specs)
        with self._side.lock:
            for handle in handles:
                self.procs[handle.spec.index] = handle

    def start(self, nice: int) -> None:
        """Spawn every pack (the run's start(); `nice`: see Run.start)."""
        self._nice = nice
        for pack in self._settings().packs:
            self._spawn([self._spec(index, resume=self._side.resumed) for index in pack])

    def respawn(self, pack: list[int], join_step: int) -> None:
        """Start a pack again from the merged weights, joining the others at `join_step`."""
        self._reported_dead.difference_update(pack)  # a new death is told again
        self._spawn(
            [self._spec(m, resume=False, from_merged=True, join_step=join_step) for m in pack]
        )

    def split(self, pack: list[WorkerProcess]) -> None:
        """A pack whose self-check found it unsound: each of its workers again, started as it
        was (resumed, from the merged weights, ...) but in a process of its own, from now on
        (run.json keeps them apart)."""
        settings = self._settings()
        apart = tuple(sorted({*settings.apart, *(p.spec.index for p in pack)}))
        self._side.save_settings(dataclasses.replace(settings, apart=apart))
        for p in pack:
            s = p.spec
            self._spawn(
                [self._spec(s.index, s.resume, s.start_from_merged, max(s.join_step, p.join.value))]
            )

    def join_step(self, index: int | None = None) -> int:
        """Where a worker starting from the merged weights begins counting agent steps: with the
        slowest running merging worker of its pool (worker `index`'s lane in a race), so that
        its merge rounds line up with theirs; in a lane that never merges, where its own
        published weights were."""
        path = self._path
        record = self._side.race.record()
        lane = record.lane_of(index) if index is not None else None
        if lane is not None and not record.merges(lane):  # it trains alone: its own step
            return max(0, merged_step(path, lane, index))
        pool = record.lanes[lane] if lane is not None else self._settings().merging
        running = [
            w["step"]
            for w in self.progress()
            if w["alive"] and w["worker"] in pool and w["state"] != "starting"
        ]
        return int(min(running)) if running else max(0, merged_step(path, lane))

    # changes ------------------------------------------------------------------------------
    def restart(self, index: int) -> None:
        """Start a dead worker again: from its pool's merged weights at the step of the others
        (see add), keeping its checkpoint's buffer, optimiser and counters; before the pool's
        first merge, from its checkpoint (training/first_weights.py)."""
        self._check_restartable(index)
        pack = self._settings().pack_of(index)
        with self._side.lock:
            old = self.procs.get(index)
            if old is not None and old.process.is_alive():
                raise UserError(f"worker {index} is still running")
            join_step = self.join_step(index)
            # A pack starts again as a whole, in one process.
            self._reported_dead.difference_update(pack)
            self._side.restarted_by_hand(pack)
            self._spawn(
                [self._spec(m, resume=True, from_merged=True, join_step=join_step) for m in pack]
            )

    def add(self, lane: int | None = None) -> int:
        """Add a merging worker to the running run (in a race: to lane `lane`, else the lane
        with the fewest workers); returns its index. It starts from its pool's merged weights
        at the step of the others (no random seed steps: it acts with the merged policy and
        starts updating once its first episode is in its own buffer)."""
        race, settings = self._side.race, self._settings()
        if not self.started:
            raise UserError("start the run before adding workers")
        index = settings.workers
        try:
            lane = race.lane_for_new(lane)
        except ConfigError as err:
            raise UserError(str(err)) from None
        self._check_merged_weights(lane)
        cfg = self._side.cfg  # its buffer against the memory free now, before any write
        check_added_worker(cfg, len(settings.active), *obs_action_dims(cfg))
        grown = dataclasses.replace(settings, workers=index + 1, added=settings.added + 1)
        if lane is None:
            self._side.save_settings(grown)
        else:  # run.json first, then the lane (RaceControl.join)
            race.join(index, lane, enter_run=lambda: self._side.save_settings(grown))
        join_step = self.join_step(index)
        self._spawn([self._spec(index, resume=False, from_merged=True, join_step=join_step)])
        return index

    def remove(self, index: int) -> None:
        """Take a worker out of the run: the others stop merging with it at once, and it writes
        its checkpoint and exits (a resumed run leaves it out too)."""
        side = self._side
        self._check_removable(index)
        try:
            side.race.check_leave(index)  # in a race: never a lane's last
        except ConfigError as err:
            raise UserError(str(err)) from None
        with side.lock:
            side.removed(index)
            # run.json first, then the lane: no record leaves a worker of the run in no lane.
            s = self._settings()
            side.save_settings(dataclasses.replace(s, removed=(*s.removed, index)))
        side.race.leave(index)
        process = self.procs.get(index)
        if process is not None:
            process.leave.set()

    def checkpoint(self) -> None:
        """Ask every worker to write a checkpoint."""
        for p in self.procs.values():
            p.checkpoint.set()

    # ends ---------------------------------------------------------------------------------
    def join(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the processes to end (asked to: the run's stop
        event), then kill those still running."""
        deadline = time.monotonic() + timeout
        procs = list(self.procs.values())
        for p in procs:
            p.process.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.process.is_alive():
                p.process.kill()
                p.process.join(5)

    def wait(self, poll_s: float = 0.5) -> None:
        """Block until every worker has ended."""
        while True:
            with self._side.lock:
                alive = any(p.process.is_alive() for p in self.procs.values())
            if not alive and not self._side.restarting():
                return
            time.sleep(poll_s)

    # reading ------------------------------------------------------------------------------
    def progress(self) -> list[dict]:
        """Latest snapshot of each worker (state 'crashed' for a process that died)."""
        out = []
        with self._side.lock:
            procs = sorted(self.procs.items())
        removed = self._settings().removed
        for index, p in procs:
            values = dict(zip(SNAPSHOT_FIELDS, p.snapshot[:]))
            state = STATES[int(values.pop("state"))]
            if not p.process.is_alive() and state not in ("done", "stopped"):
                state = "crashed"
            if index in removed and not p.process.is_alive():
                state = "removed"
            out.append(
                {
                    "worker": index,
                    "state": state,
                    "alive": p.process.is_alive(),
                    "exitcode": p.process.exitcode,
                    **values,
                }
            )
        return out
