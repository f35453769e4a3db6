"""One training worker process: its own seed, env(s), buffer and agent, merging every
`merge_every` agent steps, applying live knobs between agent steps, checkpointing.

Talks to the run through the run directory (knobs, metrics, merges, checkpoints: the source of
truth) and a small shared snapshot array (latest-wins progress), plus events for pause, stop and
checkpoint requests.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from agent.config import Config, knobs_of
from agent.errors import ConfigError
from workers.exporters import attach_exporters
from workers.knobs import KnobStore, agent_knobs, validate_knobs
from workers.merge import FileMergeBackend, MergeStopped, is_finite
from workers.rundir import (
    RunDir,
    human_size,
    load_checkpoint,
    load_state,
    previous_path,
    save_checkpoint,
    state_bytes,
)
from workers.signals import child_signals
from workers.threads import apply_threads
from workers.trainer import StopTraining, Trainer

# Layout of a worker's shared snapshot (multiprocessing.Array of doubles).
SNAPSHOT_FIELDS = (
    "step",
    "steps_per_s",
    "last_return",
    "knob_version",
    "state",
    "merges",
    "updates",
    "heartbeat",
    "blocked_bytes",  # while its state is "disk full": the size of the write that failed
)
# Appended, never reordered: the snapshot stores a state as its index here.
STATES = (
    "starting",
    "seeding",
    "training",
    "merging",
    "paused",
    "stopped",
    "crashed",
    "done",
    "pretraining",
    "disk full",  # a write failed for want of space: training waits until writes succeed
)


PHASE_RECORD_S = 5.0  # seconds between "seeding" / "pretraining" records
DIR_CHECK_S = 0.5  # seconds between checks that the run directory is still where it was
RUN_DIR_GONE = 3  # a worker's exit code when its run directory vanished
DISK_RETRY_S = 2.0  # seconds between tries of a write that failed for want of space


class RunDirGone(Exception):
    """The run directory was deleted or moved while the worker ran."""


def _free_space(path: Path) -> str:
    for folder in (path, *path.parents):
        try:
            return human_size(shutil.disk_usage(folder).free)
        except OSError:
            continue
    return "unknown"


def dir_identity(path: str | Path) -> tuple[int, int] | None:
    """(device, inode) of a directory, None if it is not there: a directory moved away and
    another made in its place is told apart."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    run_path: str
    cfg: dict
    merge_with: tuple[int, ...]  # workers that take part in merges; empty: never merges
    merge_timeout_s: float = 30.0
    checkpoint_every: int = 10_000
    threads: int = 1
    resume: bool = False
    start_from_merged: bool = False
    join_step: int = 0  # from the merged weights: the agent step it starts counting from
    nice: int = 0  # CPU priority below the process that started it (a window: see Run.start)
    tensorboard: bool = True  # mirror the metrics into tb/worker-K/ (workers/exporters.py)
    wandb: bool = False
    merge_every: int = 2500  # the run's (RunSettings), used until a knob record says otherwise


def metrics_name(index: int) -> str:
    return f"worker-{index}.jsonl"


def checkpoint_path(run_path: str | Path, index: int) -> Path:
    return Path(run_path) / "checkpoints" / f"worker-{index}.pt"


