"""The flags of launch.py (every Config field is one); how they are parsed is parser.py's.

Shared by the three front doors, headless training (headless.py), the window (viewer/main.py)
and the benchmarks (bench/cli.py), so a flag means the same thing everywhere.
Over 300 lines because every flag is declared here with its help, as --help prints it."""

from __future__ import annotations

import argparse
from dataclasses import fields

from agent.config import MODEL_SIZES, Config, field_docs, make_config
from agent.knobs import knobs
from workers.cli.parser import CliParser
from workers.cli.presets import demo_preset
from workers.host.precision import bf16_by_default
from workers.rundir.settings import MAX_MERGE_TIMEOUT_S, RunSettings
from workers.showcase.replay import MODES

# Flags with their own handling (not plain Config overrides; config_from_args skips them).
SERVE_PORT = 8642  # --serve without a port
OWN_HANDLING = {"model_size", "task", "steps", "seed", "device"}
DEFAULT_TASK, DEFAULT_SIZE = "walker-walk", 5


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
    shown["bf16"] = "on" if bf16_by_default("auto") else "off"  # this machine's (precision.py)
    return shown


def _live(name: str) -> str:
    """'; live knob in [low, high]' for a knob of the table (agent/knobs.py), else ''."""
    knob = knobs().get(name)
    if knob is None:
        return ""
    return f"; live knob, {knob.bounds}" if knob.kind is bool else f"; live knob in {knob.bounds}"


def add_config_flags(parser: argparse.ArgumentParser, skip: set[str] = frozenset()) -> None:
    docs = field_docs()
    defaults = _config_defaults()
    group = parser.add_argument_group(
        "config (defaults: TD-MPC2's settings, walker-walk 5M; the window: its demo preset)"
    )
    for f in fields(Config):
        if f.name in OWN_HANDLING or f.name in skip:
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
        "--task",
        default=None,
        help="DMControl task as domain-task, or a gymnasium id (Hopper-v5; my_pkg.envs:Arm-v0 "
        f"imports my_pkg.envs first) (default: {DEFAULT_TASK})",
    )
    parser.add_argument(
        "--model-size",
        type=int,
        default=None,
        metavar="M",
        help=f"{_sizes()} million parameters (default: {DEFAULT_SIZE})",
    )
    parser.add_argument(
        "--seed", type=int, default=1, metavar="N", help="seed for networks and environments"
    )
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto: CUDA when present")


USAGE = """launch.py [--headless] [FLAG VALUE | key=value ...]
       launch.py bench [FLAG VALUE | key=value ...]   (see launch.py bench --help)
       launch.py serve RUN_DIR [--port P] [--host H] [--read-only]
       launch.py --install-desktop | --uninstall-desktop"""

EPILOG = """examples:
  python3 launch.py
      open the window and train the demo preset (on a CPU: cartpole-balance, 1M, 2 workers)
  python3 launch.py --headless --task walker-walk --model-size 5 --steps 100000
      train without a window; the same in the reference implementation's key=value style:
      python3 launch.py --headless task=walker-walk model_size=5 steps=100000
  python3 launch.py --headless --task humanoid-walk --serve
      train on this machine (a GPU server) and serve the run; on the laptop, the window:
      python3 launch.py --connect 'http://localhost:8642/?token=...' (the line it prints)
  python3 launch.py bench --model-size 1 --json
      time an update, a plan and an environment step (launch.py bench --help for more)

Every flag may also be written key=value (underscores or dashes; switches: compile=false)."""


