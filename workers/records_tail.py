"""Following the run directory's metrics records as they are appended.

RecordTail reads each worker's file (and the showcase's) from where it stopped: the records are
queued for Run.new_events, and each worker's latest values are kept (Seen) as an attached run's
progress, since it has no shared snapshot of another process's workers.
"""

from __future__ import annotations

import json
import math
import numbers
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from workers.paths import PLAYER_LOG, metrics_name
from workers.rundir import damaged_lines, parse_jsonl
from workers.worker_spec import SNAPSHOT_FIELDS

ATTACHED_IDLE_S = 60.0  # an attached run's worker with no record for this long shows as idle
PENDING_MAX = 100_000  # records kept for new_events when only progress() is being called


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


def is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def tail_records(path: Path, size: int = 262_144) -> list[dict]:
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


def newest_error(path: Path, since: float) -> str | None:
    """The message of the newest "error" record in a worker's metrics file written after
    `since` (a time.time()), or None."""
    for record in reversed(tail_records(path, 65536)):  # errors come last
        if not is_number(record.get("time")) or record["time"] < since:
            return None
        if record.get("kind") == "error":
            return str(record.get("message", "")).splitlines()[0][:300] or None
    return None


class RecordTail:
    """The records appended to a run's metrics files since the last poll."""

    def __init__(self, path: Path):
        self.path = path
        self._offsets: dict[str, int] = {}
        self._pending: deque[dict] = deque(maxlen=PENDING_MAX)
        self._seen: dict[int, Seen] = {}

    def seen(self, index: int) -> Seen:
        """Worker `index`'s latest values as its records passed by."""
        return self._seen.setdefault(index, Seen())

    def take(self) -> list[dict]:
        """The records polled since the last take, oldest first."""
        events = list(self._pending)
        self._pending.clear()
        return events

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
            records, skipped = parse_jsonl(data[:end])
            if skipped:
                warnings.append(f"warning: {self.path / name}: {damaged_lines(skipped)} skipped")
            for record in records:
                event = {"worker": index, **record}
                self._pending.append(event)
                if index != "player":
                    self.seen(index).see(event)
        return warnings
