"""Command line of launch.py: headless training. Every Config field is a flag (the benchmark's
flags, in bench/cli.py, build on the same helpers)."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import NoReturn

from agent.config import MODEL_SIZES, Config, field_docs, make_config
from agent.envs import resolve_task
from agent.errors import UserError
from agent.knobs import knobs
from workers.presets import Preset, preset_config
from workers.signals import StopSignals
from workers.threads import check_threads, choose_threads

# Flags with their own handling (not plain Config overrides).
_SPECIAL = {"model_size", "task", "steps", "seed", "device"}
DEFAULT_TASK, DEFAULT_SIZE = "walker-walk", 5


_KEY_VALUE = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)=(.*)", re.DOTALL)
_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's line breaks; adds a flag's default to its help when the help does not
    say it already and there is one worth saying (not None or False: those mean 'not given')."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "default" in text
            or default is None
            or default is False
            or default == ""
            or default == argparse.SUPPRESS
        ):
            return text
        return text + " (default: %(default)s)"


class CliParser(argparse.ArgumentParser):
    """argparse that answers bad input in one line (a did-you-mean for a mistyped flag) and also
    takes the reference implementation's `key=value` style: `model_size=5` is `--model-size 5`."""

    def __init__(self, **kwargs) -> None:
        # No prefix matching: `--step` is a typo to point out, not an abbreviation to guess at.
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(**kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace=None) -> argparse.Namespace:
        argv = translate_key_values(self, sys.argv[1:] if args is None else list(args))
        parsed, extra = self.parse_known_args(argv, namespace)
        if extra:
            self.error(_unknown_argument(self, extra[0]))
        return parsed

    def long_flags(self) -> list[str]:
        return [flag for flag in self._option_string_actions if flag.startswith("--")]


def _unknown_argument(parser: CliParser, token: str) -> str:
    if token == "bench":
        return "bench is a command of its own: launch.py bench [flags] (see launch.py bench --help)"
    if not token.startswith("-"):
        return f"unexpected argument {token!r} (flags start with --, or write key=value)"
    flag = token.split("=", 1)[0]
    close = difflib.get_close_matches(flag, parser.long_flags(), n=1)
    hint = f"did you mean {close[0]}?" if close else f"see {parser.prog} --help"
    return f"unknown flag {flag} ({hint})"


def translate_key_values(parser: CliParser, argv: list[str]) -> list[str]:
    """`key=value` arguments as the flags they stand for (underscores or dashes in the key;
    true/false for switches); an unknown key is refused with a did-you-mean."""
    actions = parser._option_string_actions
    out: list[str] = []
    value_next = False  # the previous flag takes a value: this token is it, whatever it holds
    for token in argv:
        match = None if value_next else _KEY_VALUE.fullmatch(token)
        if match is None:
            out.append(token)
            action = None if value_next else actions.get(token)
            value_next = action is not None and action.nargs != 0
            continue
        key, value = match.groups()
        flag = "--" + key.replace("_", "-")
        action = actions.get(flag)
        if action is None or isinstance(action, argparse._HelpAction):
            keys = [f[2:] for f in parser.long_flags() if f != "--help"]
            close = difflib.get_close_matches(key.replace("_", "-"), keys, n=1)
            if close and "-" not in key:  # answer in the writer's style: model_size
                close = [close[0].replace("-", "_")]
            hint = f"did you mean {close[0]}?" if close else f"see {parser.prog} --help"
            parser.error(f"unknown key {key} ({hint})")
        if action.nargs != 0:
            out.append(f"{flag}={value}")
            continue
        word = value.strip().lower()
        if word not in _TRUE | _FALSE:
            parser.error(f"{key} is a switch: write {key}=true or {key}=false, not {value!r}")
        on = word in _TRUE
        if isinstance(action, argparse.BooleanOptionalAction):
            out.append(flag if on else next(f for f in action.option_strings if f != flag))
        elif on:
            out.append(flag)  # a store_true flag; false is its default: nothing to add
    return out


def _config_defaults() -> dict[str, str]:
    """Each config field's default as --help shows it: the value of the default preset, or the
    value per model size for the fields the size sets."""
    by_size = {size: make_config(size, task=DEFAULT_TASK) for size in MODEL_SIZES}
    shown = {}
    for f in fields(Config):
        values = [getattr(cfg, f.name) for cfg in by_size.values()]
        if len(set(values)) > 1:
            sizes = ", ".join(f"{v} at {size}M" for size, v in zip(by_size, values))
            shown[f.name] = f"from --model-size: {sizes}"
            continue
        value = values[0]
        if isinstance(value, bool):
            shown[f.name] = "on" if value else "off"
        elif isinstance(value, float):
            shown[f.name] = f"{value:g}"
        else:
            shown[f.name] = str(value)
    return shown


