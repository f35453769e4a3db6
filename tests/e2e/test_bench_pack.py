"""`launch.py bench --pack`: a pack of K workers in one process against K lone processes."""

import json

import pytest
import torch
from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

from agent.errors import UserError
from bench import pack as bench_pack
from bench.cli import main
from bench.graph_skips import cudagraph_skips

TINY = (
    "--task cartpole-balance --model-size 1 --device cpu --enc-dim 32 --mlp-dim 64 "
    "--latent-dim 32 --batch-size 32 --num-samples 64 --num-elites 8 --num-pi-trajs 4 "
    "--iterations 2 --episode-length 50"
).split()


def test_pack_against_processes_reports_each_pack_size(capsys):
    """A pack of K in one spawned process against K lone spawned processes, over 2 rounds: only
    real processes show the timings and each side's list of skipped CUDA graphs coming back from
    them."""
    argv = ["bench", "--pack", "1,2", "--repeats", "2", "--warmup", "1", "--threads", "1"]
    assert main([*argv, "--rounds", "2", "--json", *TINY]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["model_size"], result["device"], result["repeats"]) == (1, "cpu", 2)
    assert result["rounds"] == 2
    assert [r["pack"] for r in result["packs"]] == [1, 2]
    for row in result["packs"]:
        assert "pack_error" not in row and "processes_error" not in row
        for side in ("pack", "processes"):
            assert row[f"{side}_steps_per_s"] > 0
            assert min(row[f"{side}_{f}"] for f in ("update_ms", "plan_ms", "env_ms")) > 0
        # The median of the rounds' ratios: of two rounds, their mean.
        low, high = row["ratio_range"]
        assert low <= row["ratio"] <= high
        assert row["ratio"] == pytest.approx((low + high) / 2, abs=0.002)
        assert row["pack_threads"] == row["process_threads"] == 1
        # Nothing compiled on a CPU: no CUDA graph could be skipped (the list came back from
        # the spawned processes).
        assert row["pack_cudagraph_skips"] == row["processes_cudagraph_skips"] == []


def test_packs_alone_are_compared_with_one_worker(capsys):
    """--pack-only: each pack timed in its own spawned process and compared with one worker; only
    a real run of the processes shows the pack side works without the lone side."""
    argv = ["bench", "--pack", "1,2", "--pack-only", "--repeats", "2", "--warmup", "1"]
    assert main([*argv, "--threads", "1", *TINY]) == 0
    out = capsys.readouterr().out
    assert "not timed (--pack-only)" in out and "1.0x one worker" in out
    assert "K=2:" in out and "x one worker" in out.splitlines()[-1]


def test_a_pack_out_of_memory_is_a_line_not_a_crash(tiny_cfg, monkeypatch):
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")
    assert bench_pack.failure(oom, 16) == (
        "pack of 16 does not fit: CUDA out of memory. Tried to allocate 2.00 GiB"
    )
    assert bench_pack.failure(ValueError("bad"), 2) == "ValueError: bad"
    lone = {"steps_per_s": 3.0, "env_ms": 1.0, "plan_ms": 2.0, "update_ms": 3.0}

    def compare(cfg, sides, *args):  # the pack's process failed, the lone ones ran
        assert [len(groups) for groups, _ in sides.values()] == [1, 16]
        return {"pack": bench_pack.failure(oom, 16), "processes": [lone, lone]}

    monkeypatch.setattr(bench_pack, "_compare", compare)
    result = bench_pack.pack_benchmark(tiny_cfg, [16], repeats=1, warmup=1, threads=1)
    row = result["packs"][0]
    assert row["pack_error"].startswith("pack of 16 does not fit: CUDA out of memory")
    assert row["processes_steps_per_s"] == 3.0 and "ratio" not in row
    assert "K=16: pack of 16 does not fit" in bench_pack.format_pack(result)


def test_pack_sizes_are_checked():
    assert bench_pack.parse_packs("1,2,4") == [1, 2, 4]
    for bad in ("", "1,x", "0,2"):
        with pytest.raises(UserError, match="--pack"):
            bench_pack.parse_packs(bad)


def test_rounds_are_checked(tiny_cfg):
    with pytest.raises(UserError, match="--rounds"):
        bench_pack.pack_benchmark(tiny_cfg, [1], repeats=1, warmup=1, rounds=0)


def test_skipped_cuda_graphs_are_collected_and_reported(tiny_cfg, monkeypatch):
    with cudagraph_skips() as skips:  # what Inductor calls when a graph cannot be captured
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs (2)")
    log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to cpu device")  # after: not kept
    assert skips == ["skipping cudagraphs due to mutated inputs (2)"]

    reason = "skipping cudagraphs due to mutated inputs (2)"
    timed = {"steps_per_s": 3.0, "env_ms": 1.0, "plan_ms": 2.0, "update_ms": 3.0}
    monkeypatch.setattr(
        bench_pack,
        "_compare",
        lambda *args: {"pack": [{**timed, "cudagraph_skips": [reason]}], "processes": [timed]},
    )
    result = bench_pack.pack_benchmark(tiny_cfg, [2], repeats=1, warmup=1, threads=1)
    assert result["packs"][0]["pack_cudagraph_skips"] == [reason]
    assert result["packs"][0]["processes_cudagraph_skips"] == []
    assert f"CUDA graphs skipped: {reason}" in bench_pack.format_pack(result)


def test_bench_self_check_reports_the_verdict_and_its_time(capsys):
    """`bench --self-check K`: what .ci/gpu-bench.sh prints first."""
    assert main(["bench", "--self-check", "2", "--json", "--threads", "1", *TINY]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["workers"], result["device"], result["sound"]) == (2, "cpu", True)
    assert result["path"] == "eager" and result["compile_seconds"] == 0.0
    assert result["seconds"] >= result["beyond_compile_seconds"] >= 0
    assert result["line"].startswith("fast path: eager, a pack of 2 on threads, ")
    assert main(["bench", "--self-check", "1", "--no-bf16", *TINY]) == 0
    text = capsys.readouterr().out
    assert text.startswith("self-check SOUND on cpu (cpu), 1M cartpole-balance, 1 worker(s): ")
    assert "eager float32 is the plain path (nothing to compare)" in text
