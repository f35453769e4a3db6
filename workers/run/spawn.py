"""Starting worker processes: what each is told (WorkerSpec) and the handles the run keeps.

The owning run (owner.py) spawns one process per pack of workers; the monitor
(monitor.py) watches them through these handles.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.config import Config
from workers.host.signals import children_ignore_ctrl_c
from workers.host.threads import choose_threads
from workers.rundir.settings import RunSettings, gpu_count
from workers.training.process import worker_main
from workers.training.spec import SNAPSHOT_FIELDS, WorkerLink, WorkerSpec


@dataclass
class WorkerProcess:
    """One worker's handles: its link to the process (the workers of a pack share
    `process`)."""

    link: WorkerLink
    process: mp.Process
    started: float = 0.0  # time.time() of the spawn
    handled: bool = False  # its end was seen by the monitor

    @property
    def spec(self) -> WorkerSpec:
        return self.link.spec

    @property
    def snapshot(self) -> Any:
        return self.link.snapshot

    @property
    def leave(self) -> Any:
        return self.link.leave

    @property
    def checkpoint(self) -> Any:
        return self.link.checkpoint

    @property
    def join(self) -> Any:
        return self.link.join

    def value(self, field: str) -> float:
        """A field of its shared snapshot (see workers/training/spec.py SNAPSHOT_FIELDS)."""
        return self.link.value(field)


def worker_spec(
    path: Path,
    cfg: Config,
    settings: RunSettings,
    index: int,
    merge_every: int,
    nice: int = 0,
    resume: bool = False,
    from_merged: bool = False,
    join_step: int = 0,
) -> WorkerSpec:
    """What worker `index` is started with: its own seed, its pack's GPU, the run's settings."""
    s = settings
    env_seed = cfg.seed + s.env_seed_offset(index)  # paired across a race's lanes (replicas)
    cfg = dataclasses.replace(cfg, seed=cfg.seed + 1000 * index)
    gpus = gpu_count(cfg)
    if gpus > 1:  # each pack on its own GPU, in turn
        packs = s.packs
        number = next((n for n, g in enumerate(packs) if index in g), len(packs))
        cfg = dataclasses.replace(cfg, device=f"cuda:{number % gpus}")
    return WorkerSpec(
        index=index,
        run_path=str(path),
        cfg=dataclasses.asdict(cfg),
        # Every merging worker gets the backend: one alone merges once a worker is added.
        merge_with=tuple(s.merging) if index in s.merging else (),
        merge_timeout_s=s.merge_timeout_s,
        checkpoint_every=s.checkpoint_every,
        threads=choose_threads(len(s.packs), s.threads_per_worker or None).threads,
        resume=resume,
        start_from_merged=from_merged,
        join_step=join_step,
        nice=nice,
        tensorboard=s.tensorboard,
        wandb=s.wandb,
        merge_every=merge_every,
        env_seed=env_seed,
    )


def spawn(
    ctx: mp.context.BaseContext, specs: list[WorkerSpec], pause: object, stop: object
) -> list[WorkerProcess]:
    """One process for these workers (a pack, or one worker), each with its own snapshot
    and events; `pause` and `stop` (Events) are the run's, shared by every process."""
    links = [
        WorkerLink(
            spec,
            snapshot=ctx.Array("d", len(SNAPSHOT_FIELDS), lock=False),
            checkpoint=ctx.Event(),
            leave=ctx.Event(),
            join=ctx.Value("q", spec.join_step, lock=False),
        )
        for spec in specs
    ]
    names = "-".join(str(spec.index) for spec in specs)
    process = ctx.Process(
        target=worker_main,
        args=(links, pause, stop),
        name=f"tdmpc2-worker-{names}",
        daemon=True,
    )
    with children_ignore_ctrl_c():  # the run stops its workers itself (checkpoints)
        process.start()
    started = time.time()
    return [WorkerProcess(link, process, started=started) for link in links]