def _live(name: str) -> str:
    """'; live knob in [low, high]' for a knob of the table (agent/knobs.py), else ''."""
    knob = knobs().get(name)
    return f"; live knob in {knob.bounds}" if knob else ""


def add_config_flags(parser: argparse.ArgumentParser, skip: set[str] = frozenset()) -> None:
    docs = field_docs()
    defaults = _config_defaults()
    group = parser.add_argument_group(
        "config (defaults: TD-MPC2's settings, walker-walk 5M; the window: its demo preset)"
    )
    for f in fields(Config):
        if f.name in _SPECIAL or f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = {"int": int, "float": float, "str": str}.get(f.type)
        # argparse %-formats help text: a literal % must be doubled.
        text = f"{docs[f.name]} (default: {defaults[f.name]}{_live(f.name)})".replace("%", "%%")
        if f.type == "bool":
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            group.add_argument(flag, type=kind, default=None, metavar=f.type.upper(), help=text)


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--task", default=None, help=f"DMControl task as domain-task (default: {DEFAULT_TASK})"
    )
    parser.add_argument(
        "--model-size",
        type=int,
        default=None,
        metavar="M",
        help=f"1, 5, 19 or 48 million parameters (default: {DEFAULT_SIZE})",
    )
    parser.add_argument(
        "--seed", type=int, default=1, metavar="N", help="seed for networks and environments"
    )
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto: CUDA when present")


USAGE = """launch.py [--headless] [FLAG VALUE | key=value ...]
       launch.py bench [FLAG VALUE | key=value ...]   (see launch.py bench --help)"""

EPILOG = """examples:
  python3 launch.py
      open the window and train the demo preset (on a CPU: cartpole-balance, 1M, 2 workers)
  python3 launch.py --headless --task walker-walk --model-size 5 --steps 100000
      train without a window; the same in the reference implementation's key=value style:
      python3 launch.py --headless task=walker-walk model_size=5 steps=100000
  python3 launch.py bench --model-size 1 --json
      time an update, a plan and an environment step (launch.py bench --help for more)

Every flag may also be written key=value (underscores or dashes; switches: compile=false)."""


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog="launch.py",
        usage=USAGE,
        description="TD-MPC2 Live: watch TD-MPC2 learn and tune its knobs while it runs.\n"
        "Without flags the window opens and trains a demo preset; --headless trains without it.",
        epilog=EPILOG,
    )
    parser.add_argument("--headless", action="store_true", help="train without a window")
    add_common_flags(parser)
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="N",
        help="agent steps to train (default: 100000; the window's demo preset: until stopped)",
    )
    parser.add_argument("--run-dir", default=None, help="run directory (default: runs/TASK-TIME)")
    parser.add_argument(
        "--load",
        default=None,
        metavar="WEIGHTS",
        help="every worker of a new run starts from these weights (a worker-K.pt, a checkpoint "
        "or merge/merged.pt of an earlier run of the same task and model size)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch threads per training process, 1 to the number of cores (default: the cores "
        "shared out between the workers, one core left free, at most 4 each)",
    )
    logs = parser.add_argument_group("logs (worker-K.jsonl and eval CSV always)")
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
    multi.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="workers, N >= 1 (default: headless 1; the window 2, or 4 with CUDA)",
    )
    multi.add_argument(
        "--pack",
        type=int,
        default=None,
        metavar="K",
        help="train K workers as one batched model in one process, merging among themselves "
        "on the device (default: with CUDA all of a GPU's workers; on the CPU 1: one process "
        "per worker)",
    )
    multi.add_argument(
        "--merge-every",
        type=int,
        default=None,
        metavar="STEPS",
        help="agent steps between merges (default: 2500; the CPU demo preset 500"
        + _live("merge_every")
        + ")",
    )
    multi.add_argument(
        "--control-worker", action="store_true", help="one extra worker never merges"
    )
    multi.add_argument(
        "--checkpoint-every", type=int, default=10_000, metavar="STEPS", help="agent steps"
    )
    multi.add_argument(
        "--max-restarts",
        type=int,
        default=None,
        metavar="N",
        help="restart a crashed worker from the merged weights at most N times, after 2, 4, "
        "8... s (default: 3; 0: never; a resumed run keeps its own unless given)",
    )
    multi.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a stopped run")
    parser.add_argument(
        "--attach", default=None, metavar="RUN_DIR", help="window: watch a run that is going on"
    )
    add_config_flags(parser)
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


