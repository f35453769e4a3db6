"""The hooks the trainer calls between agent steps (and between the updates of pretraining, and
the steps of an evaluation), for all the workers of one process: live knobs (applied to every
worker of a pack at the same step), a merge round every `merge_every` agent steps
(merge_rounds.py), checkpoints, pause and stop, the run-directory and disk checks
(disk_guard.py), phase records and the shared snapshot. Apart from the process entry
(process.py), which sets them up once and says how the process ended.
Over 300 lines because every hook reads and changes the same state of the process's workers.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from agent.errors import ConfigError, UserError
from agent.knobs import KnobValues, knob_text
from agent.pack.merge_rule import collective_refusal
from agent.self_check import Verdict
from workers.rundir.directory import save_checkpoint, state_size
from workers.rundir.knob_record import KnobStore, run_knobs, validate_record
from workers.rundir.lanes import check_layout
from workers.rundir.paths import checkpoint_path
from workers.rundir.rank_records import forward_records
from workers.rundir.records import (
    Checkpoint,
    FirstUpdate,
    KnobRecord,
    KnobsApplied,
    KnobsRefused,
    Pause,
    Pretraining,
    Resume,
    Seeding,
)
from workers.rundir.settings import read_record
from workers.training.disk_guard import DiskGuard
from workers.training.fast_path import bf16_check
from workers.training.first_weights import StartState
from workers.training.merge_rounds import MergeRounds
from workers.training.rank_sync import rank0_knob_record, rejoin_job
from workers.training.spec import STATES, WorkerLink
from workers.training.stop_training import StopTraining
from workers.training.trainer import Trainer

PHASE_RECORD_S = 5.0  # seconds between "seeding" / "pretraining" records
# A torchrun job's ranks take rank 0's knob record, and send it their new records, at every
# merge round and every this many agent steps (the same steps on every rank: a knob changes
# for all at once). Measured: a knob applied 0.6-2.8 s after it was set (BENCHMARKS.md).
SYNC_STEPS = 50


class WorkerHooks:
    """The trainer's hooks (trainer.py TrainingHooks) for all the workers of its process:
    one, or a pack (one link each)."""

    def __init__(
        self,
        links: list[WorkerLink],
        trainer: Trainer,
        pause: Any,
        stop: Any,
        terminated: Any = None,
        start: StartState | None = None,
        started: float | None = None,
        checked: Verdict | None = None,
    ):
        """`pause`, `stop`: the run's events; `terminated`: set when this process was sent
        SIGTERM. `start`: how these workers started (the knobs and pool their checkpoints
        applied last; whether they joined with the pool's weights). `started`: time.time()
        when the process started. `checked`: its start-up self-check's verdict."""
        specs = [link.spec for link in links]
        spec = specs[0]  # run-wide fields are the same in every worker's spec
        self.links, self.specs, self.spec, self.trainer = links, specs, spec, trainer
        self.pause_event = pause
        # The whole run stops, a worker leaves it, or the process was sent SIGTERM itself.
        leaves = [link.leave for link in links]
        self.stop_events = tuple(e for e in (stop, *leaves, terminated) if e is not None)
        self.parent = os.getppid()
        self.disk = DiskGuard(spec.index, spec.run_path, self.set, trainer.log_all, self._stop_now)
        start = start or StartState()
        # A self-check found bf16 disagreeing with float32 here (its self_check record says
        # so), now or before a resume (the checkpoint keeps it): these workers compute in
        # float32 whatever the bf16 knob asks. bf16 turned on where no check has compared it
        # (the process started in float32) is checked first (apply_knobs).
        tried = checked.trials if checked is not None else ()
        dropped = any(t.path.bf16 for t in tried) and not checked.path.bf16
        self.float32_only = start.bf16_refused or dropped
        self.bf16_checked = any(t.path.bf16 and t.outcome == "agrees" for t in tried)
        for member in trainer.members:
            member.run_dir.on_write_error = self.disk.wait_for_disk
        self.started, self.first_update_s = started or time.time(), None
        self.knobs = KnobStore(spec.run_path)
        # The run's own values, never a code default: those this worker applied last (its
        # checkpoint), else the run's; the newest good knob record goes over them below.
        self.knob_version = start.knob_version
        self.merge_every = start.merge_every or spec.merge_every
        if spec.distributed and spec.resume:
            rejoin_job(trainer, spec.job_path, len(specs))
        self.rounds = (
            MergeRounds(specs, trainer, self.set, self._stopping, start)
            if any(sp.merge_with for sp in specs)
            else None
        )
        self.last_round = self._round()
        self.last_sync = trainer.step // SYNC_STEPS
        self.last_phase_record = -math.inf
        self.next_checkpoint = (trainer.step // spec.checkpoint_every + 1) * spec.checkpoint_every
        if spec.distributed:
            self._shared_knobs()
            return
        # knobs.json, or its history if damaged
        good = self.knobs.last_good_record(trainer.agent.cfg)
        if good is not None and good.version > self.knob_version:
            self.apply_knobs(good)
        elif good is not None:  # the pool (and lane) the record says, with the values in force
            self._follow_pool(good)
        self.apply_knobs()

    def _round(self) -> int:
        """The merge round these workers are in: merge_every agent steps since they entered
        their pool."""
        base = self.rounds.pool_base if self.rounds is not None else 0
        return (self.trainer.step - base) // self.merge_every

    def _follow_pool(self, record: KnobRecord) -> None:
        """A new merge pool (a race's start, a promotion) is entered at this step."""
        if self.rounds is not None and self.rounds.follow(record):
            self.last_round = self._round()

    def _shared_knobs(self) -> None:
        """A rank of a torchrun job takes rank 0's knob record (at the start, every merge
        round and every SYNC_STEPS), so that every rank applies a version at the same
        step (when the rounds fall depends on merge_every: the ranks must agree on it)."""
        record = rank0_knob_record(self.knobs, self.trainer.agent.cfg)
        if record is not None and record[0] > self.knob_version:
            self.apply_knobs(KnobRecord(version=record[0], values=record[1]))

    def set(self, **values: float) -> None:
        """The same values in every worker's snapshot."""
        for link in self.links:
            link.set(**values)

    def in_force(self) -> dict:
        """The knob values this worker runs with now."""
        return run_knobs(self.trainer.agent.cfg, self.merge_every)

    def apply_knobs(self, record: KnobRecord | None = None) -> None:
        """Apply the newest knob record (or `record`) between agent steps: the values of these
        workers' lane (a pack is in one lane), the planner's through the agent's config, the
        merge frequency here; and the lane's merge pool when the race's layout changed."""
        if record is None:
            try:
                record = self.knobs.poll(self.knob_version)
            except ConfigError as err:  # unreadable: reported once (until the file changes)
                self._refused(None, str(err), None)
                return
            if record is None:
                return
        version, mine = record.version, record.values_for(self.spec.index)
        try:
            # Validated when written; a damaged or hand-edited record is refused, reported.
            record = validate_record(self.trainer.agent.cfg, record, self._fits_run)
            mine = record.values_for(self.spec.index)
            refusal = self.spec.distributed and collective_refusal(mine)
            if refusal:
                raise ConfigError(refusal, "outer_lr")
        except ConfigError as err:
            knob = err.field if err.field in mine else None
            self._refused(version, str(err), knob, mine.get(knob))
            self.knob_version = version
            return
        values = record.values_for(self.spec.index)
        if values["bf16"] and not (self.float32_only or self.bf16_checked):
            self._check_bf16()
        if self.float32_only and values["bf16"]:
            values = KnobValues({**values, "bf16": False})
        self.trainer.agent.set_knobs(values)  # checked: the agent takes them as they are
        merge_every = int(values.get("merge_every", self.merge_every))
        if merge_every != self.merge_every:
            # Rounds are counted in the new unit from here on, the same way by every worker.
            self.merge_every = merge_every
            self.last_round = self._round()
        self._follow_pool(record)
        self.knob_version = version
        lane = record.lane_of(self.spec.index)
        self.trainer.log_all(
            KnobsApplied(step=self.trainer.step, version=version, values=dict(values), lane=lane)
        )
        self.set(knob_version=version)

    def _check_bf16(self) -> None:
        """The self-check of bf16 on this process's path, before bf16 is first used here."""
        trainer = self.trainer
        if trainer.agent.device.type != "cpu":
            return  # a CPU knob: validate_knobs refuses it on CUDA
        names = ", ".join(str(sp.index) for sp in self.specs)
        who = f"worker {names}" if len(self.specs) == 1 else f"workers {names} (a pack)"
        runs = [member.run_dir for member in trainer.members]
        verdict = bf16_check(trainer, runs, who)
        self.bf16_checked = True
        self.float32_only = not verdict.path.bf16

    def _fits_run(self, record: KnobRecord) -> None:
        """ConfigError unless the record's lanes fit the run's workers as run.json has them
        now (every merging worker in one lane, no worker it does not have): a record written
        by hand or damaged must not mix lanes' merge pools."""
        if not record.lanes:
            return
        try:
            settings = read_record(Path(self.spec.run_path))[1]
        except UserError:
            return  # run.json damaged: the run reports it; the lanes cannot be checked
        check_layout(record.lanes, settings.workers, settings.merging, record.replicas)

    def _refused(self, version: int | None, reason: str, knob: str | None, value=None) -> None:
        """Record a knob record this worker does not apply: the values in force stay."""
        in_force = self.in_force()
        if knob in in_force:
            stays = f"{knob} stays {in_force[knob]}"
        else:
            stays = "the last good values stay: " + ", ".join(
                f"{k}={knob_text(v)}" for k, v in in_force.items()
            )
        what = (
            f"knob record version {version} refused"
            if version is not None
            else "knob record unreadable"
        )
        self.trainer.log_all(
            KnobsRefused(
                step=self.trainer.step,
                version=version,
                knob=knob,
                value=value,
                reason=reason,
                in_force=in_force,
                in_force_version=self.knob_version,
                message=f"{what}: {reason}; {stays}",
            )
        )

    def checkpoint(self) -> None:
        """One checkpoint per worker: worker-K.pt of a pack is a lone worker's."""
        for k, spec in enumerate(self.specs):
            member = self.trainer.members[k]
            path = checkpoint_path(spec.run_path, spec.index)
            path.parent.mkdir(exist_ok=True)
            state = self.trainer.state_dict(k)  # its "knobs": the agent's values in force
            state.update(knob_version=self.knob_version, merge_every=self.merge_every)
            state.update(bf16_refused=self.float32_only)  # a check's drop survives a resume
            if self.rounds is not None:
                state.update(self.rounds.pool_state())
            # Streamed to the file (no bytes copy of the buffer); the previous one stays until
            # this one is complete; a full disk: wait for about its size, retry.
            size = state_size(state)
            member.run_dir.guarded(path, size, lambda p=path, s=state: save_checkpoint(p, s))
            member.log(Checkpoint(step=self.trainer.step, path=str(path)))

    def _checkpoint_asked(self) -> bool:
        asked = any(link.checkpoint.is_set() for link in self.links)
        for link in self.links:
            link.checkpoint.clear()
        return asked

    def _stopping(self) -> bool:
        return any(event.is_set() for event in self.stop_events)

    def _stop_now(self) -> bool:
        # A run whose main process died (kill -9) must not leave orphans training on.
        return self._stopping() or os.getppid() != self.parent

    def obey_pause_and_stop(self) -> None:
        paused = False
        while self.pause_event.is_set() and not self._stopping():
            if not paused:  # recorded, so that a window attached to the run sees it
                paused = True
                self.trainer.log_all(Pause(step=self.trainer.step))
            self.set(state=STATES.index("paused"), heartbeat=time.time())
            time.sleep(0.05)
            if not self.spec.distributed:  # a rank applies knobs at merge rounds only
                self.apply_knobs()
        if paused:
            self.trainer.log_all(Resume(step=self.trainer.step))
        if self._stop_now():
            raise StopTraining

    def during_evaluation(self, trainer: Trainer) -> None:
        """Called after every evaluation step: an evaluation takes minutes on a CPU, and a
        stop or pause must not wait for it to end."""
        self.obey_pause_and_stop()
        self.set(state=STATES.index("training"), heartbeat=time.time())

    def after_update(self, trainer: Trainer) -> None:
        """Called after every update, so that pretraining (minutes of updates on a CPU) can be
        paused, stopped and checkpointed, and its progress shown."""
        if self.first_update_s is None:
            # With CUDA graphs this is when the compiling ended (once per pack).
            self.first_update_s = round(time.time() - self.started, 1)
            self.set(first_update_s=self.first_update_s)
            trainer.log_all(FirstUpdate(step=trainer.step, seconds=self.first_update_s))
        if trainer.pretrained:
            return  # training does few updates per agent step: the step hook is soon enough
        self.disk.check_run_dir()
        self.disk.resumed(trainer.step)
        if self._checkpoint_asked():
            self.checkpoint()
        self.obey_pause_and_stop()
        self.set(state=STATES.index("pretraining"), updates=trainer.updates, heartbeat=time.time())
        self._phase_record(Pretraining(step=trainer.step, updates=trainer.updates))

    def _phase_record(self, record: Seeding | Pretraining) -> None:
        """Seeding and pretraining write no other records for minutes: say every few seconds
        that they go on, so that a window attached to the run shows them (and knows the
        worker is alive)."""
        now = time.monotonic()
        if now - self.last_phase_record >= PHASE_RECORD_S:
            self.last_phase_record = now
            self.trainer.log_all(record)

    def after_step(self, trainer: Trainer) -> None:
        self.disk.check_run_dir()
        self.disk.resumed(trainer.step)
        if not self.spec.distributed:
            self.apply_knobs()
        round_ = self._round()
        merged = self.rounds is not None and round_ > self.last_round
        if merged:
            self.rounds.merge(round_, self.merge_every)
            self.last_round = round_
        if self.spec.distributed and (merged or trainer.step // SYNC_STEPS > self.last_sync):
            self.last_sync = trainer.step // SYNC_STEPS
            self._shared_knobs()
            # The other ranks' new records reach rank 0's directory (an attached window).
            workers = max(next(sp.merge_with for sp in self.specs if sp.merge_with)) + 1
            forward_records(self.spec.job_path, [sp.index for sp in self.specs], workers)
        if self._checkpoint_asked() or trainer.step >= self.next_checkpoint:
            self.checkpoint()
            self.next_checkpoint = (
                trainer.step // self.spec.checkpoint_every + 1
            ) * self.spec.checkpoint_every
        self.obey_pause_and_stop()
        phase = "training" if trainer.pretrained else "seeding"
        if phase == "seeding":
            self._phase_record(Seeding(step=trainer.step))
        self.set(
            step=trainer.step,
            steps_per_s=trainer.progress.rate,
            state=STATES.index(phase),
            updates=trainer.updates,
            heartbeat=time.time(),
        )
        for link, member in zip(self.links, trainer.members):
            returns = member.episode_returns
            link.set(last_return=returns[-1] if returns else float("nan"))
