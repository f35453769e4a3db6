"""`launch.py bench --pack 1,2,4`: aggregate agent steps/s of K workers trained as one pack in
one process against K processes each training a lone agent, side by side for each K.

A timed step is what training does once warm: every worker's env step, one plan and one
update (steps_per_update 1) on a buffer already holding a few episodes, so seeding and
pretraining are left out. The pack runs in a spawned process of its own, as in a real run (a
pack of 1 in the parent measured 0.76x the same work in a fresh process). The K processes wait
for each other before their timed loop and keep stepping until the last one has finished it, so
each competes with all the others for the whole of its timing. The two sides stay up and are
timed in alternating rounds: on a shared machine one run of each measured the same work
(K = 1) anywhere from 1.01x to 1.23x. Over 300 lines because the two sides' processes, their
lockstep and the alternating rounds are one protocol.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from agent.agent import TDMPC2, resolve_device
from agent.config import Config
from agent.envs import make_vector_env
from agent.errors import UserError
from bench.graph_skips import cudagraph_skips
from bench.speed import filled_buffer
from workers.host.threads import apply_threads, available_cores

PROCESS_TIMEOUT_S = 600.0  # a stuck process fails the comparison instead of hanging it


def parse_packs(spec: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (UserError: one line)."""
    try:
        packs = [int(k) for k in spec.split(",")]
    except ValueError:
        packs = []
    if not packs or min(packs) < 1:
        raise UserError(f"--pack takes pack sizes like 1,2,4, got {spec!r}")
    return packs


class _Loop:
    """The envs, pack agent and filled buffers of len(seeds) workers, stepped as training does."""

    def __init__(self, cfg: Config, seeds: list[int]):
        n = cfg.num_envs
        env_seeds = [s + i for s in seeds for i in range(n)]
        self.env = make_vector_env(
            cfg.task, len(env_seeds), 0, cfg.action_repeat, cfg.episode_length, seeds=env_seeds
        )
        obs_dim = self.env.single_observation_space.shape[0]
        action_dim = self.env.single_action_space.shape[0]
        self.agent = TDMPC2(cfg, obs_dim, action_dim, seeds=seeds)
        self.buffers = [
            filled_buffer(replace(cfg, seed=s), obs_dim, action_dim, self.agent.device)
            for s in seeds
        ]
        self.shape = (len(seeds), n, -1)
        self.obs, _ = self.env.reset()
        self.action = np.zeros((len(env_seeds), action_dim), np.float32)
        self.t0 = True

    def step(self) -> tuple[float, float, float]:
        """One env step of every worker, a plan and an update: their seconds."""
        start = time.perf_counter()
        self.obs, *_ = self.env.step(self.action)
        env_done = time.perf_counter()
        obs = torch.from_numpy(self.obs).float().view(self.shape)
        self.action = self.agent.act(obs, t0=self.t0).cpu().numpy().reshape(len(self.obs), -1)
        self.t0 = False
        planned = time.perf_counter()
        samples = [b.sample() for b in self.buffers]
        self.agent.update(tuple(torch.stack(x) for x in zip(*samples)))
        if self.agent.device.type == "cuda":  # the update is queued, not done, until then
            torch.cuda.synchronize(self.agent.device)
        return env_done - start, planned - env_done, time.perf_counter() - planned

    def close(self) -> None:
        self.env.close()


def _timed(loop: _Loop, repeats: int) -> dict:
    start = time.perf_counter()
    phases = [loop.step() for _ in range(repeats)]
    wall = time.perf_counter() - start
    env_s, plan_s, update_s = (statistics.median(p) * 1000 for p in zip(*phases))
    steps = repeats * loop.shape[0]
    return {
        "steps_per_s": steps / wall,
        "env_ms": round(env_s, 3),
        "plan_ms": round(plan_s, 3),
        "update_ms": round(update_s, 3),
    }


@dataclass(frozen=True)
class _Sync:
    """What the processes of one side share: the start barrier, the count of those timed in
    this round, the queue of their results."""

    size: int
    barrier: Any
    done: Any
    results: Any


