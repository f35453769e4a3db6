"""How a worker starts, before its first agent step: it resumes from its own checkpoint (the
newest complete one), or starts from the merged weights (a worker added to a run, or restarted
after a merge, in step with the others), or from the run's start weights (start.pt, from
--load), or fresh. Apart from the process entry (process.py) because every way in reads
different files and writes its own record.
"""

from __future__ import annotations

from pathlib import Path

from workers.rundir.directory import load_checkpoint, load_state, previous_path
from workers.rundir.paths import START, checkpoint_path, merged_path, start_path
from workers.rundir.records import Resumed, StartedFresh, StartedFromMerged, StartedFromWeights
from workers.training.spec import WorkerSpec
from workers.training.trainer import Trainer


def start_worker(spec: WorkerSpec, trainer: Trainer, k: int, join) -> tuple[int, int] | None:
    """Worker k of the process resumes from its checkpoint, or starts from the merged weights,
    or from the run's start weights, or fresh. Returns the (knob version, merge_every) its
    checkpoint applied last, if any."""
    run = trainer.members[k].run_dir
    ckpt = checkpoint_path(spec.run_path, spec.index)
    if spec.resume and (ckpt.exists() or previous_path(ckpt).exists()):
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
        if "merge_every" in state:  # older checkpoints kept no merge frequency
            return int(state.get("knob_version", -1)), int(state["merge_every"])
    elif spec.start_from_merged and merged_path(spec.run_path).exists():
        _load_networks(trainer, k, merged_path(spec.run_path))
        trainer.start_at(_join_step(spec, join))
        run.log(StartedFromMerged(step=trainer.step))
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
