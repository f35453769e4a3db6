"""How the window gets a run: from the command line at start-up, or from its own dialogs.

Each function validates its input at once (bad input: a UserError with one clear message) and
returns a callable that the controller thread calls to create, resume or attach the run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from workers.cli.headless import demo_requested
from workers.cli.new_run import NewRun, check_run_flags, checked, default_run_dir, new_run_from_args
from workers.cli.presets import CPU_PLANNING, Preset, cuda_available, demo_preset, preset_config
from workers.run.owner import Run, RunSettings
from workers.rundir.lanes import CONTROL, Lane, parse_lane, workers_for


def initial_run(args: argparse.Namespace) -> Callable[[], Run]:
    """What creates the run the window opens on, from launch.py's flags. The flags are checked
    now; the run directory is written only when the returned callable is called."""
    if args.attach:
        Run.attach(args.attach)  # checks the directory; reads only
        return lambda: Run.attach(args.attach)
    if args.resume:
        check_run_flags(args)
        return lambda: Run.resume(args.resume, steps=args.steps)
    preset = demo_preset(args.device) if demo_requested(args) else None
    default = preset.workers if preset else (4 if cuda_available() else 2)
    return new_run_from_args(args, preset, default).create


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
    lane, lanes apart by ';'; workers=N and merge=off among them) are checked now. A control
    worker is one more lane, of one worker that never merges."""
    overrides = dict(CPU_PLANNING) if cpu_planning else {}
    preset = Preset(task, model_size, workers, overrides, merge_every)
    cfg = preset_config(preset, device=device)
    race = [parse_lane(text) for text in lanes.split(";")] if lanes.strip() else []
    if control_worker:
        race = [*(race or [Lane()]), CONTROL]
    sized = workers_for(race) if race else None
    settings = RunSettings(
        workers=workers + (1 if control_worker else 0) if sized is None else sized,
        merge_every=merge_every,
        pack=0,  # Run.create picks: a pack per GPU with CUDA, one process per worker on a CPU
    )
    path = Path(run_dir) if run_dir else default_run_dir(task)
    return checked(NewRun(path, cfg, settings, race or None)).create


def resume_run(path: str) -> Callable[[], Run]:
    return lambda: Run.resume(path)


def attach_run(path: str) -> Callable[[], Run]:
    return lambda: Run.attach(path)
