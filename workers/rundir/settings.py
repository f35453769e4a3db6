"""The run's settings record (run.json) and how a run's workers are grouped into packs.

Written once by Run.create and again whenever workers are added or removed; read by Run.resume
and Run.attach (an attached run follows it as the owner changes it).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from agent.agent import resolve_device
from agent.config import Config
from agent.errors import ConfigError, UserError
from workers.rundir.directory import atomic_write_json
from workers.rundir.knob_record import KnobStore
from workers.rundir.paths import CONFIG, RUN, metrics_name

PAIRED_SEEDS = 1_000_000  # paired environment seeds start here, past every worker's own
MAX_WORKERS = 256  # a process each (or a pack's share of one): beyond, a typo or an attack
MAX_MERGE_TIMEOUT_S = 3600.0  # a merge round's wait for the others: an hour is a stalled run


def _check_workers(name: str, workers: Sequence[object], count: int) -> None:
    if len(set(workers)) != len(workers) or not all(
        type(w) is int and 0 <= w < count for w in workers
    ):
        raise ConfigError(f"{name} must name each of the run's {count} workers at most once")


@dataclass(frozen=True)
class RunSettings:
    """How a run is laid out (run.json): its workers, packs, merging and checkpoints."""

    workers: int = 2
    merge_every: int = 2500
    # A worker outside every merge, as runs made before lanes had sizes recorded it; a new
    # run's control worker is a lane of its own that never merges (lanes.py CONTROL).
    control_worker: bool = False
    checkpoint_every: int = 10_000
    merge_timeout_s: float = 30.0
    threads_per_worker: int = 0  # torch threads of each worker; 0: workers/host/threads.py decides
    added: int = 0  # workers added mid-run: the last `added` indices (the control is before them)
    removed: tuple[int, ...] = ()  # workers taken out mid-run: stopped, not merged, not resumed
    tensorboard: bool = True  # event files in tb/worker-K/ (when TensorBoard is installed)
    wandb: bool = False  # each worker also logs to Weights & Biases
    max_restarts: int = 3  # automatic restarts of a crashed worker, per worker (0: none)
    pack: int = 1  # workers trained as one batched model in one process (0: Run.create picks)
    ranks: int = 0  # a torchrun job's processes (workers/cli/torchrun.py); 0: not one
    # The race's lanes the run was created with (--lane): no pack spans two. The live lanes,
    # which a race started later or a promotion changes, are in the knob record (knobs.json).
    lanes: tuple[tuple[int, ...], ...] = ()
    # Copies of each of those lanes (--replicas): lanes[l * replicas + r] is lane l's replica r,
    # whose environments are seeded as replica r of every other lane (paired).
    replicas: int = 1
    # That race's length in training time (--race-minutes): its verdict then (records.py).
    race_minutes: float = 90.0
    # Workers the start-up self-check split out of their pack (it found the pack unsound):
    # each trains in a process of its own from then on, a resumed run's too.
    apart: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "removed", tuple(self.removed))  # a list when read from JSON
        object.__setattr__(self, "apart", tuple(self.apart))
        object.__setattr__(self, "lanes", tuple(tuple(lane) for lane in self.lanes))
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ConfigError(f"workers must be in [1, {MAX_WORKERS}], got {self.workers}")
        # Worker lists of a run.json someone else wrote: each worker once, none beyond the run
        # (a list of millions would cost every look at the run's workers).
        for name in ("removed", "apart"):
            _check_workers(name, getattr(self, name), self.workers)
        _check_workers("lanes", [w for lane in self.lanes for w in lane], self.workers)
        if not isinstance(self.replicas, int) or self.replicas < 1:
            raise ConfigError(f"replicas must be at least 1, got {self.replicas!r}")
        if not 0 < self.race_minutes < float("inf"):
            raise ConfigError(f"race_minutes must be above 0, got {self.race_minutes!r}")
        if self.merge_every < 1:
            raise ConfigError(f"merge_every must be at least 1, got {self.merge_every}")
        if not 0 < self.merge_timeout_s <= MAX_MERGE_TIMEOUT_S:
            raise ConfigError(
                f"merge_timeout_s must be in (0, {MAX_MERGE_TIMEOUT_S:g}] seconds, "
                f"got {self.merge_timeout_s!r}"
            )
        if self.checkpoint_every < 1:
            raise ConfigError(f"checkpoint_every must be at least 1, got {self.checkpoint_every}")
        if not 0 <= self.max_restarts <= 1000:
            raise ConfigError(f"max_restarts must be in [0, 1000], got {self.max_restarts}")
        if self.pack < 0:
            raise ConfigError(
                f"pack must be 0 (chosen when the run is created) or more, got {self.pack}"
            )
        first = self.workers - self.added
        if self.pack > first:
            raise ConfigError(
                f"a pack of {self.pack} is larger than the run's {first} "
                f"worker{'s' * (first != 1)}: give --pack at most --workers"
            )

    @property
    def packs(self) -> list[list[int]]:
        """Workers trained together, one process each: the run's first workers in packs of
        `pack` (the last one smaller if need be; a race's lanes each apart, as their planning
        shapes differ), each worker added later or split apart alone; removed workers left
        out."""
        first, size = self.workers - self.added, max(self.pack, 1)
        groups = []
        for part in self._lane_parts(first):
            groups += [part[i : i + size] for i in range(0, len(part), size)]
        groups += [[i] for i in range(first, self.workers)]
        packs = []
        for group in groups:
            kept = [i for i in group if i not in self.removed]
            together = [i for i in kept if i not in self.apart]
            packs += ([together] if together else []) + [[i] for i in kept if i in self.apart]
        return packs

    def _lane_parts(self, first: int) -> list[list[int]]:
        """The run's first workers in runs of neighbours that share a lane (or no lane)."""
        lane_of = {w: n for n, lane in enumerate(self.lanes) for w in lane}
        parts: list[list[int]] = []
        for w in range(first):
            if parts and lane_of.get(parts[-1][-1]) == lane_of.get(w):
                parts[-1].append(w)
            else:
                parts.append([w])
        return parts

    def env_seed_offset(self, index: int) -> int:
        """Worker `index`'s environment seed, less the run's seed: in a race of replicas made
        with the run, the k-th worker of replica r of every lane gets the same (lanes compared
        replica by replica see the same episodes' starts); else its own 1000 x index."""
        if self.replicas <= 1 or not self.lanes:
            return 1000 * index
        widest = max(len(lane) for lane in self.lanes)
        for n, lane in enumerate(self.lanes):
            if index in lane:
                return PAIRED_SEEDS + 1000 * (widest * (n % self.replicas) + lane.index(index))
        return 1000 * index

    def pack_of(self, index: int) -> list[int]:
        """The workers that share `index`'s process (itself alone when not in a pack)."""
        return next((g for g in self.packs if index in g), [index])

    @property
    def control_index(self) -> int | None:
        """The worker that never merges (the last one the run started with), if any."""
        return self.workers - self.added - 1 if self.control_worker else None

    @property
    def active(self) -> list[int]:
        return [i for i in range(self.workers) if i not in self.removed]

    @property
    def merging(self) -> list[int]:
        return [i for i in self.active if i != self.control_index]


