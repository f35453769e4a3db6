"""What a rank of a torchrun job agrees on with the others, over torch.distributed: where a
resumed job goes on from, and rank 0's knob record (see hooks.py, which calls these)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from agent.config import Config
from workers.rundir.directory import load_state
from workers.rundir.knob_record import KnobStore
from workers.rundir.paths import merged_path
from workers.training.trainer import Trainer


def rejoin_job(trainer: Trainer, job_path: str, workers: int) -> None:
    """A resumed rank: every rank counts on from the furthest step any of them reached and
    takes rank 0's last merged weights, so that their merge rounds and their weights line up
    again (their checkpoints may be a few steps apart). `workers`: this rank's."""
    t = trainer
    furthest = torch.tensor([float(t.step)], device=t.agent.device)
    dist.all_reduce(furthest, op=dist.ReduceOp.MAX)
    merged: list = [None]
    if dist.get_rank() == 0 and merged_path(job_path).exists():
        merged = [load_state(merged_path(job_path))["model"]]
    dist.broadcast_object_list(merged, src=0)
    if merged[0] is not None:
        weights = t.agent.checked_model_state(merged[0])
        t.agent.load_model_state(weights, list(range(workers)))
    if furthest.item() > t.step:  # (a rank with no checkpoint yet starts here too)
        t.start_at(int(furthest.item()))


def rank0_knob_record(knobs: KnobStore, cfg: Config) -> tuple[int, dict] | None:
    """Rank 0's newest good knob record (version, values), the same on every rank."""
    record = [knobs.last_good(cfg) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(record, src=0)
    return record[0]
