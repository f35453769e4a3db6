"""Command line of `launch.py bench`: its flags, and the dispatch to each benchmark. The flags
shared with training (task, model size, seed, device, every Config field) come from
workers/cli/flags.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agent.config import Config
from agent.errors import UserError
from bench.learning import learning_benchmark
from bench.pack import format_pack, pack_benchmark, parse_packs
from bench.race import race_benchmark, race_history
from bench.run import (
    live_benchmark,
    merge_benchmark,
    merge_gain_benchmark,
    merge_optimiser_benchmark,
)
from bench.self_check import format_self_check, gap_benchmark, self_check_benchmark
from bench.speed import print_table, speed_benchmark
from workers.door import (
    CliParser,
    RunSettings,
    add_common_flags,
    add_config_flags,
    apply_threads,
    check_threads,
    config_from_args,
    default_run_dir,
)

BENCH_EPILOG = """examples:
  python3 launch.py bench --model-size 5 --device cpu
  python3 launch.py bench --learning --task cartpole-swingup --model-size 1 --steps 20000
  xvfb-run -a python3 launch.py bench --viewer 2
      the window's frame rate and its cost to training with N workers (needs a display)"""


def build_bench_parser() -> argparse.ArgumentParser:
    """The flags of `launch.py bench`: the run's common ones and every Config field, then the
    benchmark's own (bench/viewer.py adds --viewer)."""
    parser = CliParser(
        prog="launch.py bench",
        usage="launch.py bench [--model-size M] [--device D] [--json] [FLAG VALUE | key=value ...]",
        description="Time a gradient update, a plan and an environment step (median of --repeats"
        " runs);\nwith the flags below: a learning curve against the published one, a merge, the "
        "live knobs' lag.",
        epilog=BENCH_EPILOG,
    )
    add_common_flags(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch threads of the timed process, 1 to the number of cores (default: torch's, "
        "one per core: the figures in BENCHMARKS.md are of an otherwise idle machine)",
    )
    parser.add_argument("--repeats", type=int, default=10, help="timed runs (median is reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first")
    parser.add_argument("--learning", action="store_true", help="learning curve vs published")
    parser.add_argument(
        "--merge", type=int, default=0, metavar="N", help="time a merge of N workers"
    )
    parser.add_argument(
        "--merge-ranks",
        default="",
        metavar="2,4",
        help="a merge through files against a gloo all-reduce among that many ranks",
    )
    parser.add_argument("--live", type=int, default=0, metavar="N", help="knob lag, player cost")
    parser.add_argument(
        "--race", type=int, default=0, metavar="N", help="a race's lag per lane, promotion, cost"
    )
    parser.add_argument(
        "--remote",
        type=int,
        default=0,
        metavar="N",
        help="N workers served on loopback and watched by a connected window: delays, the "
        "link's bytes, agent steps/s with and without (--seconds, --rounds)",
    )
    parser.add_argument(
        "--serve-attack",
        type=int,
        default=0,
        metavar="N",
        help="a run of 2 workers served on loopback, with N half-open connections from another "
        "process and without: the token holder's request times, the server's threads, agent "
        "steps/s (--seconds, --rounds)",
    )
    parser.add_argument("--pack", default="", metavar="1,2,4", help="K as one pack vs K processes")
    parser.add_argument(
        "--pack-only", action="store_true", help="time the packs alone (--pack; a GPU's case)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="alternating rounds of --repeats steps (--pack), or of both runs (--remote)",
    )
    parser.add_argument(
        "--self-check",
        type=int,
        default=0,
        metavar="K",
        help="the start-up self-check of a process of K workers (a pack when K > 1): the fast "
        "path it chooses, why, and its time",
    )
    parser.add_argument(
        "--gaps",
        type=int,
        default=0,
        metavar="N",
        help="with --self-check: the largest gap of each compared value over N check seeds",
    )
    parser.add_argument(
        "--race-table",
        default=None,
        metavar="RUN_DIR",
        help="the race table of a run as it stood at the minutes --at gives, and at the end",
    )
    parser.add_argument(
        "--at", default="5,10,20", metavar="5,10,20", help="minutes into the race (--race-table)"
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="phase length (--live)")
    parser.add_argument("--merge-gain", default="", metavar="1,2,4", help="steps to --threshold")
    parser.add_argument("--threshold", type=float, default=550.0, help="eval return (--merge-gain)")
    parser.add_argument(
        "--merge-every",
        type=int,
        default=RunSettings.merge_every,
        help="agent steps (--merge-gain, --remote)",
    )
    parser.add_argument(
        "--merge-optimiser",
        type=int,
        default=0,
        metavar="STEPS",
        help="Adam moments at a merge: 2 workers train STEPS apart, then each choice is compared",
    )
    parser.add_argument(
        "--updates-after-merge", type=int, default=100, help="updates compared (--merge-optimiser)"
    )
    parser.add_argument("--steps", type=int, default=None, help="agent steps (with --learning)")
    parser.add_argument("--run-dir", default=None, help="run directory (with --learning)")
    add_config_flags(parser)
    return parser


def run_bench(args: argparse.Namespace, cfg: Config) -> int:
    """Run the benchmark the flags choose (the first mode flag given wins), print its result."""
    if args.race_table:
        minutes = [float(m) for m in args.at.split(",") if m.strip()]
        print(race_history(args.race_table, minutes))
        return 0
    if args.learning:
        result = learning_benchmark(cfg, args.run_dir)
        if args.json:
            print(json.dumps(result))
            return 0
        print(f"learning curve of {cfg.task}: run directory {result['run_dir']}")
        if not result["comparison"]:
            print("(no published curve for this task; evaluations:)")
            for step, ret in result["evals"]:
                print(f"  agent step {step:>8}: return {ret:.1f}")
        for row in result["comparison"]:
            print(
                f"  agent step {row['agent_step']:>8} (env {row['env_step']:>8}): return "
                f"{row['return']:>7.1f}  published {row['published']:>7.1f}  ratio {row['ratio']}"
            )
        return 0
    if args.self_check and args.gaps:
        print(
            json.dumps(
                gap_benchmark(cfg, args.self_check, args.gaps), indent=None if args.json else 2
            )
        )
        return 0
    if args.self_check:
        result = self_check_benchmark(cfg, args.self_check)
        print(json.dumps(result) if args.json else format_self_check(result))
        return 0 if result["sound"] else 1
    if args.merge_gain:
        counts = [int(c) for c in args.merge_gain.split(",")]
        root = args.run_dir or str(default_run_dir(f"merge-gain-{cfg.task}"))
        result = merge_gain_benchmark(cfg, counts, args.threshold, args.merge_every, root)
        Path(root).mkdir(parents=True, exist_ok=True)
        (Path(root) / "merge-gain.json").write_text(json.dumps(result, indent=2))
        print(json.dumps(result, indent=None if args.json else 2))
        return 0
    if args.merge_optimiser:
        result = merge_optimiser_benchmark(cfg, args.merge_optimiser, args.updates_after_merge)
        print(json.dumps(result, indent=None if args.json else 2))
        return 0
    if args.race:
        root = args.run_dir or str(default_run_dir(f"race-{cfg.task}"))
        result = race_benchmark(cfg, args.race, args.seconds, root)
        print(json.dumps(result, indent=None if args.json else 2))
        return 0
    if args.serve_attack:
        from bench.link.serve_attack import serve_attack_benchmark

        root = args.run_dir or str(default_run_dir(f"serve-attack-{cfg.task}"))
        result = serve_attack_benchmark(cfg, args.serve_attack, 2, args.seconds, root, args.rounds)
        print(json.dumps(result, indent=None if args.json else 2))
        return 0
    if args.remote:
        from bench.link.remote import remote_benchmark

        root = args.run_dir or str(default_run_dir(f"remote-{cfg.task}"))
        result = remote_benchmark(
            cfg, args.remote, args.merge_every, args.seconds, root, args.rounds
        )
        print(json.dumps(result, indent=None if args.json else 2))
        return 0
    if args.live:
        root = args.run_dir or str(default_run_dir(f"live-{cfg.task}"))
        result = live_benchmark(cfg, args.live, args.seconds, root)
        print(json.dumps(result, indent=None if args.json else 2))
        return 0
    if args.pack:
        packs = parse_packs(args.pack)
        result = pack_benchmark(
            cfg,
            packs,
            args.repeats,
            args.warmup,
            args.threads,
            processes=not args.pack_only,
            rounds=args.rounds,
        )
        print(json.dumps(result) if args.json else format_pack(result))
        return 0
    if args.merge_ranks:
        from bench.distributed import distributed_merge_benchmark, format_distributed

        ranks = [int(n) for n in args.merge_ranks.split(",")]
        result = distributed_merge_benchmark(cfg, ranks, args.repeats)
        print(json.dumps(result) if args.json else format_distributed(result))
        return 0
    if args.merge:
        result = merge_benchmark(cfg, args.merge, args.repeats)
        print(
            json.dumps(result)
            if args.json
            else f"merge of {result['workers']} workers, {cfg.model_size}M "
            f"({result['floats_merged']:,} floats): {result['merge_ms']} ms per merge; by rule: "
            + ", ".join(f"{name} {ms} ms" for name, ms in result["rules_ms"].items())
        )
        return 0
    result = speed_benchmark(cfg, args.repeats, args.warmup)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


def main(argv: list[str]) -> int:
    """`launch.py bench ...`: argv as launch.py has it, `bench` first. 2 after a bad flag value
    (a line on stderr), 130 when interrupted."""
    try:
        args = build_bench_parser().parse_args(argv[1:])
        check_threads(args.threads)
        if args.threads:
            apply_threads(args.threads)
        return run_bench(args, config_from_args(args))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
