"""Live knobs as data: one validated, versioned record in the run directory, plus its history.
A race splits the merging workers into lanes, each with its own values and merge pool; the
record holds the lanes, so a worker learns its lane and its values from one atomic read.

The viewer or the command line writes a new version; each worker polls between agent steps
(a stat() call when nothing changed) and applies the newest one. Out-of-range values are
refused with a message naming the knob and its range, and the record stays as it was.
Over 300 lines because every change of the record (a knob, a race, a promotion, a lane's
workers) and its rebuilding from the history are written on one page, under one lock.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from agent.config import Config, knobs_of, with_knobs
from agent.errors import ConfigError
from agent.knobs import KnobValue, KnobValues, knobs
from workers.rundir.directory import DirLock, atomic_write_json
from workers.rundir.lanes import Lane, Layout
from workers.rundir.lines import parse_lines
from workers.rundir.records import KnobChange, KnobRecord

KNOBS = "knobs.json"
HISTORY = "knobs.jsonl"


def run_knobs(cfg: Config, merge_every: int) -> dict[str, KnobValue]:
    """Every live knob's value in a run: the agent's from its config, the merge frequency."""
    return {**knobs_of(cfg), "merge_every": merge_every}


def validate_knobs(cfg: Config, values: Mapping[str, object]) -> KnobValues:
    """Full, validated knob values: the agent's knobs with the config they go into (its
    checks across fields), the workers' (merge frequency) against the knob table."""
    values = dict(values)
    worker = {k: values.pop(k) for k in list(values) if k in knobs("workers")}
    checked = KnobValues({**knobs_of(with_knobs(cfg, **values)), **worker})
    on_cuda = cfg.device != "cpu" and (cfg.device != "auto" or torch.cuda.is_available())
    if checked["bf16"] and on_cuda:
        raise ConfigError(
            "bf16 is a CPU knob: on CUDA the workers compute in float32 with TF32 matmuls", "bf16"
        )
    return checked


def validate_record(
    cfg: Config, record: KnobRecord, layout: Callable[[KnobRecord], None] | None = None
) -> KnobRecord:
    """The record with its values and every lane's validated (ConfigError if any is not), as
    KnobValues (which a worker hands to its agent as they are); `layout` checks that its
    lanes fit the run (lanes.py check_layout, with run.json's workers)."""
    if len(record.lane_values) != len(record.lanes):
        raise ConfigError("the knob record's lanes and their values do not match", "lanes")
    if any(not 0 <= n < len(record.lanes) for n in record.solo_lanes):
        raise ConfigError("the knob record keeps a lane from merging that it does not have")
    if layout is not None:
        layout(record)
    return dataclasses.replace(
        record,
        values=validate_knobs(cfg, record.values),
        lane_values=tuple(validate_knobs(cfg, v) for v in record.lane_values),
    )


