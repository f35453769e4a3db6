"""How a worker starts, before its first agent step: it resumes from its own checkpoint (the
newest complete one), or starts from its pool's merged weights (a worker added to a run, or
restarted after a merge, in step with the others, with its checkpoint's replay buffer where it
has one), or from the run's start weights (start.pt, from --load), or fresh. Apart from the
process entry (process.py) because every way in reads different files and writes its own
record.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.errors import ConfigError
from workers.merging.files import pool_weights
from workers.rundir.directory import load_checkpoint, load_state, previous_path
from workers.rundir.knob_record import KnobStore
from workers.rundir.paths import (
    START,
    checkpoint_path,
    merged_path,
    pool_dir,
    promoted_path,
    start_path,
    weights_name,
)
from workers.rundir.records import (
    KnobRecord,
    Resumed,
    StartedFresh,
    StartedFromMerged,
    StartedFromWeights,
)
from workers.training.spec import WorkerSpec
from workers.training.trainer import Trainer


@dataclass(frozen=True)
class StartState:
    """What a worker's start tells its hooks: the knob version, merge frequency and merge pool
    its checkpoint applied last (none: the run's), whether it joined its pool with the pool's
    merged weights (left out of the mean until it updates), and whether a self-check took bf16
    away from it."""

    knob_version: int = -1
    merge_every: int | None = None
    pool: int = 0
    lane: int | None = None
    pool_base: int = 0
    joined: bool = False
    bf16_refused: bool = False  # a self-check found bf16 disagreeing here: float32 from then


def _checkpoint_state(state: dict, joined: bool = False) -> StartState:
    refused = bool(state.get("bf16_refused", False))
    if "merge_every" not in state:  # older checkpoints kept no merge frequency
        return StartState(joined=joined, bf16_refused=refused)
    lane = state.get("lane")
    return StartState(
        int(state.get("knob_version", -1)),
        int(state["merge_every"]),
        int(state.get("pool", 0)),
        None if lane is None else int(lane),
        int(state.get("pool_base", 0)),
        joined,
        refused,
    )


def record_now(spec: WorkerSpec) -> KnobRecord | None:
    """The knob record as it is now (None: none, or unreadable)."""
    try:
        return KnobStore(spec.run_path).read_record()
    except ConfigError:
        return None


def pool_weights_path(spec: WorkerSpec, record: KnobRecord | None) -> Path | None:
    """The weights a worker restarting in its pool starts from: the pool's newest merged ones,
    or in a lane that never merges its own, which it publishes every merge round; in a pool
    that a promotion with weights formed and that has not merged yet, the promoted weights
    (not the race-end weights of a lane). Else the newest file there is (None: none)."""
    lane = record.lane_of(spec.index) if record is not None else None
    solo = record is not None and not record.merges(lane)
    path = merged_path(spec.run_path, lane)
    if solo:
        path = pool_dir(spec.run_path, lane) / weights_name(spec.index)
    own = spec.index if solo else None
    if record is not None and pool_weights(spec.run_path, lane, record.pool, own) is None:
        promoted = promoted_path(spec.run_path, record.pool)
        if record.promoted_lane is not None and promoted.exists():
            return promoted
    return path if path.exists() else None


def start_worker(spec: WorkerSpec, trainer: Trainer, k: int, join) -> StartState | None:
    """Worker k of the process resumes from its checkpoint, or starts from the merged weights
    of its pool (keeping the replay buffer of its checkpoint, if it has one), or from the
    run's start weights, or fresh. Returns what its hooks need to know (None: a fresh
    start)."""
    run = trainer.members[k].run_dir
    ckpt = checkpoint_path(spec.run_path, spec.index)
    record = record_now(spec)
    lane = record.lane_of(spec.index) if record is not None else None
    has_checkpoint = ckpt.exists() or previous_path(ckpt).exists()
    pool_file = pool_weights_path(spec, record)
    from_merged = spec.start_from_merged and pool_file is not None
    if spec.resume and has_checkpoint and not from_merged:
        # The newest complete checkpoint: a damaged one falls back to the previous. Loaded
        # on the CPU: random generators take their states only from there (mapped to a GPU,
        # set_state refuses them), and what loads each tensor moves it to the device.
        state, used, passed_over = load_checkpoint(ckpt)
        trainer.load_state_dict(state, worker=k)
        fallback = None
        if passed_over:
            fallback = (
                f"worker {spec.index}: {passed_over}; resumed from the previous checkpoint "
                f"{used.name} at step {trainer.step}"
            )
        run.log(Resumed(step=trainer.step, checkpoint=used.name, fallback=fallback))
        return _checkpoint_state(state)
    elif from_merged:
        start = StartState(joined=True)
        if has_checkpoint:  # its own buffer, optimiser and counters; the pool's networks
            state = load_checkpoint(ckpt)[0]
            trainer.load_state_dict(state, worker=k)
            start = _checkpoint_state(state, joined=True)
        _load_networks(trainer, k, pool_file)
        trainer.start_at(_join_step(spec, join))
        kept = len(trainer.members[k].buffer)
        run.log(StartedFromMerged(step=trainer.step, lane=lane, buffer=kept))
        return start
    else:
        # Fresh: from the run's start weights where it has them (--load), in step with the
        # others when restarted before any merge.
        join_step = _join_step(spec, join) if spec.start_from_merged else 0
        if join_step > 0:
            trainer.start_at(join_step)
        start = start_path(spec.run_path)
        if start.exists():
            _load_networks(trainer, k, start)
            run.log(StartedFromWeights(step=trainer.step, file=START))
        elif join_step > 0:
            run.log(StartedFresh(step=trainer.step))
    return None


def _load_networks(trainer: Trainer, k: int, path: Path) -> None:
    """Worker k's networks from a file of one worker's networks (merged or start weights)."""
    weights = load_state(path, trainer.agent.device)["model"]
    trainer.agent.load_model_state(trainer.agent.checked_model_state(weights), [k])


def _join_step(spec: WorkerSpec, join) -> int:
    return max(spec.join_step, int(join.value) if join is not None else 0)
