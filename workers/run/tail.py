"""Following the run directory's metrics records as they are appended.

RecordTail reads each worker's file (and the showcase's) from where it stopped: the records are
queued for Run.new_events (events all of them; of progress snapshots, the newest per worker and
kind), and each worker's latest values are kept (Seen) as an attached run's progress, since it
has no shared snapshot of another process's workers.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from workers.rundir.lines import damaged_lines
from workers.rundir.paths import PLAYER_LOG, metrics_name
from workers.rundir.records import (
    Checkpoint,
    Crashed,
    Episode,
    Error,
    FirstUpdate,
    KnobsApplied,
    KnobsRefused,
    Merge,
    Pause,
    Pretraining,
    Record,
    Seeding,
    Stop,
    Train,
    parse_records,
)
from workers.training.spec import SNAPSHOT_FIELDS

ATTACHED_IDLE_S = 60.0  # an attached run's worker with no record for this long shows as idle
# Events kept for new_events when only progress() is being called (snapshots cannot pile up).
PENDING_MAX = 100_000
# Records that say nothing of whether a worker runs on, stopped or paused.
_NEUTRAL = (Checkpoint, Error, KnobsRefused)


@dataclass
class Seen:
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

    def see(self, record: Record) -> None:
        if record.step is not None:
            self.step = record.step
        self.heartbeat = max(self.heartbeat, record.time)
        # A worker logs its checkpoint after its stop record; anything else means it runs again.
        if not isinstance(record, (Stop, *_NEUTRAL)):
            self.ended = None
        if not isinstance(record, (Pause, KnobsApplied, *_NEUTRAL)):
            self.paused = False
        match record:
            case Episode():
                self.last_return = record.ret
            case Seeding():
                self.phase = "seeding"
            case Pretraining():
                self.phase, self.updates = "pretraining", record.updates
            case Train():
                self.phase, self.updates = "training", record.updates
                self.steps_per_s = record.steps_per_s
            case KnobsApplied():
                self.knob_version = record.version
            case Merge():
                self.merges += 1
            case FirstUpdate():
                self.first_update_s = record.seconds
            case Pause():
                self.paused = True
            case Stop():
                self.ended = "done" if record.reason == "done" else "stopped"
            case Error() if record.traceback is not None:  # the worker's crash, not a refusal
                self.ended = "crashed"
            case Crashed():  # the owner saw the process die (kill -9 writes nothing)
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


def tail_records(path: Path, size: int = 262_144) -> list[Record]:
    """The complete records in the last `size` bytes of a metrics file (damaged lines and
    a torn first or last line skipped)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - size))
            return parse_records(f.read())[0]
    except OSError:
        return []


def newest_error(path: Path, since: float) -> str | None:
    """The message of the newest "error" record in a worker's metrics file written after
    `since` (a time.time()), or None."""
    for record in reversed(tail_records(path, 65536)):  # errors come last
        if record.time < since:
            return None
        if isinstance(record, Error):
            return record.message.splitlines()[0][:300] if record.message else None
    return None


class RecordTail:
    """The records appended to a run's metrics files since the last poll."""

    def __init__(self, path: Path):
        self.path = path
        self._offsets: dict[str, int] = {}
        self._events: deque[Record] = deque(maxlen=PENDING_MAX)
        self._snapshots: dict[tuple, Record] = {}  # (worker, kind) -> newest not taken
        self._seen: dict[int, Seen] = {}

    def seen(self, index: int) -> Seen:
        """Worker `index`'s latest values as its records passed by."""
        return self._seen.setdefault(index, Seen())

    def take(self) -> list[Record]:
        """The records polled since the last take: every event, oldest first, then the
        newest progress snapshot of each worker and kind."""
        records = [*self._events, *self._snapshots.values()]
        self._events.clear()
        self._snapshots.clear()
        return records

    def poll(self, workers: int) -> list[str]:
        """Read what the first `workers` workers and the player appended: queued for take(),
        and noted per worker (seen). Returns warnings of damaged lines (skipped, never a
        crash)."""
        warnings = []
        sources = [(index, metrics_name(index)) for index in range(workers)]
        for index, name in [*sources, ("player", PLAYER_LOG)]:
            path = self.path / name
            if not path.exists():
                continue
            with open(path, "rb") as f:
                f.seek(self._offsets.get(name, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
            self._offsets[name] = self._offsets.get(name, 0) + end
            records, skipped = parse_records(data[:end], index)
            if skipped:
                warnings.append(f"warning: {self.path / name}: {damaged_lines(skipped)} skipped")
            for record in records:
                if record.LATEST_WINS:
                    self._snapshots.pop((index, record.KIND), None)  # to the end: oldest first
                    self._snapshots[(index, record.KIND)] = record
                else:
                    self._events.append(record)
                if index != "player":
                    self.seen(index).see(record)
        return warnings
