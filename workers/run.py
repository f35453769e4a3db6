"""The run: N worker processes that train and merge, driven through one small public API.

The headless command, the tests and the viewer all use this class:

    run = Run.create(path, cfg, workers=2, merge_every=2500)   # or Run.resume(path)
    run.start(); run.set_knobs(horizon=5); run.progress(); run.new_events()
    run.pause(); run.resume_training(); run.checkpoint(); run.stop()
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import time
from dataclasses import dataclass
from pathlib import Path

from agent.config import Config
from agent.envs import resolve_task
from agent.errors import ConfigError, UserError
from workers.knobs import KnobStore
from workers.player import FrameBuffer, PlayerSpec, player_main
from workers.rundir import RunDir, atomic_write_json
from workers.worker import SNAPSHOT_FIELDS, STATES, WorkerSpec, metrics_name, worker_main

RUN_FILE = "run.json"


@dataclass(frozen=True)
class RunSettings:
    workers: int = 2
    merge_every: int = 2500
    control_worker: bool = False
    checkpoint_every: int = 10_000
    merge_timeout_s: float = 30.0
    threads_per_worker: int = 1

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"workers must be at least 1, got {self.workers}")
        if self.merge_every < 1:
            raise ConfigError(f"merge_every must be at least 1, got {self.merge_every}")
        if self.checkpoint_every < 1:
            raise ConfigError(f"checkpoint_every must be at least 1, got {self.checkpoint_every}")


@dataclass
class _Process:
    spec: WorkerSpec
    process: mp.Process
    snapshot: object


class Run:
    def __init__(self, path: Path, cfg: Config, settings: RunSettings, resumed: bool):
        self.path, self.cfg, self.settings, self.resumed = path, cfg, settings, resumed
        self.knobs = KnobStore(path)
        self._ctx = mp.get_context("spawn")
        self._pause, self._stop, self._checkpoint = (self._ctx.Event() for _ in range(3))
        self._procs: dict[int, _Process] = {}
        self._offsets: dict[str, int] = {}
        self._reported_dead: set[int] = set()
        self._player: mp.Process | None = None
        self._frames: FrameBuffer | None = None
        self._render_paused, self._player_stop = self._ctx.Event(), self._ctx.Event()

    # creation ----------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, cfg: Config, settings: RunSettings) -> Run:
        resolve_task(cfg.task)
        run_dir = RunDir.create(path)
        run_dir.write_config({"config": dataclasses.asdict(cfg)})
        atomic_write_json(run_dir.path / RUN_FILE, dataclasses.asdict(settings))
        run = cls(run_dir.path, cfg, settings, resumed=False)
        run.knobs.initialise(cfg, settings.merge_every)
        return run

    @classmethod
    def resume(cls, path: str | Path, steps: int | None = None) -> Run:
        """Continue a stopped run from its checkpoints; `steps` raises its total agent steps."""
        path = Path(path)
        try:
            cfg = Config(**json.loads((path / "config.json").read_text())["config"])
            settings = RunSettings(**json.loads((path / RUN_FILE).read_text()))
        except FileNotFoundError:
            raise UserError(
                f"{path} is not a multi-worker run directory (no config.json or run.json)"
            ) from None
        except (ValueError, TypeError, KeyError) as err:
            raise UserError(f"the run record in {path} is damaged ({err})") from None
        if steps is not None:
            cfg = dataclasses.replace(cfg, steps=steps)
            RunDir(path).write_config({"config": dataclasses.asdict(cfg)})
        run = cls(path, cfg, settings, resumed=True)
        run.knobs.read()  # a damaged knob record is an error now, not in every worker
        return run

    # processes ---------------------------------------------------------------------
    def _spec(self, index: int, resume: bool, from_merged: bool = False) -> WorkerSpec:
        s = self.settings
        merging = [i for i in range(s.workers) if not (s.control_worker and i == s.workers - 1)]
        merges = index in merging and len(merging) > 1
        cfg = dataclasses.replace(self.cfg, seed=self.cfg.seed + 1000 * index)
        return WorkerSpec(
            index=index,
            run_path=str(self.path),
            cfg=dataclasses.asdict(cfg),
            merge_with=tuple(merging) if merges else (),
            merge_timeout_s=s.merge_timeout_s,
            checkpoint_every=s.checkpoint_every,
            threads=s.threads_per_worker,
            resume=resume,
            start_from_merged=from_merged,
        )

    def _spawn(self, spec: WorkerSpec) -> None:
        snapshot = self._ctx.Array("d", len(SNAPSHOT_FIELDS), lock=False)
        process = self._ctx.Process(
            target=worker_main,
            args=(spec, snapshot, self._pause, self._stop, self._checkpoint),
            name=f"tdmpc2-worker-{spec.index}",
            daemon=True,
        )
        process.start()
        self._procs[spec.index] = _Process(spec, process, snapshot)

    def start(self) -> None:
        for index in range(self.settings.workers):
            self._spawn(self._spec(index, resume=self.resumed))

    def restart_worker(self, index: int) -> None:
        """Start a dead worker again: from its checkpoint if any, else from the merged weights."""
        old = self._procs.get(index)
        if old is not None and old.process.is_alive():
            raise UserError(f"worker {index} is still running")
        self._reported_dead.discard(index)
        self._spawn(self._spec(index, resume=True, from_merged=True))

    def start_player(
        self, height: int = 240, width: int = 320, realtime: bool = True, max_fps: float = 30.0
    ) -> None:
        """Start the showcase player, rendering frames of the size the reader asks for."""
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
        spec = PlayerSpec(
            str(self.path),
            dataclasses.asdict(self.cfg),
            self._frames.name,
            height,
            width,
            realtime,
            max_fps=max_fps,
        )
        self._player = self._ctx.Process(
            target=player_main,
            args=(spec, self._render_paused, self._player_stop),
            name="tdmpc2-showcase",
            daemon=True,
        )
        self._player.start()

    def pause_rendering(self, paused: bool = True) -> None:
        (self._render_paused.set if paused else self._render_paused.clear)()

    def read_frame(self):
        """(frame HxWx3 uint8, info) of the newest complete showcase frame, or None."""
        return self._frames.read() if self._frames is not None else None

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
    def set_knobs(self, **changes: object) -> int:
        """Validate and publish new knob values; returns the new version (error: unchanged)."""
        return self.knobs.set(self.cfg, **changes)

    def pause(self) -> None:
        self._pause.set()

    def resume_training(self) -> None:
        self._pause.clear()

    def checkpoint(self) -> None:
        self._checkpoint.set()

    def stop(self, timeout: float = 120.0) -> None:
        """Ask every worker to stop (each writes a checkpoint), then wait for them."""
        self._stop.set()
        self._pause.clear()
        self.stop_player()
        deadline = time.monotonic() + timeout
        for p in self._procs.values():
            p.process.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs.values():
            if p.process.is_alive():
                p.process.kill()
                p.process.join(5)

    def wait(self, poll_s: float = 0.5) -> None:
        """Block until every worker has ended."""
        while any(p.process.is_alive() for p in self._procs.values()):
            time.sleep(poll_s)

    # reading -----------------------------------------------------------------------
    def progress(self) -> list[dict]:
        """Latest snapshot of each worker (state 'crashed' for a process that died)."""
        out = []
        for index, p in sorted(self._procs.items()):
            values = dict(zip(SNAPSHOT_FIELDS, p.snapshot[:]))
            state = STATES[int(values.pop("state"))]
            if not p.process.is_alive() and state not in ("done", "stopped"):
                state = "crashed"
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

    def new_events(self) -> list[dict]:
        """Metrics records appended since the last call, from every worker's file."""
        events = []
        sources = [(index, metrics_name(index)) for index in sorted(self._procs)]
        for index, name in [*sources, ("player", "player.jsonl")]:
            path = self.path / name
            if not path.exists():
                continue
            with open(path, "rb") as f:
                f.seek(self._offsets.get(name, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
            self._offsets[name] = self._offsets.get(name, 0) + end
            for line in data[:end].splitlines():
                try:
                    events.append({"worker": index, **json.loads(line)})
                except json.JSONDecodeError:
                    continue
        return events
