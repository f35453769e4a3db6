"""How a run starts from the flags, written once for the command line, the window (its start-up
and its new-run dialog, whose fields are flags) and a torchrun job: a new run's config, settings
and lanes, checked before anything is written, or the run --resume names."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path

from agent.agent import resolve_device
from agent.config import Config
from agent.envs import name_task
from agent.errors import ConfigError, UserError
from agent.pack.merge_rule import collective_refusal
from workers.cli.flags import DEFAULT_SIZE, DEFAULT_TASK, OWN_HANDLING, build_parser
from workers.cli.presets import CPU_PLANNING, Preset, demo_preset, preset_config
from workers.merging.collective import COLLECTIVE_TIMEOUT_S
from workers.race.control import check_race
from workers.run.owner import Run
from workers.run.start_weights import read_start_weights
from workers.rundir.lanes import CONTROL, Lane, parse_lane, workers_for
from workers.rundir.settings import MAX_MERGE_TIMEOUT_S, RunSettings

RUNS = Path("runs")  # where runs go unless told; git ignores all of it


def demo_requested(args: argparse.Namespace) -> bool:
    """Neither a task nor a model size given: the window starts its demo preset."""
    return args.task is None and args.model_size is None


def config_from_args(args: argparse.Namespace, preset: Preset | None = None) -> Config:
    """The config the flags ask for: defaults (walker-walk, 5M) or `preset`, flags on top."""
    overrides = {
        f.name: getattr(args, f.name)
        for f in fields(Config)
        if f.name not in OWN_HANDLING and getattr(args, f.name, None) is not None
    }
    overrides.update(seed=args.seed, device=args.device)
    if getattr(args, "steps", None) is not None:
        overrides["steps"] = args.steps
    if args.task:
        overrides["task"] = args.task
    if preset is None:  # the defaults, as a preset: walker-walk 5M, TD-MPC2's settings
        preset = Preset(DEFAULT_TASK, args.model_size or DEFAULT_SIZE, 1, {})
        overrides.setdefault("steps", Config.steps)
    # (preset_config adds what the task brings where the flags say nothing: a gymnasium env's
    # action repeat, episode length and episodic mode; an unknown name fails there.)
    cfg = preset_config(preset, **overrides)
    if cfg.fast_path in ("graphs", "compile") and resolve_device(cfg.device).type != "cuda":
        raise ConfigError(
            f"--fast-path {cfg.fast_path} compiles for CUDA, and this run trains on the CPU: "
            "give auto (the self-check chooses) or eager",
            "fast_path",
        )
    return cfg


def default_run_dir(task: str) -> Path:
    return RUNS / f"{task}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_run_flags(args: argparse.Namespace) -> None:
    """Flags that contradict each other or are out of range: UserError, before anything runs."""
    if args.pack is not None and args.pack < 1:
        raise UserError(f"--pack must be at least 1, got {args.pack}")
    if args.pack is not None and args.resume:
        raise UserError("--pack is chosen when a run starts: a resumed run keeps its own")
    if args.load and args.resume:
        raise UserError("--load starts a new run: a resumed run goes on from its checkpoints")
    if args.lane and args.resume:
        raise UserError("--lane starts a race in a new run: a resumed run keeps its own lanes")
    replicas = getattr(args, "replicas", None)
    if replicas is not None:
        if replicas < 1:
            raise UserError(f"--replicas must be at least 1 (copies of every lane), got {replicas}")
        if args.resume:
            raise UserError("--replicas starts a race in a new run: a resumed run keeps its own")
        if not args.lane and not getattr(args, "control_worker", False):
            raise UserError(
                "--replicas copies a race's lanes: give two --lane or more (or --control-worker)"
            )
    minutes = getattr(args, "race_minutes", None)
    if minutes is not None:
        if not 0 < minutes < float("inf"):
            raise UserError(f"--race-minutes must be above 0 (the race's length), got {minutes}")
        if args.resume:
            raise UserError("--race-minutes times a race in a new run: a resumed run keeps its own")
        if not args.lane and not getattr(args, "control_worker", False):
            raise UserError(
                "--race-minutes times a race: give two --lane or more (or --control-worker)"
            )
    timeout = getattr(args, "merge_timeout", None)
    if timeout is not None and not 0 < timeout <= MAX_MERGE_TIMEOUT_S:
        raise UserError(
            f"--merge-timeout must be above 0 and at most {MAX_MERGE_TIMEOUT_S:g} seconds "
            f"(a merge round's wait for the other workers), got {timeout:g}"
        )
    check_remote_flags(args)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    outer = {k: getattr(args, k, None) for k in ("outer_lr", "outer_momentum")}
    refusal = torchrun and collective_refusal({k: v for k, v in outer.items() if v is not None})
    if refusal:
        raise UserError(refusal)
    if args.lane and torchrun:
        raise UserError(
            "--lane: a torchrun job does not race (its ranks merge in one all-reduce); race on "
            "one machine: launch.py --headless --workers N --lane ... --lane ..."
        )
    if timeout is not None and torchrun:
        raise UserError(
            "--merge-timeout is for workers that merge through files: a torchrun job's ranks "
            f"wait for each other in its collective, up to {COLLECTIVE_TIMEOUT_S:g} s"
        )


def check_remote_flags(args: argparse.Namespace) -> None:
    """--serve and --connect with what goes with them (UserError otherwise)."""
    serve = getattr(args, "serve", None)
    if serve is None and (
        args.read_only or args.serve_host != "127.0.0.1" or getattr(args, "new_token", False)
    ):
        raise UserError("--read-only, --serve-host and --new-token go with --serve PORT")
    if serve is not None and not 0 <= serve <= 65535:
        raise UserError(f"--serve PORT: a port is 1-65535 (0: any free one), got {serve}")
    if serve is not None and not args.headless:
        raise UserError(
            "--serve serves a headless run (--headless); to serve a window's run: launch.py "
            "serve RUN_DIR beside it"
        )
    if serve is not None and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        raise UserError(
            "--serve: a torchrun job is served by launch.py serve RUN_DIR on rank 0's machine"
        )
    if (args.mirror or getattr(args, "token_file", None)) and not args.connect:
        raise UserError("--mirror and --token-file go with --connect URL")
    if args.connect and (args.attach or args.resume):
        raise UserError("--connect opens a served run: leave out --attach and --resume")


def lanes_from_args(args: argparse.Namespace) -> list[Lane] | None:
    """Each --lane (None: no race); --control-worker adds a lane of one worker that never
    merges (beside the run's own lane when no --lane is given). ConfigError naming the lane
    and the part that is wrong."""
    lanes = []
    for n, text in enumerate(args.lane or ()):
        try:
            lanes.append(parse_lane(text))
        except ConfigError as err:
            raise ConfigError(f"--lane {text!r} (lane {n}): {err}", err.field) from None
    if getattr(args, "control_worker", False):
        lanes = [*(lanes or [Lane()]), CONTROL]
    return lanes or None


def workers_from_args(args: argparse.Namespace, lanes: list[Lane] | None, default: int) -> int:
    """The run's workers: --workers (else `default`), a control worker on top (one per
    replica); a race of --lane given without --workers takes what its lanes ask for, each lane
    its size or one worker, times the replicas."""
    replicas = getattr(args, "replicas", None) or 1
    if args.lane and lanes and args.workers is None:
        return workers_for(lanes, replicas)
    base = default if args.workers is None else args.workers
    return base + (replicas if getattr(args, "control_worker", False) else 0)


def settings_from_args(
    args: argparse.Namespace, workers: int, preset: Preset | None = None
) -> RunSettings:
    """The run settings the flags ask for, with `workers` workers. The merge frequency:
    --merge-every, else the preset's; it and the restarts, when not given, are the run's
    defaults (RunSettings: the one place each is written)."""
    merge_every = args.merge_every
    if merge_every is None and preset is not None:
        merge_every = preset.merge_every
    given = dict(merge_every=merge_every, max_restarts=args.max_restarts)
    given.update(merge_timeout_s=getattr(args, "merge_timeout", None))
    return RunSettings(
        workers=workers,
        **{name: value for name, value in given.items() if value is not None},
        checkpoint_every=args.checkpoint_every,
        tensorboard=not args.no_tensorboard,
        wandb=args.wandb,
        threads_per_worker=args.threads or 0,  # 0: workers/host/threads.py decides
        pack=args.pack or 0,  # 0: Run.create picks (a pack per GPU with CUDA)
        replicas=getattr(args, "replicas", None) or 1,
        race_minutes=getattr(args, "race_minutes", None) or RunSettings.race_minutes,
    )


@dataclass(frozen=True)
class NewRun:
    """A new run as the flags or the window's dialog ask for it: checked, nothing written
    until `create`."""

    path: Path
    cfg: Config
    settings: RunSettings
    lanes: list[Lane] | None = None
    start_weights: str | None = None

    def create(self) -> Run:
        return Run.create(
            self.path, self.cfg, self.settings, start_weights=self.start_weights, lanes=self.lanes
        )


def new_run_from_args(
    args: argparse.Namespace, preset: Preset | None = None, default_workers: int = 1
) -> NewRun:
    """The run the flags ask for (on `preset` when given), every flag checked now: the
    config, the lanes and their sizes against the workers, the start weights."""
    check_run_flags(args)
    cfg = config_from_args(args, preset)
    lanes = lanes_from_args(args)
    workers = workers_from_args(args, lanes, default_workers)
    settings = settings_from_args(args, workers, preset)
    return checked(
        NewRun(Path(args.run_dir or default_run_dir(cfg.task)), cfg, settings, lanes, args.load)
    )


def window_run_from_args(args: argparse.Namespace) -> NewRun:
    """The new run the window opens on: the demo preset when neither a task nor a model size
    is given; as many workers as the demo trains on this machine unless --workers says."""
    demo = demo_preset(args.device)
    return new_run_from_args(args, demo if demo_requested(args) else None, demo.workers)


def new_run_from_dialog(
    task: str,
    model_size: int,
    workers: int,
    merge_every: int,
    control_worker: bool,
    device: str,
    run_dir: str | None,
    cpu_planning: bool,
    lanes: str = "",
    replicas: int = 1,
    obs: str = "state",
) -> NewRun:
    """The run the window's new-run dialog asks for: the run its fields would start as flags
    (--task, --model-size, --merge-every, --control-worker, --device, --run-dir, a --lane per
    ';' in `lanes`, --replicas, --obs; every other flag at its default), training until
    stopped, with reduced planning when `cpu_planning`. `workers` is the run's count unless
    every lane gives its size (then their sum times the replicas, as with --workers left
    out)."""
    args = build_parser().parse_args([])
    vars(args).update(
        task=task,
        model_size=model_size,
        merge_every=merge_every,
        control_worker=control_worker,
        device=device,
        run_dir=run_dir,
        lane=lanes.split(";") if lanes.strip() else None,
        replicas=None if replicas == 1 else replicas,  # 1: as when the flag is left out
        obs=obs,
    )
    name_task(task)  # typed in the dialog: a person named it
    try:
        asked = lanes_from_args(args) or []
    except ConfigError:
        asked = []  # new_run_from_args refuses them with the lane's name
    if None in [lane.size for lane in asked]:
        args.workers = workers  # the field counts the run's workers, as --workers does
    planning = dict(CPU_PLANNING) if cpu_planning else {}
    return new_run_from_args(args, Preset(task, model_size, workers, planning), workers)


def resume_from_args(args: argparse.Namespace) -> Run:
    """The run --resume names, with --steps, --threads, --max-restarts and --merge-timeout
    when given (else those it ran with)."""
    run = Run.resume(args.resume, steps=args.steps)
    given = dict(threads_per_worker=args.threads, max_restarts=args.max_restarts)
    given.update(merge_timeout_s=args.merge_timeout)
    changes = {name: value for name, value in given.items() if value is not None}
    if changes:
        run.settings = replace(run.settings, **changes)
    return run


def checked(run: NewRun) -> NewRun:
    """`run` once its lanes fit its workers and its start weights read (UserError if not)."""
    if run.lanes:
        check_race(run.settings, run.lanes, run.settings.replicas, new_run=True)
    if run.start_weights:
        read_start_weights(run.start_weights, run.cfg)
    return run
