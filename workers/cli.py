"""Command line of launch.py: headless training and the benchmark. Every Config field is a flag."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import fields
from pathlib import Path

from agent.config import Config, field_docs, make_config
from agent.envs import resolve_task
from agent.errors import UserError
from workers.presets import Preset, preset_config

# Flags with their own handling (not plain Config overrides).
_SPECIAL = {"model_size", "task", "steps", "seed", "device"}
DEFAULT_TASK, DEFAULT_SIZE = "walker-walk", 5


def _add_config_flags(parser: argparse.ArgumentParser, skip: set[str] = frozenset()) -> None:
    docs = field_docs()
    group = parser.add_argument_group("config (defaults: the TD-MPC2 5M single-task settings)")
    for f in fields(Config):
        if f.name in _SPECIAL or f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = {"int": int, "float": float, "str": str}.get(f.type)
        if f.type == "bool":
            group.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=docs[f.name]
            )
        else:
            group.add_argument(
                flag, type=kind, default=None, metavar=f.type.upper(), help=docs[f.name]
            )


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default=None, help=f"DMControl task (default {DEFAULT_TASK})")
    parser.add_argument(
        "--model-size", type=int, default=None, help=f"1, 5, 19 or 48 (default {DEFAULT_SIZE})"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch.py",
        description="TD-MPC2 Live: watch TD-MPC2 learn and tune its knobs while it runs. "
        "Without flags the window opens and trains a demo preset; --headless trains without it.",
    )
    parser.add_argument("--headless", action="store_true", help="train without a window")
    _add_common(parser)
    parser.add_argument("--steps", type=int, default=None, help="agent steps to train")
    parser.add_argument("--run-dir", default=None, help="run directory (default runs/TASK-TIME)")
    parser.add_argument("--load", default=None, help="start from the weights in this file")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    logs = parser.add_argument_group("logs (metrics.jsonl / worker-K.jsonl and eval CSV always)")
    logs.add_argument(
        "--no-tensorboard",
        action="store_true",
        help="write no TensorBoard event files (default: written into RUN_DIR/tb when installed)",
    )
    logs.add_argument(
        "--wandb",
        action="store_true",
        help="also log to Weights & Biases (needs the wandb package; offline when not logged in)",
    )
    multi = parser.add_argument_group("merged-weight workers")
    multi.add_argument("--workers", type=int, default=None, help="worker processes (N >= 1)")
    multi.add_argument(
        "--merge-every", type=int, default=None, help="agent steps between merges (2500)"
    )
    multi.add_argument(
        "--control-worker", action="store_true", help="one extra worker never merges"
    )
    multi.add_argument("--checkpoint-every", type=int, default=10_000, help="agent steps")
    multi.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a stopped run")
    parser.add_argument(
        "--attach", default=None, metavar="RUN_DIR", help="window: watch a run that is going on"
    )
    _add_config_flags(parser)
    return parser


def build_bench_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch.py bench", description="time update, plan, env step"
    )
    _add_common(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs (median is reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first")
    parser.add_argument("--learning", action="store_true", help="learning curve vs published")
    parser.add_argument(
        "--merge", type=int, default=0, metavar="N", help="time a merge of N workers"
    )
    parser.add_argument("--live", type=int, default=0, metavar="N", help="knob lag, player cost")
    parser.add_argument("--seconds", type=float, default=60.0, help="phase length (--live)")
    parser.add_argument("--merge-gain", default="", metavar="1,2,4", help="steps to --threshold")
    parser.add_argument("--threshold", type=float, default=550.0, help="eval return (--merge-gain)")
    parser.add_argument("--merge-every", type=int, default=2500, help="agent steps (--merge-gain)")
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
    _add_config_flags(parser)
    return parser


def demo_requested(args: argparse.Namespace) -> bool:
    """Neither a task nor a model size given: the window starts its demo preset."""
    return args.task is None and args.model_size is None


def config_from_args(args: argparse.Namespace, preset: Preset | None = None) -> Config:
    """The config the flags ask for: defaults (walker-walk, 5M) or `preset`, flags on top."""
    overrides = {
        f.name: getattr(args, f.name)
        for f in fields(Config)
        if f.name not in _SPECIAL and getattr(args, f.name, None) is not None
    }
    overrides.update(seed=args.seed, device=args.device)
    if getattr(args, "steps", None) is not None:
        overrides["steps"] = args.steps
    if preset is not None:
        cfg = preset_config(preset, **overrides)
    else:
        cfg = make_config(
            args.model_size or DEFAULT_SIZE, task=args.task or DEFAULT_TASK, **overrides
        )
        resolve_task(cfg.task)  # an unknown name fails now (preset_config checks its own)
    return cfg


def default_run_dir(task: str) -> Path:
    return Path("runs") / f"{task}-{time.strftime('%Y%m%d-%H%M%S')}"


def _raise_keyboard_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run_workers(args: argparse.Namespace) -> int:
    from workers.run import Run, RunSettings

    if args.resume:
        run = Run.resume(args.resume, steps=args.steps)
    else:
        cfg = config_from_args(args)
        workers = args.workers + (1 if args.control_worker else 0)
        settings = RunSettings(
            workers=workers,
            merge_every=2500 if args.merge_every is None else args.merge_every,
            control_worker=args.control_worker,
            checkpoint_every=args.checkpoint_every,
            tensorboard=not args.no_tensorboard,
            wandb=args.wandb,
        )
        run = Run.create(args.run_dir or default_run_dir(cfg.task), cfg, settings)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    print(
        f"{run.settings.workers} workers on {run.cfg.task}; run directory {run.path}",
        file=sys.stderr,
    )
    run.start()
    interrupted, ticks = False, 0
    try:
        while any(w["alive"] for w in run.progress()):
            time.sleep(0.5)  # requests from an attached window are served within this
            if _serve_requests(run):  # a stop asked for is not an interruption: exit code 0
                print("stopping, as an attached window asked...", file=sys.stderr)
                run.stop()
                break
            ticks += 1
            if ticks % 4:
                continue
            for index in run.dead_workers():
                print(f"worker {index} died; the others go on", file=sys.stderr)
            if not args.quiet:
                line = "  ".join(
                    f"w{w['worker']} {w['state']} {int(w['step'])} ({w['steps_per_s']:.1f}/s)"
                    for w in run.progress()
                )
                print(line, file=sys.stderr)
    except KeyboardInterrupt:
        interrupted = True
        print("stopping: each worker writes a checkpoint...", file=sys.stderr)
        run.stop()
    print(f"run directory {run.path}; continue with --resume {run.path}", file=sys.stderr)
    return 130 if interrupted else 0


def _serve_requests(run) -> bool:
    """Serve an attached window's requests, saying so; True when one asked to stop."""
    stop = False
    from workers.requests import describe

    for request in run.serve_requests():
        print(f"attached window asked: {describe(request)}", file=sys.stderr)
        stop = stop or request["action"] == "stop"
    return stop


