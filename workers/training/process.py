"""One training process (the spawn target, worker_main): one worker, or a pack of workers
trained as one batched model (agent/agent.py), each with its own seed, env(s), buffer and
metrics file. It starts each worker (first_weights.py), hands the trainer the hooks that
run between agent steps (hooks.py: knobs, merges, checkpoints, pause and stop), and
says how it ended: the exit codes and states of spec.py.

Talks to the run through the run directory (knobs, metrics, merges, checkpoints: the source of
truth) and a small shared snapshot array (latest-wins progress), plus events for pause, stop and
checkpoint requests.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any

import torch

from agent.config import Config
from workers.host.signals import child_signals
from workers.host.threads import apply_threads
from workers.rundir.directory import RunDir
from workers.rundir.paths import metrics_name, weights_name
from workers.rundir.records import Error, RunDirGone
from workers.rundir.sinks import attach_exporters
from workers.training.disk_guard import dir_identity
from workers.training.fast_path import self_check
from workers.training.first_weights import start_worker
from workers.training.hooks import WorkerHooks
from workers.training.spec import DOES_NOT_FIT, RUN_DIR_GONE, SPLIT_PACK, WorkerLink
from workers.training.trainer import Trainer


def does_not_fit(workers: int, device: torch.device) -> str:
    """One line for a pack that ran out of GPU memory, with how many workers would fit (from
    the memory taken when it failed: an upper bound, as it had not reached its peak yet)."""
    free, total = torch.cuda.mem_get_info(device)
    taken = max(torch.cuda.max_memory_allocated(device), 1)
    fit = max(0, int(workers * (taken + free) / taken) - 1)
    gib = 2**30
    return (
        f"a pack of {workers} worker{'s' * (workers > 1)} does not fit in the memory of "
        f"{torch.cuda.get_device_name(device)} ({total / gib:.1f} GiB; it had taken "
        f"{taken / gib:.1f} GiB when it ran out): at most about {fit} fit; start the run "
        f"with --pack {max(fit, 1)} (or a smaller --model-size / --batch-size)"
    )


def worker_main(links: list[WorkerLink], pause: Any, stop: Any) -> None:
    """Entry point of a spawned training process: one worker, or a pack (one link per
    worker). `pause` and `stop` are the run's events, shared by all its processes."""
    specs = [link.spec for link in links]
    started = time.time()
    terminated = child_signals()
    spec = specs[0]
    apply_threads(spec.threads)
    if spec.nice:
        os.nice(spec.nice)
    runs = [
        RunDir(sp.run_path, metrics=metrics_name(sp.index), weights=weights_name(sp.index))
        for sp in specs
    ]
    names = ", ".join(str(sp.index) for sp in specs)
    who = f"worker {names}" if len(specs) == 1 else f"workers {names} (a pack)"

    def set_state(state: str) -> None:
        for link in links:
            link.set_state(state)

    set_state("starting")
    identity = dir_identity(spec.run_path)
    gone = (
        f"{who} stopped: the run directory {spec.run_path} vanished (deleted or moved); "
        "nothing more is written, so no partial run is made where it was"
    )
    if identity is None:
        print(gone, file=sys.stderr)
        set_state("stopped")
        raise SystemExit(RUN_DIR_GONE)
    try:
        cfgs = [Config(**sp.cfg) for sp in specs]
        trainer = Trainer(
            cfgs[0],
            runs,
            progress=False,
            write_config=False,
            seeds=[c.seed for c in cfgs],
            env_seeds=[sp.env_seed for sp in specs],
        )
        for sp, run in zip(specs, runs):
            attach_exporters(
                run, cfgs[0], tensorboard=sp.tensorboard, wandb=sp.wandb, worker=sp.index
            )
        start = None
        for k, link in enumerate(links):
            start = start_worker(link.spec, trainer, k, link.join) or start
        verdict = self_check(trainer, runs, who, can_split=not spec.distributed)
        if spec.distributed:  # a rank's records are gathered later: say it now
            print(f"{who}: {verdict.line()}", file=sys.stderr)
        if verdict.path.split:  # the run starts each worker in a process of its own
            trainer.env.close()
            raise SystemExit(SPLIT_PACK)
        hooks = WorkerHooks(
            links, trainer, pause, stop, terminated, start=start, started=started, checked=verdict
        )
        summary = trainer.run(hooks)
        hooks.checkpoint()
        set_state("stopped" if summary["interrupted"] else "done")
    except Exception as err:
        if dir_identity(spec.run_path) != identity:  # whatever failed, this is the cause
            for run in runs:
                if run.metrics_open:  # the open file moved with the directory
                    run.log(RunDirGone(message=gone))
            print(gone, file=sys.stderr)
            set_state("stopped")
            raise SystemExit(RUN_DIR_GONE) from None
        message, code = f"{type(err).__name__}: {err}", 1
        if isinstance(err, torch.cuda.OutOfMemoryError):
            message, code = (
                does_not_fit(len(specs), torch.device(cfgs[0].device)),
                DOES_NOT_FIT,
            )
            print(f"{who}: {message}", file=sys.stderr)
        for run in runs:
            run.on_write_error = None  # no waiting for space now: the error is told, or printed
            try:
                run.log(Error(message=message, traceback=traceback.format_exc()))
            except OSError as log_err:
                print(f"{who}: {message} (not recorded: {log_err})", file=sys.stderr)
        set_state("crashed")
        raise SystemExit(code) from None
    finally:
        for run in runs:
            run.close()
