"""What every run offers, owned or attached: one interface, and the parts both share.

The owning run (owner.py Run) starts and watches the workers; an attached run
(attached.py AttachedRun) watches another process's and passes its requests on. Both
read the same records, set knobs the same way and have their own showcase.
Over 300 lines because it is the whole interface both kinds of run share.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from abc import ABC, abstractmethod
from collections import deque
from pathlib import Path

from agent.config import Config
from agent.errors import ConfigError, UserError
from workers.run.race import RaceControl
from workers.run.tail import RecordTail, tail_records
from workers.run.wording import OWNED, Wording
from workers.rundir.knob_record import KnobStore, run_knobs, validate_knobs
from workers.rundir.lines import damaged_lines
from workers.rundir.paths import merged_path, metrics_name
from workers.rundir.records import Eval, KnobsApplied, KnobsRefused, Record
from workers.rundir.requests import Request, RequestLog
from workers.rundir.settings import RunSettings
from workers.showcase.control import Showcase


class BaseRun(ABC):
    attached: bool = False  # True for a view of a run another process started (Run.attach)
    wording: Wording = OWNED

    def __init__(self, path: Path, cfg: Config, settings: RunSettings, resumed: bool):
        self.path, self.cfg, self.settings, self.resumed = path, cfg, settings, resumed
        self.knobs = KnobStore(path)
        self.requests = RequestLog(path)
        self._ctx = mp.get_context("spawn")
        # Set while no worker trains (the owner's pause; attached: as last seen by progress()).
        self._pause = self._ctx.Event()
        self._lock = threading.RLock()  # the owner's monitor thread and the caller share state
        self._notices: deque[tuple[str, bool]] = deque(maxlen=1000)
        self._reported_dead: set[int] = set()
        self._tail = RecordTail(path)
        self.showcase = Showcase(self._ctx, path, cfg, self._pause)
        self.race = RaceControl(self.knobs, cfg, lambda: self.settings, self._applied_values)

    # the interface: each kind of run does these its own way ----------------------------
    @abstractmethod
    def start(self, nice: int = 0) -> None: ...

    @abstractmethod
    def launch(self, nice: int = 0) -> None:
        """Set the run going as a window opens it: the owner starts its workers unless they
        run already; a view of another process's run has nothing to start."""

    @abstractmethod
    def is_paused(self) -> bool:
        """Whether training is paused: as asked of the owner; as the workers report it in a
        view (the owner or another window may pause)."""

    @abstractmethod
    def stop_elsewhere(self) -> bool:
        """The Stop button: in a view of another process's run, ask that process to stop its
        workers and return True; the owner returns False (its caller stops it: stop())."""

    def serve_requests(self) -> list[Request]:
        """Apply what attached windows asked for (the owner's job; a view serves nothing)."""
        return []

    def describe_threads(self) -> str:
        """How the run's workers use this machine's cores ("" when they are not this
        process's to start)."""
        return ""

    @abstractmethod
    def progress(self) -> list[dict]: ...

    @abstractmethod
    def pause(self) -> None: ...

    @abstractmethod
    def resume_training(self) -> None: ...

    @abstractmethod
    def checkpoint(self) -> None: ...

    @abstractmethod
    def request_stop(self) -> None: ...

    @abstractmethod
    def stop(self, timeout: float = 120.0) -> None: ...

    @abstractmethod
    def restart_worker(self, index: int) -> None: ...

    @abstractmethod
    def add_worker(self, lane: int | None = None) -> int:
        """Add a merging worker (in a race: to lane `lane`, else the smallest lane)."""

    @abstractmethod
    def remove_worker(self, index: int) -> None: ...

    # state ------------------------------------------------------------------------------
    def process_ids(self) -> dict[str, list[int]]:
        """Operating-system ids of the live worker processes and of the showcase player."""
        return {"workers": self._worker_pids(), "player": self.showcase.pids()}

    def _worker_pids(self) -> list[int]:
        return []  # an attached run's workers are another process's

    @property
    def resting(self) -> bool:
        """True while no worker trains (paused; attached: paused or ended as last seen by
        progress()): the showcase player then has no CPU budget."""
        return self._pause.is_set()

    @property
    def started(self) -> bool:
        """True once start() has spawned the workers (an attached run never starts them)."""
        return False

    @property
    def restarting(self) -> bool:
        """True while a crashed worker waits for its automatic restart or is starting again."""
        return False

    def wait(self, poll_s: float = 0.5) -> None:
        """Block until every worker has ended (attached: returns at once, it has none)."""
        return None

    @property
    def gone(self) -> str | None:
        """Why the run stopped because its directory vanished, if it did (the owner's monitor
        finds out; a view has no workers to stop)."""
        return None

    def check_run_dir(self) -> str | None:
        """Look whether the run directory vanished; returns `gone`."""
        return self.gone

    def _check_knob_history(self) -> None:
        self.knobs.history_values()
        if self.knobs.history_skipped:
            damaged = damaged_lines(self.knobs.history_skipped)
            self._note(f"warning: {self.knobs.history}: {damaged} skipped")

    # checks both kinds make before acting (attached: before a request is sent) -------------
    def _check_restartable(self, index: int) -> None:
        if index in self.settings.removed:
            raise UserError(f"worker {index} was removed from the run; add a new one instead")

    def _check_merged_weights(self, lane: int | None = None) -> None:
        """A new worker starts from its pool's merged weights: refuse it while there are none
        (in a race the pool is lane `lane`'s: RaceControl.lane_for_new)."""
        if not merged_path(self.path, lane).exists():
            raise UserError(
                "a new worker starts from the merged weights and there are none yet: add it "
                f"after the first merge (every {self.knob_values()[1]['merge_every']} steps)"
            )

    def _check_removable(self, index: int) -> None:
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

    # the showcase (workers/showcase/control.py) ---------------------------------------------------
    def start_player(
        self,
        height: int = 240,
        width: int = 320,
        realtime: bool = True,
        max_fps: float = 30.0,
        cpu_share: float | None = None,
    ) -> None:
        """Start the showcase player (see Showcase.start)."""
        self.showcase.start(height, width, realtime, max_fps, cpu_share)

    def camera_names(self) -> list[str]:
        """The task's cameras in id order (the ids set_showcase takes); -1, MuJoCo's free
        camera, is not listed."""
        return self.showcase.camera_names()

    def set_showcase(
        self, camera: int | None = None, source: int | None = None, mode: str | None = None
    ) -> None:
        """Choose the showcase camera (an id of camera_names(), or -1: the free camera), the
        weights it plays (-1: merged, k: worker k's newest, -2 - L: race lane L's merged) and
        its mode: "live" (the planner acting with those weights), "replay" (their newest
        finished episode again at 1x) or "auto" (replay on a CPU where live play is under half
        real speed). Applies within one player step, also to a player started later; an
        out-of-range value changes nothing."""
        lanes = len(self.race.record().lanes)
        self.showcase.choose(self.settings.workers, camera, source, lanes, mode)

    def showcase_settings(self) -> dict:
        """The camera, source and mode the showcase uses now (or will, once started)."""
        return self.showcase.settings()

    def reset_showcase(self) -> None:
        """End the showcase episode at once and start a new one."""
        self.showcase.reset()

    def pause_rendering(self, paused: bool = True) -> None:
        self.showcase.pause_rendering(paused)

    def read_frame(self):
        """(frame HxWx3 uint8, info) of the newest complete showcase frame, or None."""
        return self.showcase.read_frame()

    def frame_sequence(self) -> int:
        """The showcase frames' sequence counter (see FrameBuffer.sequence); 0 before any."""
        return self.showcase.frame_sequence()

    def stop_player(self) -> None:
        self.showcase.stop()

    # knobs --------------------------------------------------------------------------------
    def knob_values(self) -> tuple[int, dict]:
        """(version, values) of the knobs in force: the knob record, or if it is damaged the
        newest good version of its history, else what the workers last recorded applying,
        else the run's own starting values."""
        good = self.knobs.last_good(self.cfg)
        return good if good is not None else self._applied_values()

    def _applied_values(self) -> tuple[int, dict]:
        """The newest knob values a worker recorded running with (knobs_applied, or the values
        in force when it refused a record), else the run's starting values."""
        best = (-1, run_knobs(self.cfg, self.settings.merge_every))
        for index in self.settings.active:
            for record in reversed(tail_records(self.path / metrics_name(index))):
                if isinstance(record, KnobsApplied):
                    found = (record.version, record.values)
                elif isinstance(record, KnobsRefused):
                    found = (record.in_force_version, record.in_force)
                else:
                    continue
                if found[0] > best[0]:
                    try:
                        best = (found[0], validate_knobs(self.cfg, found[1]))
                    except ConfigError:
                        pass
                break
        return best

    def set_knobs(self, lane: int | None = None, **changes: object) -> int:
        """Validate and publish new knob values, for lane `lane` of a race or (None) for every
        worker; returns the new version (error: unchanged). A damaged knob record is replaced,
        from the values in force (only then are the workers' metrics files read for them)."""
        return self.knobs.set(self.cfg, in_force=self._applied_values, lane=lane, **changes)

    def summary(self, interrupted: bool) -> str:
        """Where the run got to: its workers' step, their mean last evaluation return."""
        steps = [w["step"] for w in self.progress()]
        evals = []
        for k in self.settings.active:
            records = tail_records(self.path / metrics_name(k))
            evals += [r.ret for r in records if isinstance(r, Eval)][-1:]
        last = f", mean last eval return {sum(evals) / len(evals):.1f}" if evals else ""
        word = "stopped" if interrupted else "finished"
        return f"{word} at step {int(min(steps, default=0))}{last}; run directory {self.path}"

    # reading ------------------------------------------------------------------------------
    def new_events(self) -> list[Record]:
        """Metrics records appended since the last call, from every worker's file (see
        RecordTail.take)."""
        self._poll()
        return self._tail.take()

    def _poll(self) -> None:
        for warning in self._tail.poll(self.settings.workers):
            self._note(warning)

    def dead_workers(self) -> list[int]:
        """Workers that ended without finishing or being stopped, reported once each."""
        dead = [w["worker"] for w in self.progress() if w["state"] == "crashed"]
        new = [w for w in dead if w not in self._reported_dead]
        self._reported_dead.update(new)
        return new

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