def run_headless(args: argparse.Namespace) -> int:
    from workers.exporters import attach_exporters, require_wandb
    from workers.rundir import RunDir
    from workers.trainer import Trainer

    cfg = config_from_args(args)
    if args.wandb:
        require_wandb()  # before anything is written
    run_dir = RunDir.create(args.run_dir or default_run_dir(cfg.task))
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    trainer = Trainer(cfg, run_dir, load_weights=args.load, progress=not args.quiet)
    attach_exporters(run_dir, cfg, tensorboard=not args.no_tensorboard, wandb=args.wandb)
    print(
        f"training {cfg.task} ({cfg.model_size}M) on {trainer.agent.device}; "
        f"run directory {run_dir.path}",
        file=sys.stderr,
    )
    summary = trainer.run()
    evals = summary["eval_returns"]
    last = f", last eval return {evals[-1][1]:.1f}" if evals else ""
    word = "stopped" if summary["interrupted"] else "finished"
    print(
        f"{word} at step {summary['steps']}{last}; weights in {run_dir.weights_path}",
        file=sys.stderr,
    )
    return 130 if summary["interrupted"] else 0


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["bench"]:
            from workers.bench import run_bench

            args = build_bench_parser().parse_args(argv[1:])
            return run_bench(args, config_from_args(args))
        args = build_parser().parse_args(argv)
        if not args.headless:
            raise UserError("the window is opened by launch.py (this entry point is headless)")
        if args.attach:
            raise UserError("--attach watches a run in the window: leave out --headless")
        if args.workers is not None or args.resume:
            return run_workers(args)
        return run_headless(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