class KnobStore:
    """knobs.json holds the KnobRecord (version, values, the race's lanes); knobs.jsonl every
    version ever set (KnobChange)."""

    def __init__(self, run_path: str | Path):
        self.path = Path(run_path) / KNOBS
        self.history = Path(run_path) / HISTORY
        self.lock = DirLock(str(self.path) + ".lock", timeout=10)
        self._seen: tuple[int, int] | None = None
        self.history_skipped = 0  # damaged lines history_values passed over, the last time
        # Checks a record's lanes against the run's workers (the run sets it: lanes.py)
        self.layout: Callable[[KnobRecord], None] | None = None

    def initialise(
        self,
        cfg: Config,
        merge_every: int,
        layout: Layout = (),
        lanes: Sequence[Lane] = (),
        replicas: int = 1,
    ) -> None:
        """The first version: the run's values, and a race's lanes from the start (lane n's
        workers layout[n], its values the run's with lanes[n]'s changes; `lanes` holds every
        replica, lanes.py replicate)."""
        if self.path.exists():
            return
        record = self.new_race(cfg, run_knobs(cfg, merge_every), layout, lanes, 0, replicas)
        with self.lock:
            self._write(record, record.values, event="race" if layout else "")

    @staticmethod
    def new_race(
        cfg: Config,
        values: dict,
        layout: Layout,
        lanes: Sequence[Lane],
        version: int,
        replicas: int = 1,
    ) -> KnobRecord:
        """A validated record of version `version` whose lanes (workers `layout`, `replicas`
        copies of each race lane in a row) run with `values` changed by their own (ConfigError
        naming the lane for a refused value)."""
        values = dict(validate_knobs(cfg, values))
        lane_values = []
        for n, changes in enumerate([lane.changes for lane in lanes] or [{}] * len(layout)):
            unknown = sorted(set(changes) - set(values))
            if unknown:
                lane = n // replicas
                raise ConfigError(f"lane {lane}: unknown knob(s): {', '.join(unknown)}", unknown[0])
            try:
                lane_values.append(dict(validate_knobs(cfg, {**values, **changes})))
            except ConfigError as err:
                raise ConfigError(f"lane {n // replicas}: {err}", err.field) from None
        return KnobRecord(
            version=version,
            values=values,
            lanes=tuple(tuple(workers) for workers in layout),
            lane_values=tuple(lane_values),
            pool=version,
            solo_lanes=tuple(n for n, lane in enumerate(lanes) if not lane.merges),
            replicas=replicas if layout else 1,
        )

    def _write(
        self, record: KnobRecord, changes: dict, lane: int | None = None, event: str = ""
    ) -> None:
        atomic_write_json(self.path, record.to_json())
        change = KnobChange(
            version=record.version,
            changes=dict(changes),
            lane=lane,
            event=event,
            lanes=record.lanes,
            lane_values=record.lane_values,
            pool=record.pool,
            solo_lanes=record.solo_lanes,
            promoted_lane=record.promoted_lane,
            promoted_worker=record.promoted_worker,
            promoted_pool=record.promoted_pool,
            replicas=record.replicas,
        )
        with open(self.history, "a") as f:
            f.write(json.dumps(change.to_json()) + "\n")

    def read_record(self) -> KnobRecord:
        try:
            return KnobRecord.from_json(json.loads(self.path.read_bytes()))
        except RecursionError:  # nested thousands deep
            raise ConfigError(f"the knob record {self.path} is corrupt (nested too deep)") from None
        except (OSError, ValueError) as err:  # Malformed is a ValueError
            raise ConfigError(
                f"the knob record {self.path} is missing or corrupt ({err})"
            ) from None

    def read(self) -> tuple[int, dict]:
        """(version, the run's values) of knobs.json (ConfigError if unreadable)."""
        record = self.read_record()
        return record.version, record.values

    def history_record(self) -> KnobRecord | None:
        """The newest version in knobs.jsonl (every version there was validated before it was
        written), or None; damaged lines are skipped."""
        try:
            data = self.history.read_bytes()
        except OSError:
            return None
        changes, self.history_skipped = parse_lines(data, KnobChange)
        values = {}
        for change in changes:
            # A change for every worker, or a promotion: the winning lane's values became
            # the run's (a change of one lane's values leaves the run's as they are).
            if change.lane is None or change.event == "promote":
                values.update(change.changes)
        if not changes:
            return None
        last = changes[-1]
        return KnobRecord(
            version=last.version,
            values=values,
            lanes=last.lanes,
            lane_values=last.lane_values,
            pool=last.pool,
            solo_lanes=last.solo_lanes,
            promoted_lane=last.promoted_lane,
            promoted_worker=last.promoted_worker,
            promoted_pool=last.promoted_pool,
            replicas=last.replicas,
        )

    def history_values(self) -> tuple[int, dict] | None:
        record = self.history_record()
        return (record.version, record.values) if record is not None else None

    def last_good_record(self, cfg: Config) -> KnobRecord | None:
        """The newest valid record: knobs.json if it reads and validates (its lanes fitting the
        run, when `layout` is set), else the newest version of the history (the run's own
        values, never a code default), else None."""
        for source in (self.read_record, self.history_record):
            try:
                found = source()
                if found is not None:
                    return validate_record(cfg, found, self.layout)
            except ConfigError:
                continue
        return None

    def last_good(self, cfg: Config) -> tuple[int, dict] | None:
        record = self.last_good_record(cfg)
        return (record.version, record.values) if record is not None else None

    def _current(self, cfg: Config, in_force: Callable[[], tuple[int, dict]] | None) -> KnobRecord:
        """The record a change starts from: the last good one (the values in force, `in_force()`,
        when the history is unreadable too), at the newest version number seen."""
        good = self.last_good_record(cfg)
        if good is None and in_force is not None:
            version, values = in_force()
            good = KnobRecord(version=version, values=dict(values))
        if good is None:
            raise ConfigError(f"the knob record {self.path} and its history are unreadable")
        try:
            return dataclasses.replace(good, version=max(good.version, self.read_record().version))
        except ConfigError:
            return good

    def set(
        self,
        cfg: Config,
        in_force: Callable[[], tuple[int, dict]] | None = None,
        lane: int | None = None,
        **changes: object,
    ) -> int:
        """Validate and write a new version: `changes` for race lane `lane` (every replica of
        it), or (None) for the run and every lane. On error nothing is written. Returns the
        version. A damaged or refused record is replaced, from the last good values."""
        with self.lock:
            now = self._current(cfg, in_force)
            unknown = sorted(set(changes) - set(now.values))
            if unknown:
                raise ConfigError(f"unknown knob(s): {', '.join(unknown)}")
            if lane is not None and not 0 <= lane < now.race_lanes:
                raise ConfigError(f"there is no lane {lane} (lanes: {now.race_lanes})", "lanes")
            values = now.values
            if lane is None:
                values = dict(validate_knobs(cfg, {**now.values, **changes}))
            lane_values = []
            for n, old in enumerate(now.lane_values):
                if lane is None or n in now.copies(lane):
                    try:
                        old = dict(validate_knobs(cfg, {**old, **changes}))
                    except ConfigError as err:
                        raise ConfigError(f"lane {now.race_lane(n)}: {err}", err.field) from None
                lane_values.append(old)
            new = dataclasses.replace(
                now, version=now.version + 1, values=values, lane_values=tuple(lane_values)
            )
            self._write(new, changes, lane)
            return new.version

    def start_race(
        self,
        cfg: Config,
        layout: Layout,
        lanes: Sequence[Lane],
        in_force: Callable[[], tuple[int, dict]] | None = None,
        replicas: int = 1,
    ) -> int:
        """Split the workers as `layout` says, each lane (`replicas` copies of each race lane in
        a row) with the values in force changed by its own: new merge pools (the version is
        their pool). Returns the version."""
        with self.lock:
            now = self._current(cfg, in_force)
            new = self.new_race(cfg, now.values, layout, lanes, now.version + 1, replicas)
            self._write(new, {}, event="race")
            return new.version

    def promote(
        self,
        cfg: Config,
        lane: int,
        in_force: Callable[[], tuple[int, dict]] | None = None,
        weights: bool = True,
        from_worker: int | None = None,
    ) -> int:
        """End the race: lane `lane`'s values (an entry of the record's lanes: one replica)
        become every worker's, and the lanes one merge pool again. `weights`: every worker
        also takes the lane's weights as they are now (its workers' mean, or for a lane that
        never merged `from_worker`'s own); else the next merge averages them all. Returns the
        version."""
        with self.lock:
            now = self._current(cfg, in_force)
            if not 0 <= lane < len(now.lanes):
                raise ConfigError(
                    f"there is no lane {lane} to promote (lanes: {len(now.lanes)})", "lanes"
                )
            values = now.lane_values[lane]
            changes = {k: v for k, v in values.items() if now.values.get(k) != v}
            new = KnobRecord(
                version=now.version + 1,
                values=values,
                pool=now.version + 1,
                promoted_lane=lane if weights else None,
                promoted_worker=from_worker if weights else None,
                promoted_pool=now.pool if weights else None,
            )
            self._write(new, changes, lane, event="promote")
            return new.version

    def move_workers(
        self,
        cfg: Config,
        lanes: Layout,
        in_force: Callable[[], tuple[int, dict]] | None = None,
    ) -> int:
        """The same lanes and pools with other workers (one added to a lane, one removed)."""
        with self.lock:
            now = self._current(cfg, in_force)
            if len(lanes) != len(now.lanes):
                raise ConfigError("moving workers keeps the number of lanes", "lanes")
            new = dataclasses.replace(
                now, version=now.version + 1, lanes=tuple(tuple(x) for x in lanes)
            )
            self._write(new, {}, event="lanes")
            return new.version

    def poll(self, seen_version: int) -> KnobRecord | None:
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
        record = self.read_record()
        return record if record.version > seen_version else None
