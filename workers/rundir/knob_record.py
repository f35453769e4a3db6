"""Live knobs as data: one validated, versioned record in the run directory, plus its history.

The viewer or the command line writes a new version; each worker polls between agent steps
(a stat() call when nothing changed) and applies the newest one. Out-of-range values are
refused with a message naming the knob and its range, and the record stays as it was.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from agent.config import Config, knobs_of, with_knobs
from agent.errors import ConfigError
from agent.knobs import KnobValues, knobs
from workers.rundir.directory import DirLock, atomic_write_json
from workers.rundir.lines import parse_lines
from workers.rundir.records import KnobChange, KnobRecord

KNOBS = "knobs.json"
HISTORY = "knobs.jsonl"


def run_knobs(cfg: Config, merge_every: int) -> dict[str, int | float]:
    """Every live knob's value in a run: the agent's from its config, the merge frequency."""
    return {**knobs_of(cfg), "merge_every": merge_every}


def validate_knobs(cfg: Config, values: Mapping[str, object]) -> KnobValues:
    """Full, validated knob values: the agent's knobs with the config they go into (its
    checks across fields), the workers' (merge frequency) against the knob table."""
    values = dict(values)
    worker = {k: values.pop(k) for k in list(values) if k in knobs("workers")}
    return KnobValues({**knobs_of(with_knobs(cfg, **values)), **worker})


class KnobStore:
    """knobs.json holds {"version", "values"}; knobs.jsonl every version ever set."""

    def __init__(self, run_path: str | Path):
        self.path = Path(run_path) / KNOBS
        self.history = Path(run_path) / HISTORY
        self.lock = DirLock(str(self.path) + ".lock", timeout=10)
        self._seen: tuple[int, int] | None = None
        self.history_skipped = 0  # damaged lines history_values passed over, the last time

    def initialise(self, cfg: Config, merge_every: int) -> None:
        if self.path.exists():
            return
        values = validate_knobs(cfg, run_knobs(cfg, merge_every))
        with self.lock:
            self._write(0, values, values)

    def _write(self, version: int, values: dict, changes: dict) -> None:
        atomic_write_json(self.path, KnobRecord(version=version, values=dict(values)).to_json())
        change = KnobChange(version=version, changes=dict(changes))
        with open(self.history, "a") as f:
            f.write(json.dumps(change.to_json()) + "\n")

    def read(self) -> tuple[int, dict]:
        try:
            record = KnobRecord.from_json(json.loads(self.path.read_bytes()))
        except (OSError, ValueError) as err:  # Malformed is a ValueError
            raise ConfigError(
                f"the knob record {self.path} is missing or corrupt ({err})"
            ) from None
        return record.version, record.values

    def history_values(self) -> tuple[int, dict] | None:
        """The newest version in knobs.jsonl (every version there was validated before it was
        written), or None; damaged lines are skipped."""
        try:
            data = self.history.read_bytes()
        except OSError:
            return None
        changes, self.history_skipped = parse_lines(data, KnobChange)
        values = {}
        for change in changes:
            values.update(change.changes)
        return (changes[-1].version, values) if changes else None

    def last_good(self, cfg: Config) -> tuple[int, dict] | None:
        """The newest valid knob values: knobs.json if it reads and validates, else the newest
        version of the history (the run's own values, never a code default), else None."""
        for source in (self.read, self.history_values):
            try:
                found = source()
                if found is not None:
                    return found[0], validate_knobs(cfg, found[1])
            except ConfigError:
                continue
        return None

    def set(
        self,
        cfg: Config,
        in_force: Callable[[], tuple[int, dict]] | None = None,
        **changes: object,
    ) -> int:
        """Validate and write a new version; on error nothing is written. Returns the version.
        A damaged or refused record is replaced, from the last good values (`in_force()`, the
        values the workers run with, when the history is unreadable too)."""
        with self.lock:
            good = self.last_good(cfg) or (in_force() if in_force else None)
            if good is None:
                raise ConfigError(f"the knob record {self.path} and its history are unreadable")
            version, values = good
            try:
                version = max(version, self.read()[0])
            except ConfigError:
                pass
            unknown = sorted(set(changes) - set(values))
            if unknown:
                raise ConfigError(f"unknown knob(s): {', '.join(unknown)}")
            new = validate_knobs(cfg, {**values, **changes})
            self._write(version + 1, new, changes)
            return version + 1

    def poll(self, seen_version: int) -> tuple[int, dict] | None:
        """The newest record if it is newer than seen_version, else None (cheap when unchanged).
        An unreadable record is a ConfigError, once per change of the file (it is replaced
        atomically, so a reader never sees half of one: this is damage)."""
        try:
            stat = self.path.stat()
        except OSError:
            return None
        # Each write is a new file (atomic replace): its inode tells even two writes apart
        # that the file system's clock gives the same time.
        seen = (stat.st_ino, stat.st_mtime_ns)
        if seen == self._seen:
            return None
        self._seen = seen
        version, values = self.read()
        return (version, values) if version > seen_version else None


def agent_knobs(values: Mapping[str, object]) -> dict:
    """The knobs the agent applies itself (the others are the worker's)."""
    return {k: v for k, v in values.items() if k in knobs("agent")}
