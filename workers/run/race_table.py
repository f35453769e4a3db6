"""The race table: one row per lane, ranked by how much return it has gathered per wall-second
since the race began. Built from the workers' records (which lane each worker ran in, from its
knobs_applied records; its episodes and evaluations), so that the window, the command line and
a run read later all rank a race the same way. No GUI here: the window draws the rows.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agent.published import published_curve
from workers.rundir.paths import metrics_name
from workers.rundir.records import (
    Episode,
    Eval,
    KnobRecord,
    KnobsApplied,
    Record,
    parse_records,
)

SMOOTH = 5  # a worker's return now: the mean of its last SMOOTH episodes
FRACTIONS = (0.5, 0.75, 0.9)  # thresholds: of the published final return, else the best seen


@dataclass
class LaneRow:
    lane: int
    workers: tuple[int, ...]
    knobs: dict[str, int | float]  # only the knobs in which the lanes differ
    steps: float  # agent steps per worker (mean over the lane's workers)
    steps_per_s: float  # per worker (mean)
    ret: float | None  # the smoothed episode return now (mean over the lane's workers)
    best_eval: float | None
    reached: dict[float, float | None]  # threshold -> seconds after the race's start
    area: float  # return x seconds under the smoothed return since the race's start
    leader: bool = False
    # (seconds after the race's start, the lane's mean agent step, its smoothed return)
    curve: list[tuple[float, float, float]] = field(default_factory=list)


class RaceTracker:
    """Follows the records of a run's workers; `rows` ranks the lanes of the race now."""

    def __init__(self, published_final: float | None = None):
        """`published_final`: the task's published final return (thresholds are fractions of
        it; without one, of the best smoothed return any lane has reached)."""
        self.published_final = published_final
        self.applied: dict[int, list[tuple[float, int, int | None]]] = defaultdict(list)
        self.episodes: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
        self.evals: dict[int, list[tuple[float, float]]] = defaultdict(list)
        self._curves: tuple[tuple | None, list] = (None, [])  # (what they were made of, curves)

    def ingest(self, records: Iterable[Record]) -> None:
        for r in records:
            if not isinstance(r.worker, int):
                continue
            if isinstance(r, KnobsApplied):
                self.applied[r.worker].append((r.time, r.version, r.lane))
            elif isinstance(r, Episode):
                self.episodes[r.worker].append((r.time, float(r.step or 0), r.ret))
            elif isinstance(r, Eval):
                self.evals[r.worker].append((r.time, r.ret))

    def start_time(self, record: KnobRecord) -> float | None:
        """When the race in `record` began: the first worker's applying the version that
        formed its lanes."""
        times = [
            t
            for applied in self.applied.values()
            for t, version, lane in applied
            if version >= record.pool and lane is not None
        ]
        return min(times, default=None)

    def _lane_at(self, worker: int, time: float) -> int | None:
        lane = None
        for t, _, applied_lane in self.applied[worker]:
            if t > time:
                break
            lane = applied_lane
        return lane

    def _curve(self, lane: int, workers: tuple[int, ...], start: float) -> list[tuple]:
        """(seconds after start, mean step, the lane's smoothed return) at each of its
        episodes."""
        events = sorted(
            (t, w, step, ret)
            for w in workers
            for t, step, ret in self.episodes[w]
            if t >= start and self._lane_at(w, t) == lane
        )
        last: dict[int, deque] = defaultdict(lambda: deque(maxlen=SMOOTH))
        steps: dict[int, float] = {}
        curve = []
        for t, w, step, ret in events:
            last[w].append(ret)
            steps[w] = step
            means = [sum(d) / len(d) for d in last.values()]
            curve.append((t - start, sum(steps.values()) / len(steps), sum(means) / len(means)))
        return curve

    def rows(self, record: KnobRecord, progress: list[dict], now: float) -> list[LaneRow]:
        """The lanes of `record`'s race, best first (empty outside a race). `progress`: the
        run's worker snapshots (step, steps_per_s); `now`: time.time()."""
        start = self.start_time(record)
        if not record.lanes or start is None:
            return []
        snapshot = {w["worker"]: w for w in progress}
        differ = [k for k in record.values if len({str(v.get(k)) for v in record.lane_values}) > 1]
        rows = []
        # The curves change only with new episodes (minutes apart on a CPU): made once each.
        key = (record.lanes, start, sum(len(e) for e in self.episodes.values()))
        if self._curves[0] != key:
            curves = [self._curve(n, workers, start) for n, workers in enumerate(record.lanes)]
            self._curves = (key, curves)
        for n, workers in enumerate(record.lanes):
            curve = self._curves[1][n]
            seen = [snapshot[w] for w in workers if w in snapshot]
            evals = [r for w in workers for t, r in self.evals[w] if t >= start]
            rows.append(
                LaneRow(
                    lane=n,
                    workers=workers,
                    knobs={k: record.lane_values[n][k] for k in differ},
                    steps=_mean([w["step"] for w in seen]) or 0.0,
                    steps_per_s=_mean([w["steps_per_s"] for w in seen]) or 0.0,
                    ret=curve[-1][2] if curve else None,
                    best_eval=max(evals, default=None),
                    reached={},
                    area=_area(curve, now - start),
                    curve=curve,
                )
            )
        self._thresholds(rows)
        rows.sort(key=lambda row: -row.area)
        if rows and rows[0].area > 0:
            rows[0].leader = True
        return rows

    def thresholds(self, rows: list[LaneRow]) -> list[float]:
        """The returns whose first crossing the table times."""
        if self.published_final is not None:
            top = self.published_final
        else:
            top = max((v for row in rows for *_, v in row.curve), default=0.0)
        return [round(f * top, 1) for f in FRACTIONS] if top > 0 else []

    def _thresholds(self, rows: list[LaneRow]) -> None:
        for level in self.thresholds(rows):
            for row in rows:
                row.reached[level] = next((t for t, _, v in row.curve if v >= level), None)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _area(curve: list[tuple[float, float, float]], until: float) -> float:
    """The area under a step curve that holds each value until the next, the last until
    `until` (nothing before its first point: a lane with no episode has gathered nothing)."""
    area = 0.0
    ends = [t for t, *_ in curve[1:]] + [max(until, curve[-1][0])] if curve else []
    for (t, _, v), t_next in zip(curve, ends):
        area += v * (t_next - t)
    return area