def _process(
    cfg: Config, seeds: list[int], threads: int, warmup: int, side: _Sync, commands
) -> None:
    """One process of the comparison (a pack, or one lone worker of K): warms up, then is timed
    for each round its side is sent. Both sides run in fresh spawned processes, so neither has
    the parent's state."""
    try:
        apply_threads(threads)
        loop = _Loop(cfg, seeds)
        with cudagraph_skips() as skips:  # compiling happens in the warm-up
            for _ in range(warmup):
                loop.step()
        side.results.put({"ready": True, "cudagraph_skips": skips})
        while (repeats := commands.get(timeout=PROCESS_TIMEOUT_S)) > 0:
            side.barrier.wait(timeout=PROCESS_TIMEOUT_S)
            result = _timed(loop, repeats)
            with side.done.get_lock():
                side.done.value += 1
            while side.done.value < side.size:  # keep the load on until all are timed
                loop.step()
            side.results.put(result)
        loop.close()
    except Exception as err:  # reported by the parent; the others must not wait for this one
        side.barrier.abort()
        with side.done.get_lock():
            side.done.value += 1
        side.results.put({"error": failure(err, len(seeds))})


def failure(err: Exception, workers: int) -> str:
    """One line for a process of the comparison that failed (out of memory: the pack size)."""
    first = str(err).splitlines()[0][:200] if str(err) else ""
    if "out of memory" in first.lower():
        return f"pack of {workers} does not fit: {first}"
    return f"{type(err).__name__}: {first}"


class _Side:
    """One side of the comparison: a process per group of seeds (one group of K: a pack; K
    groups of one: K lone workers), started once and timed in rounds, all of its processes
    together, while the other side waits."""

    def __init__(self, ctx, cfg: Config, groups: list[list[int]], threads: int, warmup: int):
        size = len(groups)
        self.sync = _Sync(size, ctx.Barrier(size), ctx.Value("i", 0), ctx.Queue())
        self.commands = [ctx.Queue() for _ in groups]
        self.procs = [
            ctx.Process(target=_process, args=(cfg, seeds, threads, warmup, self.sync, commands))
            for seeds, commands in zip(groups, self.commands)
        ]
        for proc in self.procs:
            proc.start()
        self.error: str | None = None
        self.skips: list[str] = []  # why its compiled graphs did not replay as CUDA graphs

    def _collect(self) -> list[dict]:
        out = [self.sync.results.get(timeout=PROCESS_TIMEOUT_S) for _ in self.procs]
        self.error = self.error or next((r["error"] for r in out if "error" in r), None)
        return out

    def ready(self) -> None:
        """Wait until every process has warmed up (or one has failed: self.error)."""
        out = self._collect()
        self.skips = sorted({s for r in out for s in r.get("cudagraph_skips", [])})

    def round(self, repeats: int) -> dict | None:
        """Time `repeats` steps of every process at once; their steps/s summed (None after a
        failure)."""
        if self.error:
            return None
        for commands in self.commands:
            commands.put(repeats)
        out = self._collect()
        self.sync.done.value = 0  # every process has put its result: none is still stepping
        if self.error:
            return None
        return {
            "steps_per_s": sum(r["steps_per_s"] for r in out),
            **{f: statistics.median(r[f] for r in out) for f in ("env_ms", "plan_ms", "update_ms")},
            "cudagraph_skips": self.skips,
        }

    def close(self) -> None:
        for commands in self.commands:
            commands.put(0)
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


def _compare(
    cfg: Config,
    sides: dict[str, tuple[list[list[int]], int]],
    repeats: int,
    warmup: int,
    rounds: int,
) -> dict[str, list[dict] | str]:
    """{side: its rounds' results, or its error}: the sides ({name: (groups of seeds,
    threads per process)}) all started and warmed up, then timed in turn, round after round,
    so that a slow spell of a shared machine falls on both."""
    ctx = mp.get_context("spawn")
    started = {
        name: _Side(ctx, cfg, groups, threads, warmup) for name, (groups, threads) in sides.items()
    }
    try:
        for side in started.values():
            side.ready()
        timed: dict[str, list[dict]] = {name: [] for name in started}
        for _ in range(rounds):
            for name, side in started.items():
                result = side.round(repeats)
                if result:
                    timed[name].append(result)
        return {name: side.error or timed[name] for name, side in started.items()}
    finally:
        for side in started.values():
            side.close()