def _exit_code(interrupted: bool, stops: StopSignals | None) -> int:
    """0 for a run that ended or was stopped as asked (SIGTERM, an attached window), 130
    after Ctrl+C, as shells expect of an interrupted program."""
    if not interrupted:
        return 0
    return stops.exit_code if stops is not None and stops.first is not None else 130


def run_workers(args: argparse.Namespace, stops: StopSignals | None = None) -> int:
    from workers.progress import WorkersProgress
    from workers.run import Run
    from workers.start import settings_from_args
    from workers.trainer import steps_warning
    from workers.worker import DOES_NOT_FIT

    if args.resume:
        run = Run.resume(args.resume, steps=args.steps)
        if args.threads:
            run.settings = replace(run.settings, threads_per_worker=args.threads)
        if args.max_restarts is not None:
            run.settings = replace(run.settings, max_restarts=args.max_restarts)
    else:
        cfg = config_from_args(args)
        merge_every = 2500 if args.merge_every is None else args.merge_every
        settings = settings_from_args(args, args.workers or 1, merge_every)
        path = args.run_dir or default_run_dir(cfg.task)
        run = Run.create(path, cfg, settings, start_weights=args.load)
        warning = steps_warning(run.cfg)
        if warning:
            print(warning, file=sys.stderr)
    packs = run.settings.packs
    threads = choose_threads(len(packs), run.settings.threads_per_worker or None)
    shape = "" if run.settings.pack == 1 else f" in {len(packs)} pack{'s' * (len(packs) > 1)}"
    print(
        f"{run.settings.workers} worker{'s' * (run.settings.workers > 1)}{shape} on "
        f"{run.cfg.task}; run directory {run.path}\n"
        f"{threads.describe()}",
        file=sys.stderr,
    )
    progress = WorkersProgress(run.cfg.steps, run.cfg.resolved_seed_steps, not args.quiet)
    interrupted = False
    try:
        run.start()
        while any(w["alive"] for w in run.progress()) or run.restarting:
            time.sleep(0.5)  # requests from an attached window are served within this
            if _serve_requests(run, progress.write):  # a stop asked for: exit code 0
                progress.write("stopping, as an attached window asked...")
                run.stop()
                break
            for line in run.notices():  # a worker died, restarts, a knob record refused
                progress.write(line)
            progress.update(run.progress())
        progress.update(run.progress(), force=True)
        run.check_run_dir()
        for line in run.notices():  # what the last moments brought (a vanished directory)
            progress.write(line)
    except KeyboardInterrupt:
        interrupted = True
        progress.write("stopping: each worker writes a checkpoint...")
        run.stop()
    finally:
        progress.close()
    if run.gone:  # said above; nothing to continue from where it was
        return 1
    if any(w["exitcode"] == DOES_NOT_FIT for w in run.progress()):
        return 1  # said above (the worker's line): the run cannot go on as it is
    print(f"{_summary(run, interrupted)}; continue with --resume {run.path}", file=sys.stderr)
    return _exit_code(interrupted, stops)


def _summary(run, interrupted: bool) -> str:
    """Where the run got to: its workers' step, their mean last evaluation return, the run."""
    from workers.paths import metrics_name
    from workers.records_tail import is_number, tail_records

    steps = [w["step"] for w in run.progress()]
    evals = []
    for k in run.settings.active:
        records = tail_records(run.path / metrics_name(k))
        found = [r["ret"] for r in records if r.get("kind") == "eval" and is_number(r.get("ret"))]
        evals += found[-1:]
    last = f", mean last eval return {sum(evals) / len(evals):.1f}" if evals else ""
    word = "stopped" if interrupted else "finished"
    return f"{word} at step {int(min(steps, default=0))}{last}; run directory {run.path}"


def _serve_requests(run, say: Callable[[str], None]) -> bool:
    """Serve an attached window's requests, saying so; True when one asked to stop."""
    stop = False
    from workers.requests import describe

    for request in run.serve_requests():
        say(f"attached window asked: {describe(request)}")
        stop = stop or request["action"] == "stop"
    return stop


def main(argv: list[str]) -> int:
    stops = StopSignals()
    try:
        args = build_parser().parse_args(argv)
        if not args.headless:
            raise UserError("the window is opened by launch.py (this entry point is headless)")
        if args.attach:
            raise UserError("--attach watches a run in the window: leave out --headless")
        check_threads(args.threads)
        stops.install()  # Ctrl+C and SIGTERM: a clean stop from here on
        from workers.start import check_run_flags

        check_run_flags(args)
        return run_workers(args, stops)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before training began: nothing to save
        print("interrupted", file=sys.stderr)
        return _exit_code(True, stops)