def race_text(rows: list[LaneRow], thresholds: list[float]) -> str:
    """The table as plain text (the command line's summary, BENCHMARKS.md)."""
    head = ["lane", "knobs", "steps/worker", "steps/s", "return", "best eval"]
    head += [f"t>={level:g}" for level in thresholds] + ["area (return x min)", ""]
    lines = [head]
    for row in rows:
        knobs = ",".join(f"{k}={v}" for k, v in row.knobs.items()) or "-"
        cells = [
            str(row.lane),
            knobs,
            f"{row.steps:.0f}",
            f"{row.steps_per_s:.2f}",
            "-" if row.ret is None else f"{row.ret:.1f}",
            "-" if row.best_eval is None else f"{row.best_eval:.1f}",
        ]
        cells += [_clock(row.reached.get(level)) for level in thresholds]
        cells += [f"{row.area / 60:.0f}", "leader" if row.leader else ""]
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def race_of(path: Path, record: KnobRecord, progress: list[dict], task: str) -> str:
    """The race table of the run in `path` as text, read from its files ("" outside a race)."""
    if not record.lanes:
        return ""
    curve = published_curve(task)
    tracker = RaceTracker(float(curve[1][-1]) if curve is not None else None)
    for worker in {w for lane in record.lanes for w in lane}:
        try:
            tracker.ingest(parse_records((path / metrics_name(worker)).read_bytes(), worker)[0])
        except OSError:
            continue  # a worker without a file yet: no row data
    rows = tracker.rows(record, progress, time.time())
    return race_text(rows, tracker.thresholds(rows))
