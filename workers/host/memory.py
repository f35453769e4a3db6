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


def episodes_bytes(cfg: Config, workers: int, obs_dim: int) -> int:
    """What the trainer holds of the episodes in progress (training/trainer.py): each env's
    observations, whole stacks (3 buffer rows each from pixels), until its episode ends, up to
    episode_length + 1 of them; and while one is stored, its np.stack copy and the comparison
    of its frames (_is_frame_stack: a byte for each value of all but the oldest frame).
    Checkpoints add nothing here: they are streamed to their file and loaded mapped from it
    (rundir/directory.py), only the file's pages, which the system can drop, beside the
    buffer."""
    storage = frame_storage(cfg)
    frames = storage.get("frames", 1)
    stack = (cfg.episode_length + 1) * obs_dim * storage.get("dtype", torch.float32).itemsize
    compared = (cfg.episode_length + 1) * obs_dim * (frames - 1) // frames if frames > 1 else 0
    return workers * (cfg.num_envs * stack + stack + compared)


def check_buffers_fit(
    cfg: Config,
    workers: int,
    obs_dim: int,
    action_dim: int,
    available: tuple[int, str],
    hint: str = "",
) -> None:
    """UserError in one line when the run's buffers and episodes in progress need more than
    SHARE of `available` (available_bytes' answer), naming the largest --buffer-size that fits
    (or `hint`, what to do instead)."""
    buffers = buffers_bytes(cfg, workers, obs_dim, action_dim)
    episodes = episodes_bytes(cfg, workers, obs_dim)
    need = buffers + episodes
    room, where = available
    if need <= SHARE * room:
        return
    per_step = buffers // (workers * buffer_rows(cfg))
    extra = buffer_rows(cfg) - min(cfg.buffer_size, cfg.steps)  # first rows of episodes
    fits = max(0, (int(SHARE * room) - episodes) // (workers * per_step) - extra)
    if not hint:
        hint = f"give --buffer-size {fits} or less, or fewer --workers"
        if fits == 0 and episodes > SHARE * room:
            hint = "give fewer --num-envs or a shorter --episode-length, or fewer --workers"
    raise UserError(
        f"the replay buffers do not fit: {workers} worker(s) x {buffer_rows(cfg):,} steps x "
        f"{per_step:,} bytes = {buffers / 1e9:.1f} GB, and {episodes / 1e9:.1f} GB of "
        f"episodes in progress ({cfg.num_envs} env(s) x {cfg.episode_length:,} steps), over "
        f"{SHARE:.0%} of the {room / 1e9:.1f} GB of {where}; {hint}"
    )


def check_resumed(cfg: Config, workers: int, obs_dim: int, action_dim: int, available) -> None:
    """check_buffers_fit for a resumed run: its buffers may have grown (--steps)."""
    check_buffers_fit(
        cfg,
        workers,
        obs_dim,
        action_dim,
        available,
        hint=f"resume with fewer --steps than {cfg.steps:,}, or where more memory is free",
    )


def check_added_worker(
    cfg: Config, running: int, obs_dim: int, action_dim: int, meminfo: str | None = None
) -> None:
    """Whether one more worker's buffer fits what is available now: on the CPU the memory
    available (the running workers' buffers already out of it), on CUDA (available_bytes
    gives the GPUs' whole memory) the running workers' and its own together."""
    available = available_bytes(cfg.device, meminfo)
    cuda = resolve_device(cfg.device).type == "cuda"
    check_buffers_fit(
        cfg,
        running + 1 if cuda else 1,
        obs_dim,
        action_dim,
        available,
        hint="no worker added; stop other programs or workers first",
    )
