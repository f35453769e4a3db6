"""What every run offers, owned or attached: one interface, and the parts both share.

The owning run (owner.py Run) starts and watches the workers; an attached run
(attached.py AttachedRun) watches another process's and passes its requests on. Both
read the same records, set knobs the same way and have their own showcase.

The interface is split by subject: the run itself (start, pause, stop, its records) here, and
its parts, `run.workers` (Workers: progress, add, remove, restart), `run.knobs` (knobs.py),
`run.race` (workers/race/control.py), `run.showcase` (workers/showcase/control.py) and
`run.montages` (workers/showcase/montage_job.py). The same requests as data: `run.do(command)`
(commands.py; handle.py), the one place the window's requests are carried out.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from pathlib import Path

from agent.config import Config
from agent.errors import UserError
from workers.race.control import RaceControl
from workers.run.commands import Command, Outcome
from workers.run.knobs import RunKnobs
from workers.run.tail import RecordTail, tail_records
from workers.run.wording import OWNED, Wording
from workers.rundir.knob_record import KnobStore
from workers.rundir.lines import damaged_lines
from workers.rundir.paths import merged_path, metrics_name
from workers.rundir.records import Eval, Record
from workers.rundir.requests import Request, RequestLog
from workers.rundir.settings import RunSettings
from workers.showcase.control import Showcase
from workers.showcase.montage_job import MontageJobs


class BaseRun(ABC):
    attached: bool = False  # True for a view of a run another process started (Run.attach)
    wording: Wording = OWNED
    workers: Workers  # each kind of run sets its own

    def __init__(self, path: Path, cfg: Config, settings: RunSettings, resumed: bool):
        self.path, self.cfg, self.settings, self.resumed = path, cfg, settings, resumed
        self.knobs = RunKnobs(KnobStore(path), cfg, lambda: self.settings)
        self.requests = RequestLog(path)
        self._ctx = mp.get_context("spawn")
        # Set while no worker trains (the owner's pause; attached: as last seen by progress()).
        self._pause = self._ctx.Event()
        self._lock = threading.RLock()  # the owner's monitor thread and the caller share state
        self._notices: deque[tuple[str, bool]] = deque(maxlen=1000)
        self._tail = RecordTail(path)
        self.race = RaceControl(self.knobs.store, cfg, lambda: self.settings, self.knobs.applied)
        self.showcase = Showcase(self._ctx, path, cfg, self._pause, self._sources)
        self.montages = MontageJobs(self._ctx, path)  # made for a window (MakeMontage)

    def _sources(self) -> tuple[int, int]:
        """The workers and race lanes whose weights the showcase may play."""
        return self.settings.workers, len(self.race.record().lanes)

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
    def do(self, command: Command) -> Outcome:
        """Carry out `command` (commands.py: every request of a run as data); a refusal raises
        UserError and changes nothing. Both kinds of run take handle.py's `handle`."""

    def serve_requests(self) -> list[Request]:
        """Apply what attached windows asked for (the owner's job; a view serves nothing)."""
        return []

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

    # state ------------------------------------------------------------------------------
    @property
    def resting(self) -> bool:
        """True while no worker trains (paused; attached: paused or ended as last seen by
        progress()): the showcase player then has no CPU budget."""
        return self._pause.is_set()

    @property
    def gone(self) -> str | None:
        """Why the run stopped because its directory vanished, if it did (the owner's monitor
        finds out; a view has no workers to stop)."""
        return None

    def check_run_dir(self) -> str | None:
        """Look whether the run directory vanished; returns `gone`."""
        return self.gone

    def _check_knob_history(self) -> None:
        store = self.knobs.store
        store.history_values()
        if store.history_skipped:
            damaged = damaged_lines(store.history_skipped)
            self._note(f"warning: {store.history}: {damaged} skipped")

    def summary(self, interrupted: bool) -> str:
        """Where the run got to: its workers' step, their mean last evaluation return."""
        steps = [w["step"] for w in self.workers.progress()]
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


class Workers(ABC):
    """`run.workers`: who is in the run and what each worker does. The owner's are its child
    processes (processes.py); a view's are another process's, changed by asking that process
    (attached.py). Each is given what it reads of its run."""

    def __init__(
        self, path: Path, settings: Callable[[], RunSettings], merge_every: Callable[[], int]
    ):
        """`settings()`: the run's settings now; `merge_every()`: the merge frequency in force
        (what a refusal to add a worker quotes)."""
        self._path, self._settings, self._merge_every = path, settings, merge_every
        self._reported_dead: set[int] = set()

    @abstractmethod
    def progress(self) -> list[dict]:
        """Latest snapshot of each worker: its index, state ('crashed' for one that died),
        alive, exitcode, step and the other snapshot fields (workers/training/spec.py)."""

    @abstractmethod
    def add(self, lane: int | None = None) -> int:
        """Add a merging worker (in a race: to lane `lane`, else the smallest lane); returns
        its index."""

    @abstractmethod
    def remove(self, index: int) -> None:
        """Take worker `index` out of the run (it writes a checkpoint and leaves)."""

    @abstractmethod
    def restart(self, index: int) -> None:
        """Start a dead worker again."""

    @property
    def started(self) -> bool:
        """True once the run's start() has spawned them (a view never starts any)."""
        return False

    @property
    def restarting(self) -> bool:
        """True while a crashed worker waits for its automatic restart or is starting again."""
        return False

    def wait(self, poll_s: float = 0.5) -> None:
        """Block until every worker has ended (a view: returns at once, it has none)."""
        return None

    def pids(self) -> list[int]:
        """Operating-system ids of the live worker processes (a view's are another
        process's: none)."""
        return []

    def describe_threads(self) -> str:
        """How the workers use this machine's cores ("" when they are not this process's to
        start)."""
        return ""

    def dead(self) -> list[int]:
        """Workers that ended without finishing or being stopped, reported once each."""
        dead = [w["worker"] for w in self.progress() if w["state"] == "crashed"]
        new = [w for w in dead if w not in self._reported_dead]
        self._reported_dead.update(new)
        return new

    # checks both kinds make before acting (attached: before a request is sent) -------------
    def _check_restartable(self, index: int) -> None:
        if index in self._settings().removed:
            raise UserError(f"worker {index} was removed from the run; add a new one instead")
        if not 0 <= index < self._settings().workers:
            raise UserError(
                f"worker {index} is not in the run (workers: {self._settings().active})"
            )

    def _check_merged_weights(self, lane: int | None = None) -> None:
        """A new worker starts from its pool's merged weights: refuse it while there are none
        (in a race the pool is lane `lane`'s: RaceControl.lane_for_new)."""
        if not merged_path(self._path, lane).exists():
            raise UserError(
                "a new worker starts from the merged weights and there are none yet: add it "
                f"after the first merge (every {self._merge_every()} "
                "steps)"
            )

    def _check_removable(self, index: int) -> None:
        s = self._settings()
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
