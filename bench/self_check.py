"""`launch.py bench --self-check K`: the start-up self-check of one training process of K workers
(a pack when K > 1) on the flags' config, as a run's process makes it (agent/check_probe.py): the
path it chose, each path tried, and its time, compiling apart. .ci/gpu-bench.sh runs it first,
so the first minute of a lent GPU says whether the fast path is sound."""

from __future__ import annotations

import time

import torch

from agent.agent import TDMPC2
from agent.check_probe import check_fast_path
from agent.config import Config
from agent.envs import env_of


def self_check_benchmark(cfg: Config, workers: int) -> dict:
    env = env_of(cfg, cfg.seed)
    obs_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
    env.close()
    seeds = [cfg.seed + 1000 * k for k in range(workers)]  # as a run seeds its workers
    agent = TDMPC2(cfg, obs_dim, action_dim, seeds=seeds)
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
