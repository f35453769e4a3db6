"""A rank of a torchrun job: `torchrun --nproc-per-node R launch.py --headless --workers N`.

Each of the R ranks trains N / R of the run's workers in its own process (a pack when more than
one), and the ranks merge over torch.distributed (workers/merging/collective.py) instead of
through files. Rank 0 owns the run directory: it creates it (run.json, config, the knob
record), or finds it again when torchrun restarts the job, publishes the merged weights, and
its knob record reaches every rank at each merge round. The other ranks keep their files in
a folder of their own (no file system is shared) and their records are gathered into rank 0's
directory (workers/rundir/rank_records.py), so a window attached to it shows every worker of
the job.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import threading
from pathlib import Path

import torch
import torch.distributed as dist

from agent.config import Config
from agent.errors import UserError
from workers.cli.new_run import RUNS, config_from_args, default_run_dir
from workers.merging.collective import COLLECTIVE_TIMEOUT_S, init_group
from workers.run.spawn import worker_spec
from workers.rundir.directory import RunDir
from workers.rundir.paths import RUN
from workers.rundir.rank_records import forward_records, rank_path
from workers.rundir.settings import RunSettings, read_record
from workers.training.spec import SNAPSHOT_FIELDS, WorkerLink

# How long a rank tries to reach the rendezvous (rank 0's store). Under torchrun it is up
# before any rank starts; ranks started by hand must start within this of each other.
RENDEZVOUS_S = float(os.environ.get("TDMPC2_LIVE_RENDEZVOUS_S", "120"))


def torchrun_rank() -> tuple[int, int] | None:
    """(rank, world size) when this process is a rank of a torchrun job, else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def rank_workers(workers: int, world: int, rank: int) -> list[int]:
    """The workers rank `rank` of `world` trains: an equal share, in order."""
    if workers % world:
        raise UserError(
            f"torchrun started {world} ranks for --workers {workers}: --workers must be a "
            f"multiple of the number of ranks ({world}, {2 * world}, ...), each rank training "
            "as many"
        )
    share = workers // world
    return list(range(rank * share, (rank + 1) * share))


def config_digest(run: dict) -> str:
    """A short hash of what every rank must agree on (config and run settings, not the
    device: each rank has its own GPU)."""
    same = {**run, "config": {k: v for k, v in run["config"].items() if k != "device"}}
    return hashlib.sha256(json.dumps(same, sort_keys=True).encode()).hexdigest()[:12]


def run_rank(args: argparse.Namespace) -> int:
    """Train this rank's workers as part of the torchrun job; returns the exit code."""
    from workers.run.owner import Run
    from workers.training.process import worker_main

    rank, world = torchrun_rank()
    if args.load or args.attach:
        raise UserError("--load and --attach are not for a torchrun job yet")
    if args.control_worker:
        raise UserError("--control-worker is not for a torchrun job yet: every rank must merge")
    cfg, settings = _from_flags(args, world)
    if not args.resume:
        rank_workers(settings.workers, world, rank)  # a share for every rank, or say so now
    init_group(cfg.device, COLLECTIVE_TIMEOUT_S, RENDEZVOUS_S)
    try:
        if not args.resume:
            _check_same_config(cfg, settings)
        path, cfg, settings, resumed = _agree_on_run(args, rank, cfg, settings)
        mine = rank_workers(settings.workers, world, rank)
        own = rank_path(path, rank)  # rank 0: the run directory; the others a folder of their own
        error = None
        try:
            own.mkdir(parents=True, exist_ok=rank == 0 or resumed)
        except OSError as err:
            error = f"rank {rank} cannot make its folder {own}: {err.strerror or err}"
        _all_or_none(error)
        if rank == 0:
            what = "resuming" if resumed else "training"
            print(
                f"{what} {settings.workers} workers on {world} ranks ({len(mine)} each) on "
                f"{cfg.task}; run directory {path}",
                file=sys.stderr,
            )
        specs = [
            dataclasses.replace(
                worker_spec(own, cfg, settings, index, settings.merge_every, resume=resumed),
                distributed=True,
                job_path=str(path),
            )
            for index in mine
        ]
        for spec in specs:
            spec.cfg["device"] = cfg.device  # the rank's own GPU, whatever the pack layout
        links = [
            WorkerLink(spec, [0.0] * len(SNAPSHOT_FIELDS), threading.Event(), threading.Event())
            for spec in specs
        ]
        worker_main(links, pause=threading.Event(), stop=threading.Event())
        try:
            forward_records(path, mine, settings.workers)  # the last records: stop, checkpoint
            # No rank leaves the group (destroys it, exits) while another may still be in a
            # collective with it: the last gather ends on rank 0 after the others have sent.
            dist.barrier()
        except RuntimeError:  # a rank died (gloo: connection closed): torchrun ends the job
            print(
                f"rank {rank} stopped with a checkpoint; another rank of the job is gone "
                "(its last records reach the run directory when the job goes on)",
                file=sys.stderr,
            )
            return 1
        if rank == 0:
            attached = Run.attach(path)
            stopped = any(w["state"] == "stopped" for w in attached.workers.progress())
            print(attached.summary(stopped), file=sys.stderr)
        return 0
    finally:
        dist.destroy_process_group()