def pack_benchmark(
    cfg: Config,
    packs: list[int],
    repeats: int,
    warmup: int,
    threads: int | None = None,
    processes: bool = True,
    rounds: int = 3,
) -> dict:
    """For each K: K workers as one pack (all the cores) against K processes of one worker
    each (the cores shared out), timed in `rounds` alternating rounds of `repeats` steps after
    `warmup`; without `processes` the packs alone (on a GPU the baseline is the pack of 1: one
    worker). Each side's figures are the median over its rounds; the ratio is the median of the
    rounds' ratios, with their range."""
    if rounds < 1:
        raise UserError(f"--rounds takes 1 or more rounds, got {rounds}")
    cores = available_cores()
    rows = []
    for k in packs:
        per_process = threads or max(1, cores // k)
        seeds = [cfg.seed + i for i in range(k)]
        sides = {"pack": ([seeds], threads or cores)}
        if processes:
            sides["processes"] = ([[s] for s in seeds], per_process)
        timed = _compare(cfg, sides, repeats, max(1, warmup), rounds)
        timed.setdefault("processes", "not timed (--pack-only)")
        row = {"pack": k, "pack_threads": threads or cores, "process_threads": per_process}
        for name, part in timed.items():
            if isinstance(part, str):
                row[f"{name}_error"] = part
                continue
            for f in ("steps_per_s", "update_ms", "plan_ms", "env_ms"):
                row[f"{name}_{f}"] = round(statistics.median(r[f] for r in part), 3)
            row[f"{name}_cudagraph_skips"] = part[0].get("cudagraph_skips", [])
        if "pack_steps_per_s" in row and "processes_steps_per_s" in row:
            ratios = [
                a["steps_per_s"] / b["steps_per_s"]
                for a, b in zip(timed["pack"], timed["processes"])
            ]
            row["ratio"] = round(statistics.median(ratios), 3)
            row["ratio_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
        rows.append(row)
    one = next((r.get("pack_steps_per_s") for r in rows if r["pack"] == 1), None)
    for r in rows:  # the GPU target: a pack of 4 at 3.5x one worker's steps/s or more
        if one and "pack_steps_per_s" in r:
            r["vs_one_worker"] = round(r["pack_steps_per_s"] / one, 2)
    return {
        "task": cfg.task,
        "model_size": cfg.model_size,
        "device": str(resolve_device(cfg.device)),
        "compile": cfg.compile,
        "cores": cores,
        "repeats": repeats,
        "rounds": rounds,
        "warmup": max(1, warmup),
        "packs": rows,
    }


def format_pack(result: dict) -> str:
    """The human-readable table of pack_benchmark's result."""
    lines = [
        f"pack against processes: {result['task']}, {result['model_size']}M, {result['device']}, "
        f"{result['cores']} cores, {result['rounds']} alternating rounds of {result['repeats']} "
        f"timed steps after {result['warmup']}"
    ]
    for r in result["packs"]:
        k = r["pack"]
        pack = r.get("pack_error") or (
            f"{r['pack_steps_per_s']} steps/s as one pack ({r['pack_threads']} threads; per "
            f"step update {r['pack_update_ms']:.1f} ms, plan {r['pack_plan_ms']:.1f} ms, "
            f"env {r['pack_env_ms']:.1f} ms)"
        )
        procs = r.get("processes_error") or (
            f"{r['processes_steps_per_s']} as {k} process{'es' if k > 1 else ''} "
            f"({r['process_threads']} threads each)"
        )
        ratio = ""
        if "ratio" in r:
            low, high = r["ratio_range"]
            ratio = f", pack/processes {r['ratio']} (rounds {low}-{high})"
        one = f", {r['vs_one_worker']}x one worker" if "vs_one_worker" in r else ""
        lines.append(f"K={k}: {pack}; {procs}{ratio}{one}")
        if r.get("pack_cudagraph_skips"):
            lines.append(f"  CUDA graphs skipped: {'; '.join(r['pack_cudagraph_skips'])}")
    return "\n".join(lines)
