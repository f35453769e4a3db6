"""A torchrun job's records reach rank 0's run directory: the ranks keep their own files.

Rank 0 holds the run directory a window attaches to; every other rank writes its workers'
records into a folder of its own (`rank-R/` under the run directory path on its machine), so that
no file system need be shared. At every merge round, and once at the end, the lines a rank wrote
since rank 0's copy ends are gathered to rank 0, which appends them to its `worker-K.jsonl`.
Rank 0 tells each rank where its copy ends, so nothing is sent twice or lost, however often
this is called or restarted: its copy is always a prefix of the rank's own file.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch.distributed as dist

from workers.rundir.paths import metrics_name


def rank_path(run_path: str | Path, rank: int) -> Path:
    """Where rank `rank` keeps its own files (rank 0: the run directory itself)."""
    return Path(run_path) if rank == 0 else Path(run_path) / f"rank-{rank}"


def forward_records(run_path: str | Path, workers: list[int], all_workers: int) -> None:
    """A collective: every rank's new records of its `workers` are appended to rank 0's copies
    in `run_path` (the job has `all_workers` workers)."""
    rank = dist.get_rank()
    ends: list = [None]
    if rank == 0:
        ends = [{k: _size(Path(run_path) / metrics_name(k)) for k in range(all_workers)}]
    dist.broadcast_object_list(ends, src=0)
    new: dict[int, bytes] = {}
    if rank != 0:
        for k in workers:
            data = _read_from(rank_path(run_path, rank) / metrics_name(k), ends[0][k])
            if data:
                new[k] = data
    gathered: list | None = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(new, gathered, dst=0)
    if rank == 0:
        for part in gathered:
            for k, data in part.items():
                with open(Path(run_path) / metrics_name(k), "ab") as f:
                    f.write(data)


def _size(path: Path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> bytes:
    """The whole lines of `path` after byte `offset` (a line being written waits)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return b""
    return data[: data.rfind(b"\n") + 1]
