"""The run: N worker processes that train and merge, driven through one small public API.

The headless command, the tests and the viewer all use it:

    run = Run.create(path, cfg, RunSettings(workers=2))   # or Run.resume(path), Run.attach(path)
    run.start(); run.set_knobs(horizon=5); run.progress(); run.new_events()
    run.pause(); run.resume_training(); run.checkpoint(); run.stop()
    run.add_worker(); run.remove_worker(k); run.restart_worker(k)
    run.start_player(); run.set_showcase(camera=1, source=-1); run.read_frame()

Run.create and Run.resume give the owner (this class): it spawns the workers and watches them
(monitor.py). Run.attach gives the same interface (base.py) over a run that
another process started (attached.py). The rooms around it: the settings record
(workers/rundir/settings.py), spawning (spawn.py), the showcase (workers/showcase/control.py),
reading the records (tail.py) and the directory's file names (workers/rundir/paths.py).
Over 300 lines because it is the whole owner's side of one interface (base.py).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path

from agent.config import Config
from agent.envs import check_task
from agent.errors import ConfigError, UserError
from workers.host.threads import choose_threads
from workers.merging.files import merged_step, write_members
from workers.run.attached import AttachedRun
from workers.run.base import BaseRun
from workers.run.monitor import WorkerMonitor
from workers.run.race import check_race
from workers.run.spawn import WorkerProcess, spawn, worker_spec
from workers.run.start_weights import read_start_weights, write_start_weights
from workers.rundir.directory import RunDir
from workers.rundir.knob_record import KnobStore, run_knobs
from workers.rundir.lanes import Lane
from workers.rundir.lines import damaged_lines
from workers.rundir.paths import RUN, members_path
from workers.rundir.records import Request
from workers.rundir.settings import (
    RunSettings,
    default_pack,
    gpu_count,
    read_record,
    write_settings,
)
from workers.rundir.sinks import require_wandb
from workers.training.spec import SNAPSHOT_FIELDS, STATES, WorkerSpec

# Callers import these from here (their rooms are named above).
__all__ = ["AttachedRun", "BaseRun", "Run", "RunSettings", "default_pack", "gpu_count"]

RESTART_BACKOFF_S = 2.0  # before the first automatic restart of a crashed worker; doubles


class Run(BaseRun):
    """The owning run: its workers are this process's children."""

    def __init__(self, path: Path, cfg: Config, settings: RunSettings, resumed: bool):
        super().__init__(path, cfg, settings, resumed)
        self._worker_nice = 0
        self._stop = self._ctx.Event()
        self._procs: dict[int, WorkerProcess] = {}
        self.monitor = WorkerMonitor(
            path,
            settings=lambda: self.settings,
            procs=self._procs,
            lock=self._lock,
            stop=self._stop,
            note=self._note,
            respawn=self._respawn,
            split=self._split,
            join_step=self._join_step,
            members_changed=self._write_members,
            # Read here, not at import, so that it can be changed (tests lengthen it).
            restart_backoff_s=RESTART_BACKOFF_S,
        )

    # creation -----------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        path: str | Path,
        cfg: Config,
        settings: RunSettings,
        start_weights: str | Path | None = None,
        lanes: Sequence[Lane] | None = None,
    ) -> Run:
        """A new run in `path`; every worker starts from `start_weights` when given (a file of
        one worker's networks), else fresh. `lanes`: a race from the start, lane n running
        with the run's knob values changed by its own, with its size (or a share of the
        workers no lane sized) and merging or not."""
        check_task(cfg.task, cfg.env_options)
        if settings.wandb:
            require_wandb()
        if cfg.iterations == 0:
            # "Auto" becomes a real number, as a live knob holds one. It is the base count: the
            # planner adds 2 for large action spaces to any value, as the reference does.
            cfg = dataclasses.replace(cfg, iterations=cfg.resolved_iterations(0))
        layout = check_race(settings, lanes) if lanes else ()
        settings = dataclasses.replace(settings, lanes=layout)
        if settings.pack == 0:
            settings = dataclasses.replace(settings, pack=default_pack(settings.workers, cfg))
        # Refused knobs must leave nothing behind: check them before the first write.
        values = run_knobs(cfg, settings.merge_every)
        KnobStore.new_race(cfg, values, layout, lanes or (), 0)
        weights = read_start_weights(start_weights, cfg) if start_weights else None
        run_dir = RunDir.create(path)
        run_dir.write_config({"config": dataclasses.asdict(cfg)})
        if weights is not None:
            write_start_weights(run_dir.path, weights, start_weights)
        run = cls(run_dir.path, cfg, settings, resumed=False)
        run._save_settings(settings)
        run.knobs.initialise(cfg, settings.merge_every, layout, lanes or ())
        return run

    @classmethod
    def resume(cls, path: str | Path, steps: int | None = None) -> Run:
        """Continue a stopped run from its checkpoints; `steps` raises its total agent steps."""
        path = Path(path)
        cfg, settings = read_record(path)
        if settings.ranks:
            raise UserError(
                f"{path} is a torchrun job's run ({settings.ranks} ranks, their files in "
                "rank-R/ on each machine): resume it with the same torchrun line and --resume"
            )
        if settings.wandb:  # the run keeps the logs it started with
            require_wandb()
        if steps is not None:
            cfg = dataclasses.replace(cfg, steps=steps)
            RunDir(path).write_config({"config": dataclasses.asdict(cfg)})
        run = cls(path, cfg, settings, resumed=True)
        run._check_knob_history()
        members = members_path(path)
        try:
            if members.exists():
                json.loads(members.read_bytes())["workers"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            run._note(f"warning: {members} was damaged ({err}); written again from {RUN}")
        # A damaged knob record is no reason to stop: the workers keep the last good values
        # (their checkpoints', the record's history) and say so (knobs_refused records).
        write_members(path, settings.merging)  # runs from before members.json have none
        return run

    @classmethod
    def attach(cls, path: str | Path) -> AttachedRun:
        """A view of a run that another process is running: events, progress, knobs and the
        showcase work; pause, stop, checkpoint and restarts are asked of that process."""
        return AttachedRun.open(path)

    def _write_members(self) -> None:
        """members.json: the merging workers, less those down now (nobody waits for them)."""
        with self._lock:
            merging = self.settings.merging
            down = {k: why for k, why in self.monitor.down().items() if k in merging}
            write_members(self.path, merging, down)

    def _save_settings(self, settings: RunSettings) -> None:
        """Record the settings (run.json) and who merges (read by the workers before each
        merge); both atomic."""
        with self._lock:
            write_settings(self.path, settings)
            self.settings = settings
            self._write_members()

    # processes ----------------------------------------------------------------------------
    def _worker_pids(self) -> list[int]:
        pids = [p.process.pid for p in self._procs.values() if p.process.is_alive()]
        return [pid for pid in pids if pid is not None]

    @property
    def started(self) -> bool:
        return bool(self._procs)

    def _spec(
        self, index: int, resume: bool, from_merged: bool = False, join_step: int = 0
    ) -> WorkerSpec:
        merge_every = int(self.knob_values()[1]["merge_every"])
        return worker_spec(
            self.path,
            self.cfg,
            self.settings,
            index,
            merge_every,
            self._worker_nice,
            resume,
            from_merged,
            join_step,
        )

    def _respawn(self, pack: list[int], join_step: int) -> None:
        """Start a pack again from the merged weights, joining the others at `join_step`."""
        self._reported_dead.difference_update(pack)  # a new death is told again
        self._spawn(
            [self._spec(m, resume=False, from_merged=True, join_step=join_step) for m in pack]
        )

    def _split(self, pack: list[WorkerProcess]) -> None:
        """A pack whose self-check found it unsound: each of its workers again, started as it
        was (resumed, from the merged weights, ...) but in a process of its own, from now on
        (run.json keeps them apart)."""
        indices = [p.spec.index for p in pack]
        apart = tuple(sorted({*self.settings.apart, *indices}))
        self._save_settings(dataclasses.replace(self.settings, apart=apart))
        for p in pack:
            s = p.spec
            self._spawn(
                [self._spec(s.index, s.resume, s.start_from_merged, max(s.join_step, p.join.value))]
            )

    def _spawn(self, specs: list[WorkerSpec]) -> None:
        handles = spawn(self._ctx, specs, self._pause, self._stop)
        with self._lock:
            for handle in handles:
                self._procs[handle.spec.index] = handle

    def start(self, nice: int = 0) -> None:
        """Spawn the workers. `nice` lowers their CPU priority: a window started them, and its
        frames must not wait behind training (the time it takes is the same either way)."""
        self._worker_nice = nice
        self.requests.skip_old()  # asked of an earlier owner: not for this one
        self.monitor.mark_start()
        for pack in self.settings.packs:
            self._spawn([self._spec(index, resume=self.resumed) for index in pack])
        self.monitor.start()

    @property
    def restarting(self) -> bool:
        return self.monitor.restarting

    @property
    def gone(self) -> str | None:
        return self.monitor.gone

    def check_run_dir(self) -> str | None:
        """Once the run directory is deleted or moved, stop the workers (they write nothing
        more, so no partial run is made where it was) and say so; returns why."""
        return self.monitor.check_run_dir()

    def launch(self, nice: int = 0) -> None:
        if not self.started:
            self.start(nice)

    def is_paused(self) -> bool:
        return self._pause.is_set()

    def stop_elsewhere(self) -> bool:
        return False

    def describe_threads(self) -> str:
        threads = self.settings.threads_per_worker or None
        return choose_threads(len(self.settings.active), threads).describe()

    def restart_worker(self, index: int) -> None:
        """Start a dead worker again: from its pool's merged weights at the step of the others
        (see add_worker), keeping its checkpoint's buffer, optimiser and counters; before the
        pool's first merge, from its checkpoint (training/first_weights.py)."""
        self._check_restartable(index)
        pack = self.settings.pack_of(index)
        with self._lock:
            old = self._procs.get(index)
            if old is not None and old.process.is_alive():
                raise UserError(f"worker {index} is still running")
            join_step = self._join_step(index)
            # A pack starts again as a whole, in one process.
            self._reported_dead.difference_update(pack)
            self.monitor.restarted_by_hand(pack)
            self._spawn(
                [self._spec(m, resume=True, from_merged=True, join_step=join_step) for m in pack]
            )

    def _join_step(self, index: int | None = None) -> int:
        """Where a worker starting from the merged weights begins counting agent steps: with the
        slowest running merging worker of its pool (worker `index`'s lane in a race), so that
        its merge rounds line up with theirs; in a lane that never merges, where its own
        published weights were."""
        record = self.race.record()
        lane = record.lane_of(index) if index is not None else None
        if lane is not None and not record.merges(lane):  # it trains alone: its own step
            return max(0, merged_step(self.path, lane, index))
        pool = record.lanes[lane] if lane is not None else self.settings.merging
        running = [
            w["step"]
            for w in self.progress()
            if w["alive"] and w["worker"] in pool and w["state"] != "starting"
        ]
        return int(min(running)) if running else max(0, merged_step(self.path, lane))

    def add_worker(self, lane: int | None = None) -> int:
        """Add a merging worker to the running run (in a race: to lane `lane`, else the lane
        with the fewest workers); returns its index. It starts from its pool's merged weights
        at the step of the others (no random seed steps: it acts with the merged policy and
        starts updating once its first episode is in its own buffer)."""
        if not self.started:
            raise UserError("start the run before adding workers")
        index = self.settings.workers
        try:
            lane = self.race.lane_for_new(lane)
        except ConfigError as err:
            raise UserError(str(err)) from None
        self._check_merged_weights(lane)
        # run.json first, then the lane: a worker never reads a lane naming a worker the run
        # does not have (it would refuse the record as damaged).
        self._save_settings(
            dataclasses.replace(self.settings, workers=index + 1, added=self.settings.added + 1)
        )
        if lane is not None:
            self.race.join(index, lane)
        join_step = self._join_step(index)
        self._spawn([self._spec(index, resume=False, from_merged=True, join_step=join_step)])
        return index

    def remove_worker(self, index: int) -> None:
        """Take a worker out of the run: the others stop merging with it at once, and it writes
        its checkpoint and exits (a resumed run leaves it out too)."""
        self._check_removable(index)
        try:
            self.race.check_leave(index)  # in a race: never a lane's last
        except ConfigError as err:
            raise UserError(str(err)) from None
        s = self.settings
        with self._lock:
            self.monitor.removed(index)
            # run.json first, then the lane: no record leaves a worker of the run in no lane.
            self._save_settings(dataclasses.replace(s, removed=(*s.removed, index)))
        self.race.leave(index)
        process = self._procs.get(index)
        if process is not None:
            process.leave.set()

    # control ------------------------------------------------------------------------------
    def serve_requests(self) -> list[Request]:
        """Apply what attached windows asked for since the last call; returns each request
        with "error" (the refusal, or None). A stop is left to the caller, which owns the
        process's lifetime: the command line exits, a window shows the run stopped."""
        served, skipped = [], self.requests.skipped
        received = self.requests.receive()
        if self.requests.skipped > skipped:
            damaged = damaged_lines(self.requests.skipped - skipped)
            self._note(f"warning: {self.requests.path}: {damaged} skipped")
        for request in received:
            action, error = request.action, None
            try:
                if action in ("restart_worker", "remove_worker"):
                    getattr(self, action)(-1 if request.worker is None else request.worker)
                elif action == "add_worker":
                    self.add_worker(request.lane)
                elif action != "stop":
                    getattr(self, action)()
            except (UserError, ValueError, TypeError) as err:
                error = str(err)
            served.append(dataclasses.replace(request, error=error))
        return served

    def pause(self) -> None:
        self._pause.set()

    def resume_training(self) -> None:
        self._pause.clear()

    def checkpoint(self) -> None:
        for p in self._procs.values():
            p.checkpoint.set()

    def request_stop(self) -> None:
        """Stop training at once (for an attached run: ask the owner to)."""
        self.stop()

    def stop(self, timeout: float = 120.0) -> None:
        """Ask every worker to stop (each writes a checkpoint), then wait for them."""
        self._stop.set()
        self._pause.clear()
        self.monitor.join(5)
        self.stop_player()
        deadline = time.monotonic() + timeout
        procs = list(self._procs.values())
        for p in procs:
            p.process.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.process.is_alive():
                p.process.kill()
                p.process.join(5)

    def wait(self, poll_s: float = 0.5) -> None:
        """Block until every worker has ended."""
        while True:
            with self._lock:
                alive = any(p.process.is_alive() for p in self._procs.values())
            if not alive and not self.monitor.restarting:
                return
            time.sleep(poll_s)

    # reading ------------------------------------------------------------------------------
    def progress(self) -> list[dict]:
        """Latest snapshot of each worker (state 'crashed' for a process that died)."""
        out = []
        with self._lock:
            procs = sorted(self._procs.items())
        for index, p in procs:
            values = dict(zip(SNAPSHOT_FIELDS, p.snapshot[:]))
            state = STATES[int(values.pop("state"))]
            if not p.process.is_alive() and state not in ("done", "stopped"):
                state = "crashed"
            if index in self.settings.removed and not p.process.is_alive():
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
