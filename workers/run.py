"""The run: N worker processes that train and merge, driven through one small public API.

The headless command, the tests and the viewer all use this class:

    run = Run.create(path, cfg, workers=2, merge_every=2500)   # or Run.resume(path)
    run.start(); run.set_knobs(horizon=5); run.progress(); run.new_events()
    run.pause(); run.resume_training(); run.checkpoint(); run.stop()
    run.add_worker(); run.remove_worker(k); run.restart_worker(k)
    run.start_player(); run.set_showcase(camera=1, source=-1); run.read_frame()

Run.attach(path) gives the same reading, knob and showcase API over a run that another process
started (e.g. `launch.py --headless --workers 2`); it owns no workers, so it cannot pause, stop
or checkpoint them, and derives progress from the workers' metrics records instead.
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing as mp
import multiprocessing.connection
import numbers
import shutil
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch

from agent.agent import resolve_device
from agent.config import Config, knobs_of
from agent.envs import resolve_task
from agent.errors import ConfigError, UserError
from workers.exporters import require_wandb
from workers.knobs import KnobStore, validate_knobs
from workers.merge import MEMBERS, merged_step, write_members
from workers.player import (
    FrameBuffer,
    PlayerSpec,
    ShowcaseControls,
    merged_file,
    player_main,
    task_cameras,
)
from workers.requests import RequestLog
from workers.rundir import RunDir, atomic_write_json, damaged_lines, human_size, parse_jsonl
from workers.signals import children_ignore_ctrl_c
from workers.threads import choose_threads
from workers.worker import (
    DOES_NOT_FIT,
    SNAPSHOT_FIELDS,
    STATES,
    WorkerSpec,
    dir_identity,
    metrics_name,
    worker_main,
)

RUN_FILE = "run.json"
DEFAULT_SHARE = 0.07  # showcase CPU budget (cores) when training on the CPU
ATTACHED_IDLE_S = 60.0  # an attached run's worker with no record for this long shows as idle
MONITOR_S = 0.25  # the monitor thread looks at least this often (a worker's exit: at once)
RESTART_BACKOFF_S = 2.0  # before the first automatic restart of a crashed worker; doubles
PENDING_MAX = 100_000  # records kept for new_events when only progress() is being called
NOT_SERVED = (
    "no process is training this run now (no worker has written a record for a minute), so "
    "nobody would serve the request: continue the run with --resume {path}"
)


@dataclass(frozen=True)
class RunSettings:
    workers: int = 2
    merge_every: int = 2500
    control_worker: bool = False
    checkpoint_every: int = 10_000
    merge_timeout_s: float = 30.0
    threads_per_worker: int = 0  # torch threads of each worker; 0: workers/threads.py decides
    added: int = 0  # workers added mid-run: the last `added` indices (the control is before them)
    removed: tuple[int, ...] = ()  # workers taken out mid-run: stopped, not merged, not resumed
    tensorboard: bool = True  # event files in tb/worker-K/ (when TensorBoard is installed)
    wandb: bool = False  # each worker also logs to Weights & Biases
    max_restarts: int = 3  # automatic restarts of a crashed worker, per worker (0: none)
    pack: int = 1  # workers trained as one batched model in one process (0: Run.create picks)

    def __post_init__(self) -> None:
        object.__setattr__(self, "removed", tuple(self.removed))  # a list when read from JSON
        if self.workers < 1:
            raise ConfigError(f"workers must be at least 1, got {self.workers}")
        if self.merge_every < 1:
            raise ConfigError(f"merge_every must be at least 1, got {self.merge_every}")
        if self.checkpoint_every < 1:
            raise ConfigError(f"checkpoint_every must be at least 1, got {self.checkpoint_every}")
        if not 0 <= self.max_restarts <= 1000:
            raise ConfigError(f"max_restarts must be in [0, 1000], got {self.max_restarts}")
        if self.pack < 0:
            raise ConfigError(f"pack must be at least 1, got {self.pack}")
        if self.pack > self.workers - self.added:
            raise ConfigError(
                f"a pack of {self.pack} is larger than the run's {self.workers - self.added} "
                "workers: give --pack at most --workers"
            )

    @property
    def packs(self) -> list[list[int]]:
        """Workers trained together, one process each: the run's first workers in packs of
        `pack` (the last one smaller if need be), each worker added later alone; removed
        workers left out."""
        first, size = self.workers - self.added, max(self.pack, 1)
        groups = [list(range(i, min(i + size, first))) for i in range(0, first, size)]
        groups += [[i] for i in range(first, self.workers)]
        kept = [[i for i in g if i not in self.removed] for g in groups]
        return [g for g in kept if g]

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


@dataclass
class _Process:
    spec: WorkerSpec
    process: mp.Process
    snapshot: object
    leave: object  # Event: this worker alone stops (removed from the run)
    checkpoint: object  # Event: save a checkpoint now (one per worker: each clears its own)
    join: object  # Value: the step a worker starting from the merged weights counts on from
    started: float = 0.0  # time.time() of the spawn
    handled: bool = False  # its end was seen by the monitor


@dataclass
class _Seen:
    """A worker's latest values as its metrics records pass by: an attached run's progress."""

    step: float = 0.0
    steps_per_s: float = 0.0
    last_return: float = math.nan
    knob_version: float = -1.0
    merges: float = 0.0
    updates: float = 0.0
    heartbeat: float = 0.0  # time of the newest record (the writer's clock, this machine)
    blocked_bytes: float = 0.0  # an owner's worker waiting for disk space: not in records
    first_update_s: float = 0.0  # seconds from its process start to its first update's end
    ended: str | None = None  # "done", "stopped" or "crashed" once such a record was seen
    paused: bool = False  # a "pause" record came and no record of training since
    phase: str | None = None  # "seeding", "pretraining" or "training", from the newest records

    def see(self, event: dict) -> None:
        def number(key: str) -> float | None:
            value = event.get(key)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            return float(value) if ok else None

        kind = event.get("kind")
        if (step := number("step")) is not None:
            self.step = step
        if (when := number("time")) is not None:
            self.heartbeat = max(self.heartbeat, when)
        # A worker logs its checkpoint after its stop record; anything else means it runs again.
        if kind not in ("stop", "checkpoint", "error", "knobs_refused"):
            self.ended = None
        if kind not in ("pause", "checkpoint", "knobs_applied", "error", "knobs_refused"):
            self.paused = False
        if kind == "episode" and (ret := number("ret")) is not None:
            self.last_return = ret
        if (updates := number("updates")) is not None:
            self.updates = updates
        if kind in ("seeding", "pretraining"):
            self.phase = kind
        elif kind == "train":
            self.phase = "training"
            rate = number("steps_per_s")
            self.steps_per_s = self.steps_per_s if rate is None else rate
        elif kind == "knobs_applied" and (version := number("version")) is not None:
            self.knob_version = version
        elif kind == "merge":
            self.merges += 1
        elif kind == "first_update" and (seconds := number("seconds")) is not None:
            self.first_update_s = seconds
        elif kind == "pause":
            self.paused = True
        elif kind == "stop":
            self.ended = "done" if event.get("reason") == "done" else "stopped"
        elif kind == "error" and "traceback" in event:  # the worker's own crash, not a refusal
            self.ended = "crashed"
        elif kind == "crashed":  # the owner saw the process die (kill -9 writes nothing)
            self.ended = "crashed"

    def progress(self, worker: int) -> dict:
        if self.ended is not None:
            state = self.ended
        elif self.paused:
            state = "paused"  # a paused worker writes no records: it is not idle
        elif time.time() - self.heartbeat < ATTACHED_IDLE_S:
            state = self.phase or "attached-running"
        else:
            state = "attached-idle"
        values = {f: getattr(self, f) for f in SNAPSHOT_FIELDS if f != "state"}
        # alive is a guess here (the process is another's): heard from within ATTACHED_IDLE_S.
        alive = state not in ("attached-idle", "done", "stopped", "crashed")
        return {"worker": worker, "state": state, "alive": alive, "exitcode": None, **values}


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _tail_records(path: Path, size: int = 262_144) -> list[dict]:
    """The complete records in the last `size` bytes of a metrics file (damaged lines and
    a torn first or last line skipped)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - size))
            lines = f.read().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _last_error(path: Path, since: float) -> str | None:
    """The message of the newest "error" record in a worker's metrics file written after
    `since` (a time.time()), or None."""
    for record in reversed(_tail_records(path, 65536)):  # errors come last
        if not _is_number(record.get("time")) or record["time"] < since:
            return None
        if record.get("kind") == "error":
            return str(record.get("message", "")).splitlines()[0][:300] or None
    return None