def _sizes() -> str:
    """The model sizes as a person lists them: "1, 5, 19, 48 or 317"."""
    sizes = [str(s) for s in sorted(MODEL_SIZES)]
    return f"{', '.join(sizes[:-1])} or {sizes[-1]}"


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog="launch.py",
        usage=USAGE,
        description="TD-MPC2 Live: watch TD-MPC2 learn and tune its knobs while it runs.\n"
        "Without flags the window opens and trains a demo preset; --headless trains without it.",
        epilog=EPILOG,
    )
    parser.add_argument("--headless", action="store_true", help="train without a window")
    desktop = parser.add_argument_group("desktop menu (alone on the command line; needs no setup)")
    desktop.add_argument(
        "--install-desktop", action="store_true", help="add the program to the desktop's menu"
    )
    desktop.add_argument(
        "--uninstall-desktop", action="store_true", help="remove it from the menu again"
    )
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
        help=f"agent steps between merges (default: {RunSettings.merge_every}; the CPU demo "
        f"preset {demo_preset('cpu').merge_every}" + _live("merge_every") + ")",
    )
    multi.add_argument(
        "--control-worker",
        action="store_true",
        help="one extra worker that never merges: shorthand for a lane workers=1,merge=off "
        "(beside the run's own lane when no --lane is given)",
    )
    multi.add_argument(
        "--lane",
        action="append",
        default=None,
        metavar="KEY=VALUE[,KEY=VALUE...]",
        help="race: one lane per --lane, with these live knobs (others: the run's), workers=N "
        "(its size; lanes without one share the rest evenly) and merge=off (its workers never "
        "merge), each lane its own merge pool; e.g. --lane workers=4 --lane workers=1,merge=off "
        "(without --workers a lane without workers= gets one worker)",
    )
    multi.add_argument(
        "--replicas",
        type=int,
        default=None,
        metavar="R",
        help="race every lane R times (default 1), each copy with its own workers, seeds and "
        "merge pool, replica r of every lane on the same environment seeds; the table names a "
        "leader only when its lead holds across the replicas; e.g. --lane workers=4 --lane "
        "workers=1,merge=off --replicas 3 (15 workers; --workers, when given, counts them all)",
    )
    multi.add_argument(
        "--race-minutes",
        type=float,
        default=None,
        metavar="M",
        help="the race's length in training time (default 90): the table says which lane is "
        "ahead so far until then, and gives its verdict (a lane leads, or too close to call) "
        "once, at that time or when every racing worker has trained its --steps, if sooner; a "
        "verdict looked at every few seconds would call a race of equal lanes far more often "
        "than 5 %% of the time",
    )
    multi.add_argument(
        "--merge-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long a merge round waits for the other workers' weights before it merges "
        f"those it has (default: {RunSettings.merge_timeout_s:g}; at most "
        f"{MAX_MERGE_TIMEOUT_S:g}; a resumed run keeps its own unless given)",
    )
    multi.add_argument(
        "--checkpoint-every",
        type=int,
        default=RunSettings.checkpoint_every,
        metavar="STEPS",
        help="agent steps",
    )
    multi.add_argument(
        "--max-restarts",
        type=int,
        default=None,
        metavar="N",
        help="restart a crashed worker from the merged weights at most N times, after 2, 4, "
        f"8... s (default: {RunSettings.max_restarts}; 0: never; a resumed run keeps its own "
        "unless given)",
    )
    multi.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a stopped run")
    parser.add_argument(
        "--attach", default=None, metavar="RUN_DIR", help="window: watch a run that is going on"
    )
    remote = parser.add_argument_group("another machine (the run served, a window connected)")
    remote.add_argument(
        "--serve",
        type=int,
        nargs="?",
        const=SERVE_PORT,
        default=None,
        metavar="PORT",
        help=f"headless: serve the run to windows elsewhere (port {SERVE_PORT} unless given), "
        "on 127.0.0.1 unless --serve-host; prints the line to type on the laptop",
    )
    remote.add_argument(
        "--serve-host",
        default="127.0.0.1",
        metavar="HOST",
        help="the address to serve on (0.0.0.0: every network; the token is then the only lock)",
    )
    remote.add_argument(
        "--read-only", action="store_true", help="serve: windows watch but take no command"
    )
    remote.add_argument(
        "--new-token",
        action="store_true",
        help="serve: new tokens for the run (the old ones stop working)",
    )
    remote.add_argument(
        "--connect",
        default=None,
        metavar="URL",
        help="window: watch and steer a served run (the address the server printed; the "
        "token: asked for, or $TDMPC2_LIVE_TOKEN, --token-file, or ?token= in the URL)",
    )
    remote.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="with --connect: a file holding the token (kept out of ps and the shell history)",
    )
    remote.add_argument(
        "--mirror",
        default=None,
        metavar="DIR",
        help="with --connect: where the run's copy goes (default: RUN@HOST-PORT in "
        "~/.cache/tdmpc2-live/connected)",
    )
    parser.add_argument(
        "--viewport",
        choices=MODES,
        default="auto",
        help="window: the viewport plays the policy live, replays the newest finished episode "
        "at real speed, or (auto) replays on a CPU where live play runs under half real speed",
    )
    add_config_flags(parser)
    return parser
