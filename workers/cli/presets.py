"""Named starting points for a run, so the window and the command line start runs the same way.

The demo preset is what a double-click on launch.py trains: on a CPU, a task and model that
visibly learn within minutes (cartpole-balance, 1M, reduced planning, action repeat 8, short
seeding, 2 workers); with a GPU,
the standard TD-MPC2 settings (walker-walk, 5M, default planning) with 4 workers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agent.config import MODEL_SIZES, Config, env_options, make_config
from agent.envs import task_defaults, task_names
from workers.host.precision import bf16_by_default

# Reduced planning for any task on a CPU (the new-run dialog's choice), 1000 seed steps.
CPU_PLANNING = dict(num_samples=128, num_elites=16, num_pi_trajs=8, iterations=2, seed_steps=1000)

# The CPU demo: learning visible within minutes on 2 cores (BENCHMARKS.md "The demo on a CPU"),
# every change a TD-MPC2 setting the window lists beside the published curve: reduced planning;
# cartpole's classic action repeat of 8 (PlaNet, DrQ, TD-MPC), so a 125-step episode is still
# the task's 1000 control steps and returns compare with the published ones; 250 seed steps
# (two episodes) and 100 pretraining updates instead of 5 episodes and as many updates.
CPU_DEMO_OVERRIDES = dict(
    CPU_PLANNING, action_repeat=8, episode_length=125, seed_steps=250, pretrain_updates=100
)


# A pixel run that trains until stopped keeps this many steps per worker unless --buffer-size
# says: 1.2 GB a worker (the authors' 1M: 12 GB, more than a window's 2 workers have on a
# 24 GB machine). The chart lists it beside the published curve.
PIXEL_BUFFER = 100_000


@dataclass(frozen=True)
class Preset:
    task: str
    model_size: int
    workers: int
    overrides: dict
    merge_every: int | None = None  # None: the run's default (RunSettings)


def cuda_available() -> bool:
    return torch.cuda.is_available()


def demo_preset(device: str = "auto") -> Preset:
    """The run a bare `python launch.py` starts on this machine (and device choice)."""
    cuda = device.startswith("cuda") or (device == "auto" and cuda_available())
    if cuda:
        return Preset("walker-walk", 5, 4, {})
    return Preset("cartpole-balance", 1, 2, dict(CPU_DEMO_OVERRIDES), merge_every=500)


def preset_config(preset: Preset, **overrides: object) -> Config:
    """The preset's config, with explicit overrides on top (validated by make_config).
    Runs from a preset train until stopped (10M agent steps) unless `steps` says otherwise,
    from pixels with a buffer of PIXEL_BUFFER steps; they compute in bf16 on a CPU with a bf16
    unit unless `bf16` says otherwise."""
    task = str(overrides.get("task", preset.task))
    env_kwargs = env_options(str(overrides.get("env_kwargs", "")))
    # an unknown task name fails here
    brought = task_defaults(task, overrides.get("action_repeat"), env_kwargs)
    # bf16 where the CPU has a bf16 unit, unless the flags say (workers/host/precision.py)
    brought["bf16"] = bf16_by_default(str(overrides.get("device", Config.device)))
    if overrides.get("obs") == "rgb" and "steps" not in overrides:
        brought["buffer_size"] = PIXEL_BUFFER
    return make_config(
        preset.model_size,
        **{"task": task, "steps": 10_000_000, **brought, **preset.overrides, **overrides},
    )


def tasks() -> list[str]:
    return task_names()


def model_sizes() -> list[int]:
    return sorted(MODEL_SIZES)