_STATE = SNAPSHOT_FIELDS.index("state")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _read_record(path: Path) -> tuple[Config, RunSettings]:
    """The config and settings of a multi-worker run directory (UserError if it is not one, or
    if either file is damaged: the message names it and says how to repair it)."""
    config_file, run_file = path / "config.json", path / RUN_FILE
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
        workers = len(list(path.glob("worker-*.jsonl"))) or 2
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
    except ValueError:
        return None


def _why(err: Exception, path: Path) -> str:
    """What is wrong with a record file, in a few words."""
    try:
        json.loads(path.read_bytes())
    except ValueError as parse_error:
        return f"not JSON: {parse_error}"
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


class Run:
    def __init__(
        self,
        path: Path,
        cfg: Config,
        settings: RunSettings,
        resumed: bool,
        attached: bool = False,
    ):
        self.path, self.cfg, self.settings, self.resumed = path, cfg, settings, resumed
        self._attached = attached
        self._worker_nice = 0
        self.knobs = KnobStore(path)
        self.requests = RequestLog(path)
        self._ctx = mp.get_context("spawn")
        self._pause, self._stop = self._ctx.Event(), self._ctx.Event()
        self._procs: dict[int, _Process] = {}
        self._offsets: dict[str, int] = {}
        self._pending: deque[dict] = deque(maxlen=PENDING_MAX)
        self._seen = {index: _Seen() for index in range(settings.workers)}
        self._settings_changed = 0  # run.json's mtime when an attached run last read it
        self._reported_dead: set[int] = set()
        # The monitor thread (owner only, see _watch) and the caller share these.
        self._lock = threading.RLock()
        self._down: dict[int, str] = {}  # merging workers not running now, with why
        self._restarts: dict[int, int] = {}  # automatic restarts so far, per worker
        self._restart_at: dict[int, float] = {}  # scheduled restarts (time.monotonic())
        self._rejoin: set[int] = set()  # restarted: back in the merges once past "starting"
        self._notices: deque[tuple[str, bool]] = deque(maxlen=1000)
        self._monitor: threading.Thread | None = None
        self._scanned: dict[int, int] = {}  # bytes of each worker's records the monitor read
        self._dir_id: tuple[int, int] | None = None  # the run directory's, when started
        self.gone: str | None = None  # why the run stopped: its directory vanished
        self._refusals_told: set = set()
        self._disk_full: set[int] = set()  # workers told of as paused for want of disk space
        self._player: mp.Process | None = None
        self._frames: FrameBuffer | None = None
        self._render_paused, self._player_stop = self._ctx.Event(), self._ctx.Event()
        # Showcase controls: shared with the player, so changes apply within one player step.
        self._showcase = ShowcaseControls(
            self._ctx.Value("i", 0), self._ctx.Value("i", -1), self._ctx.Event(), self._pause
        )
        self._camera_names: list[str] | None = None

    @property
    def attached(self) -> bool:
        """True for a view of a run another process started (Run.attach)."""
        return self._attached

    def process_ids(self) -> dict[str, list[int]]:
        """Operating-system ids of the live worker processes and of the showcase player."""
        workers = [p.process.pid for p in self._procs.values() if p.process.is_alive()]
        player = [self._player.pid] if self._player is not None and self._player.is_alive() else []
        return {"workers": [pid for pid in workers if pid is not None], "player": player}

    @property
    def resting(self) -> bool:
        """True while no worker trains (paused; attached: paused or ended as last seen by
        progress()): the showcase player then has no CPU budget."""
        return self._pause.is_set()

    @property
    def started(self) -> bool:
        """True once start() has spawned the workers (an attached run never starts them)."""
        return bool(self._procs)

    def _owned_only(self) -> None:
        if self._attached:
            raise UserError("an attached run cannot start workers: it watches another process's")

    def _ask_owner(self, action: str, **args: int) -> None:
        """Attached: pass a request to the process that owns the run (see serve_requests)."""
        # Workers not heard from yet may still be starting: only silence after records, or
        # every worker ended, shows that nobody is there.
        if not any(w["alive"] or not w["heartbeat"] for w in self.progress()):
            raise UserError(NOT_SERVED.format(path=self.path))
        self.requests.send(action, **args)

    def serve_requests(self) -> list[dict]:
        """Owner: apply what attached windows asked for since the last call; returns each
        request with "error" (the refusal, or None). A stop is left to the caller, which owns
        the process's lifetime: the command line exits, a window shows the run stopped."""
        served, skipped = [], self.requests.skipped
        received = self.requests.receive()
        if self.requests.skipped > skipped:
            damaged = damaged_lines(self.requests.skipped - skipped)
            self._note(f"warning: {self.requests.path}: {damaged} skipped")
        for request in received:
            action, error = request["action"], None
            try:
                if action in ("restart_worker", "remove_worker"):
                    getattr(self, action)(int(request.get("worker", -1)))
                elif action != "stop":
                    getattr(self, action)()
            except (UserError, ValueError, TypeError) as err:
                error = str(err)
            served.append({**request, "error": error})
        return served

    # creation ----------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, cfg: Config, settings: RunSettings) -> Run:
        resolve_task(cfg.task)
        if settings.wandb:
            require_wandb()
        if cfg.iterations == 0:
            # "Auto" becomes a real number, as a live knob holds one. It is the base count: the
            # planner adds 2 for large action spaces to any value, as the reference does.
            cfg = dataclasses.replace(cfg, iterations=cfg.resolved_iterations(0))
        if settings.pack == 0:
            settings = dataclasses.replace(settings, pack=default_pack(settings.workers, cfg))
        # Refused knobs must leave nothing behind: check them before the first write.
        validate_knobs(cfg, {**knobs_of(cfg), "merge_every": settings.merge_every})
        run_dir = RunDir.create(path)
        run_dir.write_config({"config": dataclasses.asdict(cfg)})
        run = cls(run_dir.path, cfg, settings, resumed=False)
        run._save_settings(settings)
        run.knobs.initialise(cfg, settings.merge_every)
        return run

    def _write_members(self) -> None:
        """members.json: the merging workers, less those down now (nobody waits for them)."""
        with self._lock:
            merging = self.settings.merging
            down = {k: why for k, why in self._down.items() if k in merging}
            write_members(self.path, merging, down)

    def _save_settings(self, settings: RunSettings) -> None:
        """Record the settings (run.json) and who merges (read by the workers before each
        merge); both atomic."""
        with self._lock:
            atomic_write_json(self.path / RUN_FILE, dataclasses.asdict(settings))
            self.settings = settings
            self._write_members()
        for index in range(settings.workers):
            self._seen.setdefault(index, _Seen())

    @classmethod
    def resume(cls, path: str | Path, steps: int | None = None) -> Run:
        """Continue a stopped run from its checkpoints; `steps` raises its total agent steps."""
        path = Path(path)
        cfg, settings = _read_record(path)
        if settings.wandb:  # the run keeps the logs it started with
            require_wandb()
        if steps is not None:
            cfg = dataclasses.replace(cfg, steps=steps)
            RunDir(path).write_config({"config": dataclasses.asdict(cfg)})
        run = cls(path, cfg, settings, resumed=True)
        run._check_knob_history()
        members = path / "merge" / MEMBERS
        try:
            if members.exists():
                json.loads(members.read_bytes())["workers"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            run._note(f"warning: {members} was damaged ({err}); written again from {RUN_FILE}")
        # A damaged knob record is no reason to stop: the workers keep the last good values
        # (their checkpoints', the record's history) and say so (knobs_refused records).
        write_members(path, settings.merging)  # runs from before members.json have none
        return run

    def _check_knob_history(self) -> None:
        self.knobs.history_values()
        if self.knobs.history_skipped:
            damaged = damaged_lines(self.knobs.history_skipped)
            self._note(f"warning: {self.knobs.history}: {damaged} skipped")

    @classmethod
    def attach(cls, path: str | Path) -> Run:
        """A view of a run that another process is running: events, progress, knobs and the
        showcase work; pause, stop, checkpoint and restarts stay with that process."""
        path = Path(path)
        cfg, settings = _read_record(path)
        run = cls(path, cfg, settings, resumed=True, attached=True)
        run._check_knob_history()
        return run

    # processes ---------------------------------------------------------------------
    def _spec(
        self, index: int, resume: bool, from_merged: bool = False, join_step: int = 0
    ) -> WorkerSpec:
        s = self.settings
        cfg = dataclasses.replace(self.cfg, seed=self.cfg.seed + 1000 * index)
        gpus = gpu_count(cfg)
        if gpus > 1:  # each pack on its own GPU, in turn
            packs = s.packs
            number = next((n for n, g in enumerate(packs) if index in g), len(packs))
            cfg = dataclasses.replace(cfg, device=f"cuda:{number % gpus}")
        return WorkerSpec(
            index=index,
            run_path=str(self.path),
            cfg=dataclasses.asdict(cfg),
            # Every merging worker gets the backend: one alone merges once a worker is added.
            merge_with=tuple(s.merging) if index in s.merging else (),
            merge_timeout_s=s.merge_timeout_s,
            checkpoint_every=s.checkpoint_every,
            threads=choose_threads(len(s.packs), s.threads_per_worker or None).threads,
            resume=resume,
            start_from_merged=from_merged,
            join_step=join_step,
            nice=self._worker_nice,
            tensorboard=s.tensorboard,
            wandb=s.wandb,
            merge_every=int(self.knob_values()[1]["merge_every"]),
        )

    def _spawn(self, specs: list[WorkerSpec]) -> None:
        """One process for these workers (a pack, or one worker), each with its own snapshot
        and events."""
        snapshots = [self._ctx.Array("d", len(SNAPSHOT_FIELDS), lock=False) for _ in specs]
        leaves = [self._ctx.Event() for _ in specs]
        checkpoints = [self._ctx.Event() for _ in specs]
        joins = [self._ctx.Value("q", spec.join_step, lock=False) for spec in specs]
        names = "-".join(str(spec.index) for spec in specs)
        process = self._ctx.Process(
            target=worker_main,
            args=(specs, snapshots, self._pause, self._stop, checkpoints, leaves, joins),
            name=f"tdmpc2-worker-{names}",
            daemon=True,
        )
        with children_ignore_ctrl_c():  # the run stops its workers itself (checkpoints)
            process.start()
        with self._lock:
            for spec, snapshot, leave, checkpoint, join in zip(
                specs, snapshots, leaves, checkpoints, joins
            ):
                self._procs[spec.index] = _Process(
                    spec, process, snapshot, leave, checkpoint, join, started=time.time()
                )

    def start(self, nice: int = 0) -> None:
        """Spawn the workers. `nice` lowers their CPU priority: a window started them, and its
        frames must not wait behind training (the time it takes is the same either way)."""
        self._owned_only()
        self._worker_nice = nice
        self.requests.skip_old()  # asked of an earlier owner: not for this one
        self._dir_id = dir_identity(self.path)
        for index in range(self.settings.workers):  # tell only of what happens from now on
            path = self.path / metrics_name(index)
            self._scanned[index] = path.stat().st_size if path.exists() else 0
        for pack in self.settings.packs:
            self._spawn([self._spec(index, resume=self.resumed) for index in pack])
        self._monitor = threading.Thread(target=self._watch, name="run-monitor", daemon=True)
        self._monitor.start()

    def restart_worker(self, index: int) -> None:
        """Start a dead worker again: from its checkpoint if any, else from the merged weights
        (joining at the step of the others, see add_worker)."""
        if index in self.settings.removed:
            raise UserError(f"worker {index} was removed from the run; add a new one instead")
        if self._attached:
            return self._ask_owner("restart_worker", worker=index)
        pack = self.settings.pack_of(index)
        with self._lock:
            old = self._procs.get(index)
            if old is not None and old.process.is_alive():
                raise UserError(f"worker {index} is still running")
            join_step = self._join_step()
            for member in pack:  # a pack starts again as a whole, in one process
                self._reported_dead.discard(member)
                # Asked for by hand: a fresh allowance of automatic restarts.
                self._restarts.pop(member, None)
                self._restart_at.pop(member, None)
                self._rejoin.add(member)
            self._spawn(
                [self._spec(m, resume=True, from_merged=True, join_step=join_step) for m in pack]
            )

    def _join_step(self) -> int:
        """Where a worker starting from the merged weights begins counting agent steps: with the
        slowest running merging worker, so that its merge rounds line up with theirs."""
        running = [
            w["step"]
            for w in self.progress()
            if w["alive"] and w["worker"] in self.settings.merging and w["state"] != "starting"
        ]
        return int(min(running)) if running else max(0, merged_step(self.path))

    def add_worker(self) -> int:
        """Add a merging worker to the running run; returns its index. It starts from the merged
        weights at the step of the others (no random seed steps: it acts with the merged policy
        and starts updating once its first episode is in its own buffer). Attached: asks the
        owner, and returns the index the worker will have."""
        if not self._attached and not self.started:
            raise UserError("start the run before adding workers")
        if not merged_file(self.path).exists():
            raise UserError(
                "a new worker starts from the merged weights and there are none yet: add it "
                f"after the first merge (every {self.knob_values()[1]['merge_every']} steps)"
            )
        if self._attached:
            self._ask_owner("add_worker")
            return self.settings.workers
        index, join_step = self.settings.workers, self._join_step()
        self._save_settings(
            dataclasses.replace(self.settings, workers=index + 1, added=self.settings.added + 1)
        )
        self._spawn([self._spec(index, resume=False, from_merged=True, join_step=join_step)])
        return index

    def remove_worker(self, index: int) -> None:
        """Take a worker out of the run: the others stop merging with it at once, and it writes
        its checkpoint and exits (a resumed run leaves it out too)."""
        s = self.settings
        if index not in s.active:
            raise UserError(f"worker {index} is not in the run (workers: {s.active})")
        if len(s.active) == 1:
            raise UserError("a run needs at least one worker: stop the run instead")
        pack = s.pack_of(index)
        if len(pack) > 1:
            raise UserError(
                f"worker {index} trains in one process with workers {pack} (a pack of "
                f"{len(pack)}), and a pack cannot shrink while it runs: pause the run, or "
                "stop it and resume with fewer workers"
            )
        if self._attached:
            return self._ask_owner("remove_worker", worker=index)
        with self._lock:
            self._down.pop(index, None)
            self._restart_at.pop(index, None)
            self._rejoin.discard(index)
            self._save_settings(dataclasses.replace(s, removed=(*s.removed, index)))
        process = self._procs.get(index)
        if process is not None:
            process.leave.set()

    def start_player(
        self,
        height: int = 240,
        width: int = 320,
        realtime: bool = True,
        max_fps: float = 30.0,
        cpu_share: float | None = None,
    ) -> None:
        """Start the showcase player, rendering frames of the size the reader asks for.

        `cpu_share` caps its CPU time (cores); by default 0.07 when the workers train on the
        CPU (it then plays in slow motion rather than slow them) and no cap with a GPU."""
        if cpu_share is None:
            cpu_share = 0.0 if resolve_device(self.cfg.device).type == "cuda" else DEFAULT_SHARE
        if self._player is not None and self._player.is_alive():
            raise UserError("the showcase player is already running")
        if not (16 <= height <= 2160 and 16 <= width <= 3840):
            raise ConfigError(
                f"frame size must be within 16x16 and 3840x2160, got {width}x{height}"
            )
        if self._frames is not None:
            self._frames.close(unlink=True)
        self._frames = FrameBuffer(height, width)
        self._player_stop.clear()
        self._showcase.reset.clear()  # a reset asked for while no player ran is void
        spec = PlayerSpec(
            str(self.path),
            dataclasses.asdict(self.cfg),
            self._frames.name,
            height,
            width,
            realtime,
            max_fps=max_fps,
            cpu_share=cpu_share,
        )
        self._player = self._ctx.Process(
            target=player_main,
            args=(spec, self._render_paused, self._player_stop, self._showcase),
            name="tdmpc2-showcase",
            daemon=True,
        )
        with children_ignore_ctrl_c():
            self._player.start()

    def camera_names(self) -> list[str]:
        """The task's cameras in id order (the ids set_showcase takes); -1, MuJoCo's free
        camera, is not listed."""
        if self._camera_names is None:
            self._camera_names = task_cameras(self.cfg.task)
        return list(self._camera_names)

    def set_showcase(self, camera: int | None = None, source: int | None = None) -> None:
        """Choose the showcase camera (an id of camera_names(), or -1: the free camera) and the
        weights it plays (-1: merged, k: worker k's newest). Applies within one player step,
        also to a player started later; an out-of-range value changes nothing."""
        if camera is not None:
            last = len(self.camera_names()) - 1
            if not _is_int(camera) or not -1 <= camera <= last:
                raise ConfigError(
                    f"camera must be in [-1, {last}] (-1: the free camera; the cameras of "
                    f"{self.cfg.task}: {', '.join(self.camera_names()) or 'none'}), got {camera!r}"
                )
        if source is not None:
            last = self.settings.workers - 1
            if not _is_int(source) or not -1 <= source <= last:
                raise ConfigError(
                    f"source must be -1 (merged weights) or a worker in [0, {last}], got {source!r}"
                )
        if camera is not None:
            self._showcase.camera.value = int(camera)
        if source is not None:
            self._showcase.source.value = int(source)

    def showcase_settings(self) -> dict[str, int]:
        """The camera and source the showcase uses now (or will, once started)."""
        return {"camera": self._showcase.camera.value, "source": self._showcase.source.value}

    def reset_showcase(self) -> None:
        """End the showcase episode at once and start a new one."""
        self._showcase.reset.set()

    def pause_rendering(self, paused: bool = True) -> None:
        (self._render_paused.set if paused else self._render_paused.clear)()

    def read_frame(self):
        """(frame HxWx3 uint8, info) of the newest complete showcase frame, or None."""
        return self._frames.read() if self._frames is not None else None

    def frame_sequence(self) -> int:
        """The showcase frames' sequence counter (see FrameBuffer.sequence); 0 before any."""
        return self._frames.sequence() if self._frames is not None else 0

    def stop_player(self) -> None:
        if self._player is not None:
            self._player_stop.set()
            self._player.join(30)
            if self._player.is_alive():
                self._player.kill()
            self._player = None
        if self._frames is not None:
            self._frames.close(unlink=True)
            self._frames = None

    # control -----------------------------------------------------------------------
    def knob_values(self) -> tuple[int, dict]:
        """(version, values) of the knobs in force: the knob record, or if it is damaged the
        newest good version of its history, else what the workers last recorded applying,
        else the run's own starting values."""
        good = self.knobs.last_good(self.cfg)
        return good if good is not None else self._applied_values()

    def _applied_values(self) -> tuple[int, dict]:
        """The newest knob values a worker recorded running with (knobs_applied, or the values
        in force when it refused a record), else the run's starting values."""
        best = (-1, {**knobs_of(self.cfg), "merge_every": self.settings.merge_every})
        for index in self.settings.active:
            for record in reversed(_tail_records(self.path / metrics_name(index))):
                if record.get("kind") == "knobs_applied":
                    found = (record.get("version"), record.get("values"))
                elif record.get("kind") == "knobs_refused":
                    found = (record.get("in_force_version"), record.get("in_force"))
                else:
                    continue
                if _is_int(found[0]) and isinstance(found[1], dict) and found[0] > best[0]:
                    try:
                        best = (found[0], validate_knobs(self.cfg, found[1]))
                    except ConfigError:
                        pass
                break
        return best

    def set_knobs(self, **changes: object) -> int:
        """Validate and publish new knob values; returns the new version (error: unchanged).
        A damaged knob record is replaced, from the values in force."""
        return self.knobs.set(self.cfg, in_force=self._applied_values(), **changes)

    # Attached, each of these asks the process that owns the run (see serve_requests).
    def pause(self) -> None:
        if self._attached:
            return self._ask_owner("pause")
        self._pause.set()

    def resume_training(self) -> None:
        if self._attached:
            return self._ask_owner("resume_training")
        self._pause.clear()

    def checkpoint(self) -> None:
        if self._attached:
            return self._ask_owner("checkpoint")
        for p in self._procs.values():
            p.checkpoint.set()

    def request_stop(self) -> None:
        """Stop training: the owner stops at once; attached, asks the owner to (compare stop(),
        which for an attached run only lets go of it)."""
        if self._attached:
            return self._ask_owner("stop")
        self.stop()

    def stop(self, timeout: float = 120.0) -> None:
        """Ask every worker to stop (each writes a checkpoint), then wait for them. An attached
        run only stops its own showcase player: the workers are another process's (to stop
        them, request_stop)."""
        if self._attached:
            self.stop_player()
            return
        self._stop.set()
        self._pause.clear()
        if self._monitor is not None:
            self._monitor.join(5)
        self.stop_player()
        deadline = time.monotonic() + timeout
        procs = list(self._procs.values())
        for p in procs:
            p.process.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.process.is_alive():
                p.process.kill()
                p.process.join(5)

    def wait(self, poll_s: float = 0.5) -> None:
        """Block until every worker has ended (attached: returns at once, it has none)."""
        while True:
            with self._lock:
                alive = any(p.process.is_alive() for p in self._procs.values())
                restarting = bool(self._restart_at or self._rejoin)
            if not alive and not restarting:
                return
            time.sleep(poll_s)

    # reading -----------------------------------------------------------------------
    def progress(self) -> list[dict]:
        """Latest snapshot of each worker (state 'crashed' for a process that died).

        Attached: the same keys, from the workers' metrics records read so far (state
        seeding/pretraining/training/paused as recorded if a record arrived within
        ATTACHED_IDLE_S, else 'attached-idle', or done/stopped/crashed as recorded; exitcode
        None).
        """
        if self._attached:
            self._poll()
            rows = [self._seen[i].progress(i) for i in range(self.settings.workers)]
            for row in rows:
                if row["worker"] in self.settings.removed and not row["alive"]:
                    row["state"] = "removed"
            # Nothing trains (paused or ended): this view's showcase may use the free cores,
            # as the owner's does while it pauses (the event is local to an attached run).
            resting = all(
                r["state"] == "paused" or (not r["alive"] and r["heartbeat"]) for r in rows
            )
            (self._pause.set if rows and resting else self._pause.clear)()
            return rows
        out = []
        with self._lock:
            procs = sorted(self._procs.items())
        for index, p in procs:
            values = dict(zip(SNAPSHOT_FIELDS, p.snapshot[:]))
            state = STATES[int(values.pop("state"))]
            if not p.process.is_alive() and state not in ("done", "stopped"):
                state = "crashed"
            if index in self.settings.removed and not p.process.is_alive():
                state = "removed"
            out.append(
                {
                    "worker": index,
                    "state": state,
                    "alive": p.process.is_alive(),
                    "exitcode": p.process.exitcode,
                    **values,
                }
            )
        return out

    def dead_workers(self) -> list[int]:
        """Workers that ended without finishing or being stopped, reported once each."""
        dead = [w["worker"] for w in self.progress() if w["state"] == "crashed"]
        new = [w for w in dead if w not in self._reported_dead]
        self._reported_dead.update(new)
        return new

    @property
    def restarting(self) -> bool:
        """True while a crashed worker waits for its automatic restart or is starting again."""
        with self._lock:
            return bool(self._restart_at or self._rejoin)

    def notices(self, recorded: bool = True) -> list[str]:
        """One-line messages for the user since the last call (a worker died, was restarted,
        was left out for good; a knob record was refused): the command line prints them, the
        window shows them in its status line and Log tab. `recorded=False` leaves out those
        that also are a metrics record (a window shows those from the records)."""
        with self._lock:
            lines = [text for text, in_record in self._notices if recorded or not in_record]
            self._notices.clear()
        return lines

    def _note(self, text: str, in_record: bool = False) -> None:
        with self._lock:
            self._notices.append((text, in_record))

    # monitoring (owner only) -----------------------------------------------------------
    def _watch(self) -> None:
        """The monitor thread: sees a worker's exit within MONITOR_S, takes it out of the
        merges at once, records why and restarts it with a back-off (see _ended)."""
        while not self._stop.is_set():
            with self._lock:
                # A pack's workers share one process: wait on it once.
                waiting = list({p.process.sentinel for p in self._procs.values() if not p.handled})
            try:
                # Returns as soon as a worker exits; else after MONITOR_S.
                multiprocessing.connection.wait(waiting, timeout=MONITOR_S)
            except (OSError, ValueError):  # a sentinel closed meanwhile: look again
                time.sleep(MONITOR_S)
            if self._stop.is_set():
                return
            try:
                self._check()
            except Exception as err:  # the monitor must outlive anything it finds
                self._note(f"error: run monitor: {type(err).__name__}: {err}")
                time.sleep(1.0)

    def _scan_records(self) -> None:
        """Notices of what the workers recorded that the user must hear of even without a
        window: a refused knob record (once, however many workers refused it), the step each
        worker resumed from (and a damaged checkpoint passed over)."""
        for index in range(self.settings.workers):
            path = self.path / metrics_name(index)
            try:
                with open(path, "rb") as f:
                    f.seek(self._scanned.get(index, 0))
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1
            self._scanned[index] = self._scanned.get(index, 0) + end
            for line in data[:end].splitlines():
                if b'"resumed"' in line:
                    self._resumed(index, line)
                if b'"knobs_refused"' not in line:
                    continue
                try:
                    record = json.loads(line)
                    key = (record.get("version"), record.get("reason"))
                except (ValueError, AttributeError):
                    continue
                if key not in self._refusals_told:
                    self._refusals_told.add(key)
                    self._note(str(record.get("message")), in_record=True)

    def _watch_disk(self) -> None:
        """Say when a worker pauses because a write failed for want of space, and when it
        goes on (it tries again by itself: see WorkerHooks.wait_for_disk)."""
        for index, p in list(self._procs.items()):
            blocked = p.process.is_alive() and STATES[int(p.snapshot[_STATE])] == "disk full"
            if blocked and index not in self._disk_full:
                self._disk_full.add(index)
                try:
                    free = shutil.disk_usage(self.path).free
                except OSError:
                    free = -1
                needed = int(p.snapshot[SNAPSHOT_FIELDS.index("blocked_bytes")])
                self._note(
                    f"error: worker {index} paused: a write in {self.path} failed for want of "
                    f"space (free: {human_size(free)}; it needs about {human_size(needed)}): "
                    "free some space and training resumes by itself; every file written "
                    "before stays whole"
                )
            elif not blocked and index in self._disk_full:
                self._disk_full.discard(index)
                if p.process.is_alive():
                    self._note(f"worker {index} writes again: training resumed")

    def _resumed(self, index: int, line: bytes) -> None:
        try:
            record = json.loads(line)
            step, fallback = record["step"], record.get("fallback")
        except (ValueError, KeyError, TypeError):
            return
        if record.get("kind") != "resumed":
            return
        if fallback:  # also a record the window shows as an error
            self._note(f"warning: {fallback}", in_record=True)
        else:
            where = record.get("checkpoint", "its checkpoint")
            self._note(f"worker {index} resumed from step {step} ({where})")

    def check_run_dir(self) -> str | None:
        """Owner: once the run directory is deleted or moved, stop the workers (they write
        nothing more, so no partial run is made where it was) and say so; returns why."""
        with self._lock:
            if self.gone is None and self._dir_id is not None:
                if dir_identity(self.path) != self._dir_id:
                    self.gone = (
                        f"the run directory {self.path} vanished (deleted or moved) while the "
                        "run went on: the workers stopped and wrote nothing elsewhere; if it "
                        "was moved, continue with --resume NEW_PATH"
                    )
                    self._note(f"error: {self.gone}")
                    self._stop.set()
            return self.gone

    def _check(self) -> None:
        with self._lock:
            if self.check_run_dir():
                return
            self._scan_records()
            self._watch_disk()
            for index, p in list(self._procs.items()):
                if not p.handled and not p.process.is_alive():
                    p.handled = True
                    self._ended(index, p)
            now = time.monotonic()
            for index, when in list(self._restart_at.items()):
                if now >= when and not self._stop.is_set():
                    del self._restart_at[index]
                    self._restart(index)
            for index in list(self._rejoin):
                self._follow_rejoin(index)

    def _ended(self, index: int, p: _Process) -> None:
        """A worker process ended: a crash is recorded, taken out of the merges and restarted
        (or left out for good after max_restarts)."""
        state = STATES[int(p.snapshot[SNAPSHOT_FIELDS.index("state")])]
        self._rejoin.discard(index)
        if state in ("done", "stopped") or index in self.settings.removed or self._stop.is_set():
            return
        code = p.process.exitcode
        if code is not None and code < 0:
            try:
                why = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                why = f"killed by signal {-code}"
        else:
            why = f"exit code {code}"
        last_error = _last_error(self.path / metrics_name(index), since=p.started)
        done = self._restarts.get(index, 0)
        limit = self.settings.max_restarts
        final = done >= limit or code == DOES_NOT_FIT
        if code == DOES_NOT_FIT:
            then = "not restarted: it would not fit again"
            down = "out of GPU memory: left out"
        elif final:
            if limit == 0:
                then = "automatic restarts are off (--max-restarts 0): restart it by hand"
            else:
                then = f"left out for good after {done} restart{'s' * (done != 1)}"
            down = f"crashed ({why}): left out for good"
        else:
            delay = RESTART_BACKOFF_S * 2**done
            then = (
                f"restarting it from the merged weights in {delay:g} s "
                f"(restart {done + 1} of {limit})"
            )
            self._restart_at[index] = time.monotonic() + delay
            down = f"crashed ({why}), restarting"
        message = f"worker {index} died ({why}"
        message += f"; last error: {last_error})" if last_error else ")"
        message += f"; the others go on without waiting for it; {then}"
        if index in self.settings.merging:
            self._down[index] = down
            self._write_members()
        self._note(message, in_record=True)
        record = dict(
            message=message,
            exitcode=code,
            signal=signal.Signals(-code).name if code is not None and code < 0 else None,
            last_error=last_error,
            restarts=done,
            final=final,
        )
        try:
            log = RunDir(self.path, metrics=metrics_name(index))
            log.log("crashed", step=int(p.snapshot[SNAPSHOT_FIELDS.index("step")]), **record)
            log.close()
        except OSError as err:  # the directory itself may be gone: the notice still says it
            self._note(f"could not record worker {index}'s crash: {err}")

    def _restart(self, index: int) -> None:
        """An automatic restart, from the merged weights at the step of the running workers
        (it joins the merges again once it runs: _follow_rejoin). A pack starts again as a
        whole: the first of its workers due spawns it, the others find it running."""
        self._restarts[index] = self._restarts.get(index, 0) + 1
        self._rejoin.add(index)
        self._reported_dead.discard(index)
        if self._procs[index].process.is_alive():
            return
        pack = self.settings.pack_of(index)
        join_step = self._join_step()
        self._spawn(
            [self._spec(m, resume=False, from_merged=True, join_step=join_step) for m in pack]
        )

    def _follow_rejoin(self, index: int) -> None:
        """While a restarted worker starts, keep its starting step at the others' step (it
        reads it once ready); once it runs, it takes part in the merges again."""
        p = self._procs[index]
        state = STATES[int(p.snapshot[SNAPSHOT_FIELDS.index("state")])]
        if state == "starting":
            if p.process.is_alive():
                p.join.value = self._join_step()
            return
        self._rejoin.discard(index)
        if self._down.pop(index, None) is not None:
            self._write_members()
        step = int(p.snapshot[SNAPSHOT_FIELDS.index("step")])
        self._note(f"worker {index} runs again from step {step}: it merges again")

    def new_events(self) -> list[dict]:
        """Metrics records appended since the last call, from every worker's file."""
        self._poll()
        events = list(self._pending)
        self._pending.clear()
        return events

    def _follow_settings(self) -> None:
        """An attached run's owner can add or remove workers: follow its run.json."""
        try:
            changed = (self.path / RUN_FILE).stat().st_mtime_ns
            if changed != self._settings_changed:
                self._settings_changed = changed
                self.settings = _read_record(self.path)[1]
                for index in range(self.settings.workers):
                    self._seen.setdefault(index, _Seen())
        except (OSError, UserError):
            pass  # being replaced right now, or damaged: keep the last good settings

    def _poll(self) -> None:
        """Read the records appended since the last poll: queued for new_events, and noted
        per worker (an attached run's progress)."""
        if self._attached:
            self._follow_settings()
        sources = [(index, metrics_name(index)) for index in range(self.settings.workers)]
        for index, name in [*sources, ("player", "player.jsonl")]:
            path = self.path / name
            if not path.exists():
                continue
            with open(path, "rb") as f:
                f.seek(self._offsets.get(name, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
            self._offsets[name] = self._offsets.get(name, 0) + end
            records, skipped = parse_jsonl(data[:end])
            if skipped:  # never a crash: said, with how many, and read on
                self._note(f"warning: {self.path / name}: {damaged_lines(skipped)} skipped")
            for record in records:
                event = {"worker": index, **record}
                self._pending.append(event)
                if index != "player":
                    self._seen[index].see(event)