class WorkerHooks:
    """Called by the trainer after every agent step."""

    def __init__(
        self,
        spec: WorkerSpec,
        trainer: Trainer,
        snapshot,
        pause,
        stop,
        checkpoint,
        leave,
        terminated=None,
        start_knobs: tuple[int, int] | None = None,
    ):
        """`start_knobs`: (knob version, merge_every) this worker last applied, from its
        checkpoint."""
        self.spec, self.trainer = spec, trainer
        self.snapshot, self.pause_event, self.checkpoint_event = snapshot, pause, checkpoint
        # The whole run stops, this worker leaves it, or it was sent SIGTERM itself.
        self.stop_events = tuple(e for e in (stop, leave, terminated) if e is not None)
        self.parent = os.getppid()
        self.run_dir_id, self._next_dir_check = dir_identity(spec.run_path), 0.0
        self._disk_paused: tuple[float, OSError, Path] | None = None  # since, error, path
        trainer.run_dir.on_write_error = self.wait_for_disk
        self.knobs = KnobStore(spec.run_path)
        # The run's own values, never a code default: those this worker applied last (its
        # checkpoint), else the run's; the newest good knob record goes over them below.
        self.knob_version, self.merge_every = start_knobs or (-1, spec.merge_every)
        self.backend = (
            FileMergeBackend(
                spec.run_path, list(spec.merge_with), spec.merge_timeout_s, stop=self._stopping
            )
            if spec.merge_with
            else None
        )
        self.last_round = trainer.step // self.merge_every
        self.merges = 0
        self.last_phase_record = -math.inf
        self.next_checkpoint = (trainer.step // spec.checkpoint_every + 1) * spec.checkpoint_every
        good = self.knobs.last_good(trainer.agent.cfg)  # knobs.json, or its history if damaged
        if good is not None and good[0] > self.knob_version:
            self._apply(*good)
        self.apply_knobs()

    def set(self, **values: float) -> None:
        for name, value in values.items():
            self.snapshot[SNAPSHOT_FIELDS.index(name)] = value

    def in_force(self) -> dict:
        """The knob values this worker runs with now."""
        return {**agent_knobs(knobs_of(self.trainer.agent.cfg)), "merge_every": self.merge_every}

    def apply_knobs(self) -> None:
        try:
            newest = self.knobs.poll(self.knob_version)
        except ConfigError as err:  # unreadable: reported once (until the file changes)
            self._refused(None, str(err), None)
            return
        if newest is None:
            return
        version, values = newest
        try:
            # Validated when written; a damaged or hand-edited record is refused, reported.
            values = validate_knobs(self.trainer.agent.cfg, values)
        except ConfigError as err:
            knob = next(
                (k for k in sorted(values, key=len, reverse=True) if str(err).startswith(k)), None
            )
            self._refused(version, str(err), knob, values.get(knob))
            self.knob_version = version
            return
        self._apply(version, values)

    def _refused(self, version: int | None, reason: str, knob: str | None, value=None) -> None:
        """Record a knob record this worker does not apply: the values in force stay."""
        in_force = self.in_force()
        if knob in in_force:
            stays = f"{knob} stays {in_force[knob]}"
        else:
            stays = "the last good values stay: " + ", ".join(
                f"{k}={v}" for k, v in in_force.items()
            )
        what = (
            f"knob record version {version} refused"
            if version is not None
            else "knob record unreadable"
        )
        self.trainer._log(
            "knobs_refused",
            version=version,
            knob=knob,
            value=value,
            reason=reason,
            in_force=in_force,
            in_force_version=self.knob_version,
            message=f"{what}: {reason}; {stays}",
        )

    def _apply(self, version: int, values: dict) -> None:
        self.trainer.agent.set_knobs(**agent_knobs(values))
        merge_every = int(values.get("merge_every", self.merge_every))
        if merge_every != self.merge_every:
            # Rounds are counted in the new unit from here on, the same way by every worker.
            self.merge_every = merge_every
            self.last_round = self.trainer.step // merge_every
        self.knob_version = version
        self.trainer._log("knobs_applied", version=version, values=values)
        self.set(knob_version=version)

    def merge(self) -> None:
        t = self.trainer
        round_ = t.step // self.merge_every
        if self.backend.members() == [self.spec.index] and not self.backend.down:
            # Alone (so far): still publish the weights as the merged ones, for the showcase
            # and for a worker added later, but a merge of one is no merge to report (one
            # with workers down is: it says who is left out, and that nobody waited).
            state = self._model_state()
            if is_finite(state):
                self._guarded(
                    lambda: self.backend.publish_merged(round_, state, [self.spec.index], t.step)
                )
            self.last_round = round_
            return
        self.set(state=STATES.index("merging"))
        start = time.perf_counter()
        try:
            state = self._model_state()
            result = self._guarded(
                lambda: self.backend.merge(self.spec.index, round_, state, step=t.step)
            )
        except MergeStopped:
            # Not waiting out the others: checkpoint (own weights, unmerged) and exit now.
            t._log("merge_stopped", round=round_)
            raise StopTraining from None
        if result is None:
            t._log("merge_skipped", round=round_, reason="own weights are not finite")
        else:
            t.agent.model.load_state_dict(result.merged)
            self.merges += 1
            t._log(
                "merge",
                round=round_,
                participants=result.participants,
                left_out={str(k): v for k, v in result.left_out.items()},
                distances={str(k): round(v, 6) for k, v in result.distances.items()},
                merge_ms=round((time.perf_counter() - start) * 1000, 2),
            )
        self.last_round = round_
        self.set(merges=self.merges)

    def _model_state(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.trainer.agent.model.state_dict().items()}

    def checkpoint(self) -> None:
        path = checkpoint_path(self.spec.run_path, self.spec.index)
        path.parent.mkdir(exist_ok=True)
        state = self.trainer.state_dict()  # its "knobs": the agent's values in force
        state.update(knob_version=self.knob_version, merge_every=self.merge_every)
        data = state_bytes(state)
        # The previous one stays until this one is complete; a full disk: wait, try again.
        self.trainer.run_dir.guarded(path, len(data), lambda: save_checkpoint(path, data))
        self.trainer._log("checkpoint", path=str(path))

    def _guarded(self, write):
        """A merge file write, tried again while the disk is full (see wait_for_disk)."""
        size = sum(
            t.numel() * t.element_size() for t in self.trainer.agent.model.state_dict().values()
        )
        return self.trainer.run_dir.guarded(self.backend.dir, size, write)

    def wait_for_disk(self, err: OSError, path: Path, size: int) -> None:
        """RunDir's write-error handler: a write failed for want of space. Training pauses
        here (every complete file stays as it was) and the write is tried again every
        DISK_RETRY_S; a stop ends the wait."""
        if self._disk_paused is None:
            self._disk_paused = (time.monotonic(), err, path)
            print(
                f"worker {self.spec.index}: cannot write {path} ({err.strerror or err}): "
                f"{_free_space(path)} free, it needs about {human_size(size)}; training paused "
                "until writes succeed again",
                file=sys.stderr,
            )
        self.set(state=STATES.index("disk full"), blocked_bytes=size, heartbeat=time.time())
        until = time.monotonic() + DISK_RETRY_S
        while time.monotonic() < until:
            if self._stopping() or os.getppid() != self.parent:
                raise StopTraining
            time.sleep(0.05)

    def _disk_resumed(self) -> None:
        """Writes succeed again: say so, in the record too."""
        since, err, path = self._disk_paused
        self._disk_paused = None
        self.set(blocked_bytes=0)
        paused_s = round(time.monotonic() - since, 1)
        message = (
            f"worker {self.spec.index}: writes succeed again; training resumed after "
            f"{paused_s} s paused (writing {path} had failed: {err.strerror or err})"
        )
        print(message, file=sys.stderr)
        self.trainer._log("disk_resumed", path=str(path), error=str(err), paused_s=paused_s)

    def _stopping(self) -> bool:
        return any(event.is_set() for event in self.stop_events)

    def obey_pause_and_stop(self) -> None:
        paused = False
        while self.pause_event.is_set() and not self._stopping():
            if not paused:  # recorded, so that a window attached to the run sees it
                paused = True
                self.trainer._log("pause")
            self.set(state=STATES.index("paused"), heartbeat=time.time())
            time.sleep(0.05)
            self.apply_knobs()
        if paused:
            self.trainer._log("resume")
        # A run whose main process died (kill -9) must not leave orphans training on.
        if self._stopping() or os.getppid() != self.parent:
            raise StopTraining

    def during_evaluation(self, trainer: Trainer) -> None:
        """Called after every evaluation step: an evaluation takes minutes on a CPU, and a
        stop or pause must not wait for it to end."""
        self.obey_pause_and_stop()
        self.set(state=STATES.index("training"), heartbeat=time.time())

    def between_updates(self, trainer: Trainer) -> None:
        """Called after every update, so that pretraining (minutes of updates on a CPU) can be
        paused, stopped and checkpointed, and its progress shown."""
        if trainer.pretrained:
            return  # training does few updates per agent step: the step hook is soon enough
        self.check_run_dir()
        if self._disk_paused is not None:
            self._disk_resumed()
        if self.checkpoint_event.is_set():
            self.checkpoint_event.clear()
            self.checkpoint()
        self.obey_pause_and_stop()
        self.set(state=STATES.index("pretraining"), updates=trainer.updates, heartbeat=time.time())
        self._phase_record("pretraining", updates=trainer.updates)

    def _phase_record(self, phase: str, **fields: object) -> None:
        """Seeding and pretraining write no other records for minutes: say every few seconds
        that they go on, so that a window attached to the run shows them (and knows the
        worker is alive)."""
        now = time.monotonic()
        if now - self.last_phase_record >= PHASE_RECORD_S:
            self.last_phase_record = now
            self.trainer._log(phase, **fields)

    def check_run_dir(self) -> None:
        """Stop (RunDirGone) once the run directory was deleted or moved: writing on would
        recreate a partial run where it was."""
        now = time.monotonic()
        if now < self._next_dir_check:
            return
        self._next_dir_check = now + DIR_CHECK_S
        if dir_identity(self.spec.run_path) != self.run_dir_id:
            raise RunDirGone(self.spec.run_path)

    def __call__(self, trainer: Trainer) -> None:
        self.check_run_dir()
        if self._disk_paused is not None:
            self._disk_resumed()
        self.apply_knobs()
        if self.backend is not None and trainer.step // self.merge_every > self.last_round:
            self.merge()
        if trainer.step >= self.next_checkpoint or self.checkpoint_event.is_set():
            self.checkpoint_event.clear()
            self.checkpoint()
            self.next_checkpoint = (
                trainer.step // self.spec.checkpoint_every + 1
            ) * self.spec.checkpoint_every
        self.obey_pause_and_stop()
        phase = "training" if trainer.pretrained else "seeding"
        if phase == "seeding":
            self._phase_record(phase)
        returns = trainer.episode_returns
        self.set(
            step=trainer.step,
            steps_per_s=trainer.progress.rate,
            last_return=returns[-1] if returns else float("nan"),
            state=STATES.index(phase),
            updates=trainer.updates,
            heartbeat=time.time(),
        )


def worker_main(spec: WorkerSpec, snapshot, pause, stop, checkpoint, leave, join=None) -> None:
    """Entry point of a spawned worker process. `join` (a shared Value, optional): the step to
    count on from when starting from the merged weights, kept current by the run while this
    process starts (so that its merge rounds line up with the others' when it is ready)."""
    terminated = child_signals()
    apply_threads(spec.threads)
    if spec.nice:
        os.nice(spec.nice)
    run = RunDir(spec.run_path, metrics=metrics_name(spec.index), weights=f"worker-{spec.index}.pt")
    snapshot[SNAPSHOT_FIELDS.index("state")] = STATES.index("starting")
    identity = dir_identity(spec.run_path)
    gone = (
        f"worker {spec.index} stopped: the run directory {spec.run_path} vanished (deleted or "
        "moved); nothing more is written, so no partial run is made where it was"
    )
    if identity is None:
        print(gone, file=sys.stderr)
        snapshot[SNAPSHOT_FIELDS.index("state")] = STATES.index("stopped")
        raise SystemExit(RUN_DIR_GONE)
    try:
        cfg = Config(**spec.cfg)
        trainer = Trainer(cfg, run, progress=False, write_config=False)
        attach_exporters(
            run, cfg, tensorboard=spec.tensorboard, wandb=spec.wandb, worker=spec.index
        )
        ckpt = checkpoint_path(spec.run_path, spec.index)
        start_knobs = None
        if spec.resume and (ckpt.exists() or previous_path(ckpt).exists()):
            # The newest complete checkpoint: a damaged one falls back to the previous.
            state, used, passed_over = load_checkpoint(ckpt, trainer.agent.device)
            trainer.load_state_dict(state)
            if "merge_every" in state:  # older checkpoints kept no merge frequency
                start_knobs = (int(state.get("knob_version", -1)), int(state["merge_every"]))
            fallback = None
            if passed_over:
                fallback = (
                    f"worker {spec.index}: {passed_over}; resumed from the previous checkpoint "
                    f"{used.name} at step {trainer.step}"
                )
            run.log("resumed", step=trainer.step, checkpoint=used.name, fallback=fallback)
        elif spec.start_from_merged:
            merged = Path(spec.run_path) / "merge" / "merged.pt"
            join_step = max(spec.join_step, int(join.value) if join is not None else 0)
            if merged.exists():
                trainer.agent.model.load_state_dict(
                    load_state(merged, trainer.agent.device)["model"]
                )
                trainer.start_at(join_step)
                run.log("started_from_merged", step=trainer.step)
            elif join_step > 0:
                # Restarted before any merge: fresh weights, but in step with the others.
                trainer.start_at(join_step)
                run.log("started_fresh", step=trainer.step)
        hooks = WorkerHooks(
            spec,
            trainer,
            snapshot,
            pause,
            stop,
            checkpoint,
            leave,
            terminated,
            start_knobs=start_knobs,
        )
        trainer.step_hook, trainer.update_hook = hooks, hooks.between_updates
        trainer.eval_hook = hooks.during_evaluation
        summary = trainer.run()
        hooks.checkpoint()
        final = "stopped" if summary["interrupted"] else "done"
        snapshot[SNAPSHOT_FIELDS.index("state")] = STATES.index(final)
    except Exception as err:
        if dir_identity(spec.run_path) != identity:  # whatever failed, this is the cause
            if run._metrics_fd is not None:  # the open file moved with the directory
                run.log("run_dir_gone", message=gone)
            print(gone, file=sys.stderr)
            snapshot[SNAPSHOT_FIELDS.index("state")] = STATES.index("stopped")
            raise SystemExit(RUN_DIR_GONE) from None
        run.on_write_error = None  # no waiting for space now: the error is told, or printed
        message = f"{type(err).__name__}: {err}"
        try:
            run.log("error", message=message, traceback=traceback.format_exc())
        except OSError as log_err:
            print(f"worker {spec.index}: {message} (not recorded: {log_err})", file=sys.stderr)
        snapshot[SNAPSHOT_FIELDS.index("state")] = STATES.index("crashed")
        raise SystemExit(1) from None
    finally:
        run.close()
