"""The run: N worker processes that train and merge, driven through one small public API.

The headless command, the tests and the viewer all use it:

    run = Run.create(path, cfg, RunSettings(workers=2))   # or Run.resume(path), Run.attach(path)
    run.start(); run.knobs.set(horizon=5); run.workers.progress(); run.new_events()
    run.pause(); run.resume_training(); run.checkpoint(); run.stop()
    run.workers.add(); run.workers.remove(k); run.workers.restart(k)
    run.showcase.start(); run.showcase.choose(camera=1, source=-1); run.showcase.read_frame()

Run.create and Run.resume give the owner (this class): it spawns the workers (processes.py)
and watches them (monitor.py). Run.attach gives the same interface (base.py) over a run that
another process started (attached.py). The rooms around it: the settings record
(workers/rundir/settings.py), spawning (spawn.py), the showcase (workers/showcase/control.py),
reading the records (tail.py) and the directory's file names (workers/rundir/paths.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from agent.config import Config
from agent.envs import check_record_task, check_task, name_task, obs_action_dims
from agent.errors import UserError
from workers.host.memory import (
    available_bytes,
    check_buffers_fit,
    check_resumed,
    local_workers,
)
from workers.merging.files import write_members
from workers.race.control import check_race
from workers.run.attached import AttachedRun
from workers.run.base import BaseRun
from workers.run.commands import from_request
from workers.run.handle import handle
from workers.run.monitor import WorkerMonitor
from workers.run.processes import RunSide, WorkerProcesses
from workers.run.spawn import spawn
from workers.run.start_weights import read_start_weights, write_start_weights
from workers.rundir.directory import RunDir
from workers.rundir.knob_record import KnobStore, run_knobs
from workers.rundir.lanes import Lane, replicate
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

# Callers import these from here (their rooms are named above).
__all__ = [
    "AttachedRun",
    "BaseRun",
    "Run",
    "RunSettings",
    "default_pack",
    "gpu_count",
    "resumable",
]

RESTART_BACKOFF_S = 2.0  # before the first automatic restart of a crashed worker; doubles


def resumable(path: str | Path) -> tuple[Config, RunSettings]:
    """The record of the run in `path` if this process can resume it, else a UserError (no run
    there, a torchrun job's run, W&B logs without wandb installed). Reads only."""
    path = Path(path)
    cfg, settings = read_record(path)
    check_record_task(cfg.task)  # a run directory is data: its task imports what you named
    if settings.ranks:
        raise UserError(
            f"{path} is a torchrun job's run ({settings.ranks} ranks, their files in "
            "rank-R/ on each machine): resume it with the same torchrun line and --resume"
        )
    if settings.wandb:  # the run keeps the logs it started with
        require_wandb()
    return cfg, settings


class Run(BaseRun):
    """The owning run: its workers are this process's children."""

    do = handle

    def __init__(self, path: Path, cfg: Config, settings: RunSettings, resumed: bool):
        super().__init__(path, cfg, settings, resumed)
        self._stop = self._ctx.Event()
        self.workers = WorkerProcesses(
            RunSide(
                path,
                cfg,
                resumed,
                lock=self._lock,
                settings=lambda: self.settings,
                save_settings=self._save_settings,
                merge_every=self.knobs.merge_every,
                race=self.race,
                start_process=partial(spawn, self._ctx, pause=self._pause, stop=self._stop),
                restarting=lambda: self.monitor.restarting,
                restarted_by_hand=lambda pack: self.monitor.restarted_by_hand(pack),
                removed=lambda index: self.monitor.removed(index),
            )
        )
        self.monitor = WorkerMonitor(
            path,
            settings=lambda: self.settings,
            procs=self.workers.procs,
            lock=self._lock,
            stop=self._stop,
            note=self._note,
            respawn=self.workers.respawn,
            split=self.workers.split,
            join_step=self.workers.join_step,
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
        workers no lane sized) and merging or not, each `settings.replicas` times."""
        name_task(cfg.task)  # this process makes the run: its task is named here
        check_task(cfg.task, cfg.env_options, cfg.obs)
        here = local_workers(settings.workers, settings.pack, settings.ranks)
        check_buffers_fit(cfg, here, *obs_action_dims(cfg), available_bytes(cfg.device))
        if settings.wandb:
            require_wandb()
        if cfg.iterations == 0:
            # "Auto" becomes a real number, as a live knob holds one. It is the base count: the
            # planner adds 2 for large action spaces to any value, as the reference does.
            cfg = dataclasses.replace(cfg, iterations=cfg.resolved_iterations(0))
        replicas = settings.replicas
        copies = replicate(lanes, replicas) if lanes else ()
        layout = check_race(settings, lanes, replicas, new_run=True) if lanes else ()
        settings = dataclasses.replace(settings, lanes=layout)
        if settings.pack == 0:
            settings = dataclasses.replace(settings, pack=default_pack(settings.workers, cfg))
        # Refused knobs must leave nothing behind: check them before the first write.
        values = run_knobs(cfg, settings.merge_every)
        KnobStore.new_race(cfg, values, layout, copies, 0, replicas, settings.race_minutes)
        weights = read_start_weights(start_weights, cfg) if start_weights else None
        run_dir = RunDir.create(path)
        run_dir.write_config({"config": dataclasses.asdict(cfg)})
        if weights is not None:
            write_start_weights(run_dir.path, weights, start_weights)
        run = cls(run_dir.path, cfg, settings, resumed=False)
        run._save_settings(settings)
        run.knobs.store.initialise(
            cfg, settings.merge_every, layout, copies, replicas, settings.race_minutes
        )
        return run

    @classmethod
    def resume(cls, path: str | Path, steps: int | None = None) -> Run:
        """Continue a stopped run from its checkpoints; `steps` raises its total agent steps."""
        path = Path(path)
        cfg, settings = resumable(path)
        if steps is not None:
            cfg = dataclasses.replace(cfg, steps=steps)
        # Before anything is written: more --steps make bigger buffers (buffer_rows).
        here = local_workers(len(settings.active), settings.pack, settings.ranks)
        check_resumed(cfg, here, *obs_action_dims(cfg), available_bytes(cfg.device))
        if steps is not None:
            RunDir(path).write_config({"config": dataclasses.asdict(cfg)})
        run = cls(path, cfg, settings, resumed=True)
        run._check_knob_history()
        members = members_path(path)
        try:
            if members.exists():
                json.loads(members.read_bytes())["workers"]
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
            run._note(f"warning: {members} was damaged ({err}); written again from {RUN}")
        # A damaged knob record is no reason to stop: the workers keep the last good values
        # (their checkpoints', the record's history) and say so (knobs_refused records).
        write_members(path, settings.merging)  # runs from before members.json have none
        return run

    @classmethod
    def attach(cls, path: str | Path) -> AttachedRun:
        """A view of a run that another process is running: events, progress, knobs and the
        showcase work; pause, stop, checkpoint and restarts are asked of that process. Its
        task imports a module only when named here (its showcase makes the env)."""
        run = AttachedRun.open(path)
        check_record_task(run.cfg.task)
        return run

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

    def start(self, nice: int = 0) -> None:
        """Spawn the workers. `nice` lowers their CPU priority: a window started them, and its
        frames must not wait behind training (the time it takes is the same either way)."""
        self.requests.skip_old()  # asked of an earlier owner: not for this one
        self.monitor.mark_start()
        self.workers.start(nice)
        self.monitor.start()

    @property
    def gone(self) -> str | None:
        return self.monitor.gone

    def check_run_dir(self) -> str | None:
        """Once the run directory is deleted or moved, stop the workers (they write nothing
        more, so no partial run is made where it was) and say so; returns why."""
        return self.monitor.check_run_dir()

    def launch(self, nice: int = 0) -> None:
        if not self.workers.started:
            self.start(nice)

    def is_paused(self) -> bool:
        return self._pause.is_set()

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
            error = None
            try:  # a stop is left to the caller (see above): Outcome.stop
                self.do(from_request(request))
            except (UserError, ValueError, TypeError) as err:
                error = str(err)
            served.append(dataclasses.replace(request, error=error))
        return served

    def pause(self) -> None:
        self._pause.set()

    def resume_training(self) -> None:
        self._pause.clear()

    def checkpoint(self) -> None:
        self.workers.checkpoint()

    def request_stop(self) -> None:
        """Stop training at once (for an attached run: ask the owner to)."""
        self.stop()

    def stop(self, timeout: float = 120.0) -> None:
        """Ask every worker to stop (each writes a checkpoint), then wait for them."""
        self._stop.set()
        self._pause.clear()
        self.monitor.join(5)
        self.showcase.stop()
        self.workers.join(timeout)
