"""`launch.py bench` without a mode flag: time update, plan and env step; the FLOP rate achieved
against this machine's matmul rate. The other modes are in their own modules; bench/cli.py
dispatches to all of them."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from agent.agent import TDMPC2
from agent.buffer import EpisodeBuffer, frame_storage
from agent.config import Config, knobs_of
from agent.envs import env_of
from bench.graph_skips import cudagraph_skips

# The authors' implementation on a quiet 2-core CPU machine (platform notes), float32, batch 256,
# horizon 3, 512 samples x 6 iterations: (update ms, plan ms).
REFERENCE_CPU_MS = {1: (119.0, 155.0), 5: (453.0, 436.0)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def matmul_gflops(device: torch.device, dtype: torch.dtype = torch.float32) -> float:
    """This machine's matmul rate on a product of the model's own shape (1536x518 @ 518x512)."""
    a = torch.randn(1536, 518, device=device, dtype=dtype)
    b = torch.randn(518, 512, device=device, dtype=dtype)
    reps = 200 if device.type == "cuda" else 20
    ms = median_ms(lambda: [a @ b for _ in range(reps)], device, repeats=5, warmup=2) / reps
    return 2 * 1536 * 518 * 512 / (ms * 1e6)


def count_flops(fn: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def filled_buffer(
    cfg: Config, obs_dim: int, action_dim: int, device: torch.device
) -> EpisodeBuffer:
    """A buffer holding a few random episodes, so update timing includes sampling (and, for
    pixels, stacking the frames again)."""
    storage = frame_storage(cfg)
    buffer = EpisodeBuffer(
        10 * (cfg.episode_length + 1),
        obs_dim,
        action_dim,
        cfg.horizon,
        cfg.batch_size,
        device,
        seed=cfg.seed,
        **storage,
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    for _ in range(4):
        steps = cfg.episode_length
        buffer.add_episode(
            random_observations(steps + 1, obs_dim, storage.get("frames", 1), gen),
            torch.rand(steps, action_dim, generator=gen) * 2 - 1,
            torch.rand(steps, generator=gen),
        )
    return buffer


def random_observations(count: int, obs_dim: int, frames: int, gen: torch.Generator):
    """An episode's observations: normal numbers, or (frames > 1) stacks of random uint8
    frames as the env makes them (the first frame repeated at the start)."""
    if frames == 1:
        return torch.randn(count, obs_dim, generator=gen)
    single = torch.randint(0, 256, (count, obs_dim // frames), dtype=torch.uint8, generator=gen)
    steps = torch.arange(count)
    back = [(steps - k).clamp(min=0) for k in range(frames - 1, -1, -1)]
    return torch.cat([single[b] for b in back], dim=1)


def speed_benchmark(cfg: Config, repeats: int, warmup: int) -> dict:
    env = env_of(cfg, cfg.seed)
    obs_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
    obs, _ = env.reset(seed=cfg.seed)
    actions = np.random.default_rng(0).uniform(-1, 1, (1000, action_dim)).astype(np.float32)
    steps = iter(range(10**9))

    def env_step() -> None:
        _, _, term, trunc, _ = env.step(actions[next(steps) % 1000])
        if term or trunc:
            env.reset()

    env_ms = median_ms(lambda: [env_step() for _ in range(50)], torch.device("cpu"), 5, 1) / 50
    env.close()

    agent = TDMPC2(cfg, obs_dim, action_dim)
    device = agent.device
    buffer = filled_buffer(cfg, obs_dim, action_dim, device)
    obs_t = torch.from_numpy(obs).to(device)
    compile_error = None
    start = time.perf_counter()
    with cudagraph_skips() as skips:
        try:
            agent.act(obs_t, t0=True)
            agent.update(buffer.sample())
        except Exception as err:  # a compiler failure is reported, then timed without compile
            compile_error = f"{type(err).__name__}: {str(err)[:300]}"
            agent = TDMPC2(replace(cfg, compile=False), obs_dim, action_dim)
        first_call_s = time.perf_counter() - start
        update_ms = median_ms(lambda: agent.update(buffer.sample()), device, repeats, warmup)
        plan_ms = median_ms(lambda: agent.act(obs_t), device, repeats, warmup)

    # FLOPs are counted on an eager copy (the compiled functions hide their ops).
    eager = TDMPC2(replace(cfg, compile=False), obs_dim, action_dim)
    update_flops = count_flops(lambda: eager.update(buffer.sample()))
    plan_flops = count_flops(lambda: eager.act(obs_t))
    rate = matmul_gflops(device)
    step_ms = update_ms + plan_ms
    floor_ms = (update_flops + plan_flops) / (rate * 1e6)
    result = {
        "task": cfg.task,
        "model_size": cfg.model_size,
        "obs": cfg.obs,
        # what renders a pixel run's frames (the env step's time includes it)
        "gl": os.environ.get("MUJOCO_GL", "") if cfg.obs == "rgb" else None,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "compiled": agent.compiled,
        "update_one_graph": agent.fused_update,  # False: fell back to the graph-broken update
        # Empty for a compiled agent: its update and plan were timed as CUDA graph replays.
        "cudagraph_skips": skips,
        "compile_error": compile_error,
        "first_call_s": round(first_call_s, 1),
        "bf16": cfg.bf16,
        "knobs": {**knobs_of(cfg), "iterations": cfg.resolved_iterations(action_dim)},
        "batch_size": cfg.batch_size,
        "update_ms": round(update_ms, 3),
        "plan_ms": round(plan_ms, 3),
        "env_step_ms": round(env_ms, 4),
        "agent_steps_per_s": round(1000 / (step_ms + env_ms), 2),
        # Three significant digits: a tiny model's update is a few MFLOP, not 0.
        "update_gflop": float(f"{update_flops / 1e9:.3g}"),
        "plan_gflop": float(f"{plan_flops / 1e9:.3g}"),
        "achieved_gflop_per_s": round((update_flops + plan_flops) / (step_ms * 1e6), 1),
        "matmul_gflop_per_s": round(rate, 1),
        "fraction_of_matmul_rate": round(floor_ms / step_ms, 3),
        "floor_ms": round(floor_ms, 2),
        "time_over_floor": round(step_ms / floor_ms, 2),
    }
    reference = REFERENCE_CPU_MS.get(cfg.model_size)
    default_planning = (cfg.num_samples, cfg.resolved_iterations(action_dim), cfg.horizon) == (
        512,
        6,
        3,
    )
    states = cfg.obs == "state"  # the reference figures are from states
    if reference and device.type == "cpu" and default_planning and cfg.batch_size == 256 and states:
        result["reference_update_ms"], result["reference_plan_ms"] = reference
        result["ratio_to_reference"] = round(step_ms / sum(reference), 3)
    return result


def print_table(r: dict) -> None:
    seen = f"pixels (64x64 x 3, rendered with {r['gl']})" if r.get("obs") == "rgb" else "states"
    print(
        f"TD-MPC2 Live benchmark: {r['task']} from {seen}, {r['model_size']}M, {r['device']} "
        f"({r['device_name']}, {r['threads']} threads, compiled={r['compiled']}, bf16={r['bf16']})"
    )
    print(f"knobs: {r['knobs']}, batch {r['batch_size']}")
    ref_u, ref_p = r.get("reference_update_ms"), r.get("reference_plan_ms")
    rows = [
        ("update", r["update_ms"], r["update_gflop"], ref_u),
        ("plan", r["plan_ms"], r["plan_gflop"], ref_p),
        (
            "update + plan",
            r["update_ms"] + r["plan_ms"],
            r["update_gflop"] + r["plan_gflop"],
            ref_u + ref_p if ref_u else None,
        ),
        ("env step" + (" + render" if r.get("obs") == "rgb" else ""), r["env_step_ms"], 0.0, None),
    ]
    print(f"{'':15}{'ms':>10}{'GFLOP':>9}{'reference ms':>14}{'ratio':>8}")
    for name, ms, gflop, ref in rows:
        ref_s = f"{ref:14.1f}{ms / ref:8.2f}" if ref else f"{'-':>14}{'-':>8}"
        print(f"{name:15}{ms:10.2f}{gflop:9.2f}{ref_s}")
    print(
        f"agent steps/s: {r['agent_steps_per_s']}; achieved {r['achieved_gflop_per_s']} GFLOP/s "
        f"of a measured {r['matmul_gflop_per_s']} GFLOP/s matmul rate "
        f"({r['fraction_of_matmul_rate']:.0%}); "
        f"{r['time_over_floor']}x the floor of {r['floor_ms']} ms"
    )
    if r["compiled"]:
        graphs = "update as one graph" if r["update_one_graph"] else "update graph-broken"
        skips = "; ".join(r["cudagraph_skips"]) or "none"
        print(f"compiled: {graphs}, first call {r['first_call_s']} s; CUDA graphs skipped: {skips}")
