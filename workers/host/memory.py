"""Whether a run's replay buffers fit the memory they will live in, checked before anything is
written: pixel buffers hold 12 KB a step (1M steps: 12 GB a worker), and a run that would
exhaust the machine's memory hours in should be refused at its start, in one line."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from agent.agent import resolve_device
from agent.buffer import EpisodeBuffer, buffer_rows, frame_storage
from agent.config import Config
from agent.errors import UserError

SHARE = 0.8  # of the memory available: the rest for the networks, batches and the program


def available_bytes(device: str, meminfo: str | None = None) -> tuple[int, str]:
    """The memory a run's buffers would live in, and its name: the visible GPUs' together on
    CUDA (buffers live on the agent's device), else this machine's available memory
    (MemAvailable, else all of it)."""
    if resolve_device(device).type == "cuda":
        count = torch.cuda.device_count()
        total = sum(torch.cuda.get_device_properties(i).total_memory for i in range(count))
        return total, "GPU memory" if count == 1 else f"GPU memory on {count} GPUs"
    text = meminfo if meminfo is not None else _read("/proc/meminfo")
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024, "memory available"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "memory"


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def local_workers(workers: int, pack: int, ranks: int) -> int:
    """The workers whose buffers this machine holds: all of a run's, or (a torchrun job of
    `ranks`) its ranks on this machine (LOCAL_WORLD_SIZE) times each rank's `pack`."""
    if ranks > 1:
        return pack * int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return workers


def buffers_bytes(cfg: Config, workers: int, obs_dim: int, action_dim: int) -> int:
    """What `workers` replay buffers of `cfg` take once allocated."""
    storage = frame_storage(cfg)
    frames = storage.get("frames", 1)
    obs_bytes = storage.get("dtype", torch.float32).itemsize
    row = EpisodeBuffer.row_bytes(obs_dim, action_dim, frames, obs_bytes)
    return workers * buffer_rows(cfg) * row


def check_buffers_fit(
    cfg: Config, workers: int, obs_dim: int, action_dim: int, available: tuple[int, str]
) -> None:
    """UserError in one line when the run's buffers need more than SHARE of `available`
    (available_bytes' answer), naming the largest --buffer-size that fits."""
    need = buffers_bytes(cfg, workers, obs_dim, action_dim)
    room, where = available
    if need <= SHARE * room:
        return
    per_step = need // (workers * buffer_rows(cfg))
    extra = buffer_rows(cfg) - min(cfg.buffer_size, cfg.steps)  # first rows of episodes
    fits = max(0, int(SHARE * room) // (workers * per_step) - extra)
    raise UserError(
        f"the replay buffers do not fit: {workers} worker(s) x {buffer_rows(cfg):,} steps x "
        f"{per_step:,} bytes = {need / 1e9:.1f} GB, over {SHARE:.0%} of the {room / 1e9:.1f} GB "
        f"of {where}; give --buffer-size {fits} or less, or fewer --workers"
    )