def _from_flags(args: argparse.Namespace, world: int) -> tuple[Config, RunSettings]:
    """The config and settings the flags ask for, each rank on its own GPU."""
    from workers.cli.new_run import settings_from_args

    cfg = config_from_args(args)
    if torch.device(cfg.device).type == "cuda":  # one GPU per rank on each machine
        cfg = dataclasses.replace(cfg, device=f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
    if cfg.iterations == 0:  # as Run.create resolves it: the same number on every rank
        cfg = dataclasses.replace(cfg, iterations=cfg.resolved_iterations(0))
    workers = 1 if args.workers is None else args.workers
    settings = settings_from_args(args, workers)
    return cfg, dataclasses.replace(settings, pack=max(1, workers // world), ranks=world)


def _agree_on_run(
    args: argparse.Namespace, rank: int, cfg: Config, settings: RunSettings
) -> tuple[Path, Config, RunSettings, bool]:
    """Rank 0 creates the run directory, or reads the run it resumes: `--resume`, or the
    same `--run-dir` again when torchrun restarts the job after a rank failed. Every rank
    gets its path, config and settings (a refusal stops them all with rank 0's message)."""
    from workers.run.owner import Run

    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    decided: list = [None]
    if rank == 0:
        path = Path(args.resume or args.run_dir or _default_path(cfg.task))
        try:
            resume = bool(args.resume) or (restarted and (path / RUN).exists())
            if resume:
                cfg0, settings = read_record(path)
                if args.steps is not None:
                    cfg0 = dataclasses.replace(cfg0, steps=args.steps)
                    RunDir(path).write_config({"config": dataclasses.asdict(cfg0)})
                cfg = dataclasses.replace(cfg0, device=cfg.device)
            else:
                Run.create(path, cfg, settings)
            decided = [(str(path), dataclasses.asdict(cfg), dataclasses.asdict(settings), resume)]
        except UserError as err:
            decided = [str(err)]
    dist.broadcast_object_list(decided, src=0)
    if isinstance(decided[0], str):
        raise UserError(decided[0])
    path, cfg_dict, settings_dict, resume = decided[0]
    device = cfg.device  # this rank's GPU, not rank 0's
    cfg = dataclasses.replace(Config(**cfg_dict), device=device)
    return Path(path), cfg, RunSettings(**settings_dict), resume


def _default_path(task: str) -> Path:
    """Without --run-dir: a name torchrun's restarts find again (the job's id is kept)."""
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    return RUNS / f"{task}-{job}" if job and job != "none" else default_run_dir(task)


def _all_or_none(error: str | None) -> None:
    """A collective: every rank stops with the first rank's error, if any has one."""
    errors: list = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    if any(errors):
        raise UserError(next(e for e in errors if e))


def _check_same_config(cfg, settings) -> None:
    """Every rank must run the same config and settings: compared by hash at start-up."""
    run = {"config": dataclasses.asdict(cfg), "settings": dataclasses.asdict(settings)}
    digests: list = [None] * dist.get_world_size()
    dist.all_gather_object(digests, config_digest(run))
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    if differ:
        raise UserError(
            f"rank{'s' * (len(differ) > 1)} {', '.join(map(str, differ))} of this torchrun job "
            f"{'were' if len(differ) > 1 else 'was'} started with other flags than rank 0 "
            f"(config hash {digests[differ[0]]} against {digests[0]}): start every rank with "
            "the same flags"
        )
