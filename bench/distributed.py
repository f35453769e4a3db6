"""Benchmark: a merge through files against one over torch.distributed (gloo all-reduce), for
the same model and the same number of workers, side by side in one run."""

from __future__ import annotations

import dataclasses
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agent.config import Config
from bench.run import agent_for, merge_benchmark
from workers.merging.collective import DistributedMergeBackend, init_group


def _model_state(cfg: Config) -> dict[str, torch.Tensor]:
    state = agent_for(cfg).model_state()
    return {k: v.detach() for k, v in state.items() if v.is_floating_point()}


def _rank(rank: int, ranks: int, port: int, cfg: dict, repeats: int, results) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    state = _model_state(Config(**cfg))
    init_group("cpu", timeout_s=300)
    try:
        backend = DistributedMergeBackend(list(range(ranks)), ranks, "cpu")
        times = []
        for r in range(repeats + 2):  # two untimed rounds first
            dist.barrier()
            start = time.perf_counter()
            backend.merge(r, state, (rank,), step=r)
            times.append((time.perf_counter() - start) * 1000)
        if rank == 0:
            results.put(statistics.median(times[2:]))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def distributed_merge_benchmark(cfg: Config, rank_counts: list[int], repeats: int) -> dict:
    """Median ms of one merge round of `cfg`'s model for each number of workers: through the
    run directory's files (one worker's cost, the others' files ready) and as a gloo
    all-reduce among that many ranks on this machine (one process each)."""
    cfg = dataclasses.replace(cfg, device="cpu")
    floats = sum(t.numel() for t in _model_state(cfg).values())
    ctx, rows = mp.get_context("spawn"), []
    for ranks in rank_counts:
        results = ctx.Queue()
        args = (ranks, _free_port(), dataclasses.asdict(cfg), repeats, results)
        procs = [ctx.Process(target=_rank, args=(r, *args)) for r in range(ranks)]
        for p in procs:
            p.start()
        gloo_ms = results.get(timeout=600)
        for p in procs:
            p.join()
        files_ms = merge_benchmark(cfg, ranks, repeats)["merge_ms"]
        rows.append({"workers": ranks, "files_ms": files_ms, "gloo_ms": round(gloo_ms, 1)})
    return {"model_size": cfg.model_size, "floats_merged": floats, "rows": rows}


def format_distributed(result: dict) -> str:
    lines = [
        f"merge of the {result['model_size']}M model ({result['floats_merged']:,} floats), "
        "median ms per round",
        "workers | files (run directory) | gloo all-reduce (one rank each)",
    ]
    for row in result["rows"]:
        lines.append(f"{row['workers']:7} | {row['files_ms']:21} | {row['gloo_ms']}")
    return "\n".join(lines)
