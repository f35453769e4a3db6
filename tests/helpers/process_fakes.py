"""Stand-ins at the process boundary, for unit tests of the code that coordinates processes
(the worker's hooks and merge rounds, the run's monitor and race): a run directory as a new run
leaves it, a training process's trainer (a real tiny agent and real metrics files, no env),
the links a run hands its workers, and a worker process that a test ends by hand."""

from __future__ import annotations

import dataclasses
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import torch

from agent.agent import TDMPC2
from agent.config import Config, knobs_of
from workers.merging.files import write_members
from workers.rundir.directory import RunDir
from workers.rundir.knob_record import KnobStore
from workers.rundir.paths import metrics_name
from workers.rundir.records import Record
from workers.rundir.settings import RunSettings, write_settings
from workers.training.hooks import WorkerHooks
from workers.training.member import Member
from workers.training.spec import SNAPSHOT_FIELDS, STATES, WorkerLink, WorkerSpec

OBS_DIM, ACTION_DIM = 5, 1  # cartpole's: the agent never meets the env here


def make_run(path: Path, cfg: Config, settings: RunSettings, layout=(), lanes=()) -> Path:
    """The files Run.create writes: config.json, run.json, knobs.json(l), merge/members.json."""
    RunDir.create(path).write_config({"config": dataclasses.asdict(cfg)})
    write_settings(path, settings)
    KnobStore(path).initialise(cfg, settings.merge_every, layout, lanes)
    write_members(path, settings.merging)
    return path


def records(path: Path, worker: int, kind: type[Record] = Record) -> list:
    """Worker `worker`'s records of one kind, as its metrics file holds them."""
    return RunDir(path, metrics=metrics_name(worker)).read_metrics(kind)


class FakeTrainer:
    """What the hooks and merge rounds read of a Trainer (trainer.py): a real agent, a pack of
    one per worker in `workers`, each worker's real metrics file, and the counters, which the
    test advances itself (there are no env steps). `close_all()` closes every one made."""

    made: list[FakeTrainer] = []

    def __init__(self, cfg: Config, run_path: Path, workers: list[int]):
        FakeTrainer.made.append(self)
        seeds = [cfg.seed + 1000 * w for w in workers]
        self.agent = TDMPC2(cfg, OBS_DIM, ACTION_DIM, seeds=seeds)
        self.members = [
            Member(seed, None, RunDir(run_path, metrics=metrics_name(w)), None)
            for seed, w in zip(seeds, workers)
        ]
        self.step, self.updates, self.pretrained = 0, 0, True
        self.progress = SimpleNamespace(rate=12.5)

    @property
    def run_dir(self) -> RunDir:
        return self.members[0].run_dir

    def log_all(self, record: Record) -> None:
        for member in self.members:
            member.log(record)

    def state_dict(self, k: int = 0) -> dict:
        return {
            "agent": self.agent.state_dict(k),
            "step": self.step,
            "knobs": knobs_of(self.agent.cfg),
        }

    def weights(self, k: int) -> dict[str, torch.Tensor]:
        """Worker k's networks, a copy."""
        return {name: t.clone() for name, t in self.agent.model_state(k).items()}

    def set_weights(self, k: int, state: dict[str, torch.Tensor]) -> None:
        """Worker k's networks from `state` (as if it had trained on)."""
        self.agent.load_model_state(self.agent.checked_model_state(state), [k])

    @classmethod
    def close_all(cls) -> None:
        """Close the metrics files of every trainer made (after a test)."""
        while cls.made:
            for member in cls.made.pop().members:
                member.run_dir.close()


def worker_spec(
    path: Path, cfg: Config, index: int, merge_with=(), merge_every: int = 10, **fields
) -> WorkerSpec:
    return WorkerSpec(
        index=index,
        run_path=str(path),
        cfg=dataclasses.asdict(cfg),
        merge_with=tuple(merge_with),
        merge_every=merge_every,
        **fields,
    )


def link(spec: WorkerSpec, state: str = "starting") -> WorkerLink:
    """A worker's link as spawn.py makes it, with threading's Event for multiprocessing's."""
    made = WorkerLink(
        spec,
        snapshot=[0.0] * len(SNAPSHOT_FIELDS),
        checkpoint=threading.Event(),
        leave=threading.Event(),
        join=SimpleNamespace(value=spec.join_step),
    )
    made.set(state=STATES.index(state))
    return made


class FakeProcess:
    """A worker's process as the monitor sees it: alive until the test ends it. Its `sentinel`
    (what the monitor thread waits on) is ready once it ended, as a real process's is; it is
    made on first use, and `close_all()` closes every one made (after a test)."""

    made: list[FakeProcess] = []

    def __init__(self, pid: int):
        self.pid, self.exitcode = pid, None
        self._sentinel: socket.socket | None = None
        self._ender: socket.socket | None = None

    def is_alive(self) -> bool:
        return self.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        """Returns at once: a fake process ends only when the test ends it."""

    def kill(self) -> None:
        self.end(-9)

    def end(self, exitcode: int) -> None:
        self.exitcode = exitcode
        if self._ender is not None:
            self._ender.close()  # the sentinel reads the end of the stream: ready

    @property
    def sentinel(self) -> socket.socket:
        if self._sentinel is None:
            self._sentinel, self._ender = socket.socketpair()
            FakeProcess.made.append(self)
            if not self.is_alive():
                self._ender.close()
        return self._sentinel

    def set_weights(self, k: int, state: dict[str, torch.Tensor]) -> None:
        """Worker k's networks from `state` (as if it had trained on)."""
        self.agent.load_model_state(self.agent.checked_model_state(state), [k])

    @classmethod
    def close_all(cls) -> None:
        while cls.made:
            made = cls.made.pop()
            for end in (made._sentinel, made._ender):
                if end is not None:
                    end.close()


def hooks_process(
    path: Path, cfg: Config, workers=(0,), merge_with=(), merge_every=10, start=None, **fields
) -> SimpleNamespace:
    """One training process of `workers` with its hooks, as process.py sets them up."""
    trainer = FakeTrainer(cfg, path, list(workers))
    specs = [worker_spec(path, cfg, w, merge_with, merge_every, **fields) for w in workers]
    links = [link(spec) for spec in specs]
    pause, stop, terminated = threading.Event(), threading.Event(), threading.Event()
    hooks = WorkerHooks(links, trainer, pause, stop, terminated, start=start)
    return SimpleNamespace(
        hooks=hooks, trainer=trainer, links=links, pause=pause, stop=stop, terminated=terminated
    )


def run_steps(p: SimpleNamespace, until: int) -> None:
    """Agent steps up to step `until`, the hooks after each, as Trainer._train calls them."""
    while p.trainer.step < until:
        p.trainer.step += 1
        p.hooks.after_step(p.trainer)