def read_record(path: Path) -> tuple[Config, RunSettings]:
    """The config and settings of a multi-worker run directory (UserError if it is not one, or
    if either file is damaged: the message names it and says how to repair it)."""
    config_file, run_file = path / CONFIG, path / RUN
    try:
        config, settings = _json_or_none(config_file), _json_or_none(run_file)
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(
            f"{path} is not a multi-worker run directory (no config.json or run.json)"
        ) from None
    except OSError as err:
        raise UserError(f"cannot read the run record in {path}: {err}") from None
    try:
        cfg = Config(**config["config"])
    except (ValueError, TypeError, KeyError) as err:
        raise UserError(
            f"{config_file} is damaged ({_why(err, config_file)}): it holds the run's config, "
            "kept nowhere else; restore it from a backup (or copy config.json of a run started "
            "with the same flags)"
        ) from None
    try:
        return cfg, RunSettings(**settings)
    except (ValueError, TypeError, KeyError) as err:
        workers = len(list(path.glob(metrics_name("*")))) or 2
        good = KnobStore(path).last_good(cfg)
        merge_every = good[1]["merge_every"] if good else RunSettings.merge_every
        example = json.dumps({"workers": workers, "merge_every": merge_every})
        raise UserError(
            f"{run_file} is damaged ({_why(err, run_file)}): it holds the run's settings; "
            f"restore it from a backup, or write its essentials again: echo '{example}' > "
            f'{run_file} (add "control_worker": true if the run had one; other settings '
            "take their defaults)"
        ) from None


def _json_or_none(path: Path) -> object:
    """The JSON value in a file, or None if it is not JSON (OSError if it cannot be read)."""
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError):  # RecursionError: nested thousands deep
        return None


def _why(err: Exception, path: Path) -> str:
    """What is wrong with a record file, in a few words."""
    try:
        json.loads(path.read_bytes())
    except ValueError as parse_error:
        return f"not JSON: {parse_error}"
    except RecursionError:
        return "not JSON: nested too deep"
    except OSError:
        pass
    return f"{type(err).__name__}: {err}"


def gpu_count(cfg: Config) -> int:
    """GPUs the run's workers may use (0: they train on the CPU)."""
    if resolve_device(cfg.device).type != "cuda":
        return 0
    return 1 if ":" in cfg.device else torch.cuda.device_count()


def default_pack(workers: int, cfg: Config) -> int:
    """On CUDA one pack per visible GPU (the workers split across them); on the CPU one process
    per worker, 10-30 % faster than a pack there on 2 cores (BENCHMARKS.md, "Packs")."""
    gpus = gpu_count(cfg)
    return -(-workers // gpus) if gpus else 1


def write_settings(path: Path, settings: RunSettings) -> None:
    """Record the settings in the run directory's run.json (atomic)."""
    atomic_write_json(path / RUN, dataclasses.asdict(settings))
