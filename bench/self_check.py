"""`launch.py bench --self-check K`: the start-up self-check of one training process of K workers
(a pack when K > 1) on the flags' config, as a run's process makes it (agent/check_probe.py): the
path it chose, each path tried, and its time, compiling apart. .ci/gpu-bench.sh runs it first,
so the first minute of a lent GPU says whether the fast path is sound. With `--gaps N`: the
largest gap of each compared value between the fast path and its reference over N of the
check's seeds, the measurement behind agent/self_check.py's tolerances."""

from __future__ import annotations

import time
from dataclasses import asdict, replace

import torch

from agent.agent import TDMPC2
from agent.check_probe import CHECK_SEED, AgentProbe, check_fast_path, tf32_matmuls
from agent.config import Config
from agent.envs import env_of
from agent.self_check import Outputs, tolerance


def _agent(cfg: Config, workers: int) -> TDMPC2:
    env = env_of(cfg, cfg.seed)
    obs_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
    env.close()
    seeds = [cfg.seed + 1000 * k for k in range(workers)]  # as a run seeds its workers
    return TDMPC2(cfg, obs_dim, action_dim, seeds=seeds)


def self_check_benchmark(cfg: Config, workers: int) -> dict:
    agent = _agent(cfg, workers)
    start = time.perf_counter()
    verdict = check_fast_path(agent, cfg.fast_path)
    seconds = time.perf_counter() - start
    path = verdict.path
    return {
        "task": cfg.task,
        "model_size": cfg.model_size,
        "device": str(agent.device),
        "device_name": torch.cuda.get_device_name(agent.device)
        if agent.device.type == "cuda"
        else "cpu",
        "workers": workers,
        "threads": torch.get_num_threads(),
        "path": "split" if path.split else path.mode,
        "bf16": path.bf16,
        "sound": verdict.sound,
        "update_one_graph": agent.fused_update if agent.compiled else None,
        "seconds": round(seconds, 2),
        "compile_seconds": round(verdict.compile_seconds, 2),
        "beyond_compile_seconds": round(seconds - verdict.compile_seconds, 2),
        "trials": [t.describe() for t in verdict.trials],
        "line": verdict.line(),
    }


def format_self_check(result: dict) -> str:
    sound = "SOUND" if result["sound"] else "NOT SOUND"
    return (
        f"self-check {sound} on {result['device']} ({result['device_name']}), "
        f"{result['model_size']}M {result['task']}, {result['workers']} worker(s): "
        f"{result['seconds']} s ({result['compile_seconds']} s compiling, "
        f"{result['beyond_compile_seconds']} s beyond)\n{result['line']}"
    )


def gaps(fast: Outputs, plain: Outputs) -> dict[str, float]:
    """Each compared value's largest gap over the workers: losses relative (and absolute, for
    losses near 0), each worker's weight change relative, the plan's mean and action absolute."""
    out = {}
    for name, ref in plain.losses.items():
        gap = (fast.losses[name].double() - ref.double()).abs()
        out[f"{name} rel"] = (gap / ref.double().abs().clamp_min(1e-12)).max().item()
        out[f"{name} abs"] = gap.max().item()
    changes = []
    for k in range(plain.action.shape[0]):
        diff = sum(
            (fast.delta[n][k] - d[k]).double().square().sum() for n, d in plain.delta.items()
        )
        norm = sum(d[k].double().square().sum() for d in plain.delta.values())
        changes.append((diff / norm).sqrt().item())
    out["weights rel"] = max(changes)
    out["plan mean abs"] = (fast.mean - plain.mean).abs().max().item()
    out["action abs"] = (fast.action - plain.action).abs().max().item()
    return out


def gap_benchmark(cfg: Config, workers: int, seeds: int) -> dict:
    """The largest gaps of the agent's own fast path (by hand: --fast-path) over `seeds` of
    the check's weights and inputs."""
    agent = _agent(cfg, workers)
    path = agent.path
    if cfg.fast_path != "auto":
        path = replace(path, mode=cfg.fast_path, threads=path.threads and cfg.fast_path == "eager")
    largest: dict[str, float] = {}
    for seed in range(seeds):
        fast, plain = AgentProbe(agent, CHECK_SEED + seed).pair(path)
        for name, gap in gaps(fast, plain).items():
            largest[name] = max(largest.get(name, 0.0), gap)
    return {
        "task": cfg.task,
        "model_size": cfg.model_size,
        "device": str(agent.device),
        "workers": workers,
        "path": path.describe(),
        "seeds": seeds,
        "tolerance": asdict(tolerance(path, tf32_matmuls(agent))),
        "largest": {k: float(f"{v:.3g}") for k, v in largest.items()},
    }
