"""How the window gets a run: from the command line at start-up, or from its own dialogs.

Each function validates its input at once (bad input: a UserError with one clear message) and
returns a callable that the controller thread calls to create, resume or attach the run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from workers.cli.headless import demo_requested
from workers.cli.new_run import (
    check_run_flags,
    config_from_args,
    default_run_dir,
    lanes_from_args,
    settings_from_args,
)
from workers.cli.presets import (
    CPU_PLANNING,
    Preset,
    cuda_available,
    demo_preset,
    preset_config,
)
from workers.run.owner import Run, RunSettings
from workers.run.race import check_race
from workers.run.start_weights import read_start_weights
from workers.rundir.lanes import parse_lane


def initial_run(args: argparse.Namespace) -> Callable[[], Run]:
    """What creates the run the window opens on, from launch.py's flags. The flags are checked
    now; the run directory is written only when the returned callable is called."""
    if args.attach:
        Run.attach(args.attach)  # checks the directory; reads only
        return lambda: Run.attach(args.attach)
    check_run_flags(args)
    if args.resume:
        return lambda: Run.resume(args.resume, steps=args.steps)
    preset = demo_preset(args.device) if demo_requested(args) else None
    cfg = config_from_args(args, preset)
    if args.workers is not None:
        workers = args.workers
    else:
        workers = preset.workers if preset else (4 if cuda_available() else 2)
    settings = settings_from_args(args, workers, preset)
    path = args.run_dir or default_run_dir(cfg.task)
    if args.load:
        read_start_weights(args.load, cfg)  # a bad file is refused now, before the window opens
    lanes = lanes_from_args(args)
    return lambda: Run.create(path, cfg, settings, start_weights=args.load, lanes=lanes)


def new_run(
    task: str,
    model_size: int,
    workers: int,
    merge_every: int,
    control_worker: bool,
    device: str,
    run_dir: str | None,
    cpu_planning: bool,
    lanes: str = "",
) -> Callable[[], Run]:
    """A new run chosen in the window's dialog; the config and the lanes (KEY=VALUE,... per
    lane, lanes apart by ';') are checked now."""
    overrides = dict(CPU_PLANNING) if cpu_planning else {}
    preset = Preset(task, model_size, workers, overrides, merge_every)
    cfg = preset_config(preset, device=device)
    settings = RunSettings(
        workers=workers + (1 if control_worker else 0),
        merge_every=merge_every,
        control_worker=control_worker,
        pack=0,  # Run.create picks: a pack per GPU with CUDA, one process per worker on a CPU
    )
    path = Path(run_dir) if run_dir else default_run_dir(task)
    race = [parse_lane(text) for text in lanes.split(";")] if lanes.strip() else None
    if race:
        check_race(settings, len(race))
    return lambda: Run.create(path, cfg, settings, lanes=race)


def resume_run(path: str) -> Callable[[], Run]:
    return lambda: Run.resume(path)


def attach_run(path: str) -> Callable[[], Run]:
    return lambda: Run.attach(path)
