"""The race table: one row per lane, ranked by how soon and how much each lane learned per second
of training whatever the reward's sign or scale (scores.py), how sure it is, and the merge
gain over a lane that never merges. From the workers' records, so that the window, the command
line and a run read later rank a race the same way. No GUI: the window draws the rows."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from workers.race.scores import SMOOTH, LaneEpisodes, race_clock, training_spans
from workers.rundir.records import (
    Crashed,
    Episode,
    Eval,
    KnobRecord,
    KnobsApplied,
    Pause,
    Pretraining,
    Record,
    Resume,
    Resumed,
    Seeding,
    StartedFresh,
    StartedFromMerged,
    Stop,
    Train,
)

FRACTIONS = (0.5, 0.75, 0.9)  # thresholds, as fractions from the starting level to the top
MIN_EPISODES = 10  # each lane's, before a leader is named: a spread from fewer is not trusted
OFF = (Pause, Stop, Crashed)  # a worker trains no more after these, until one of:
ON = (Resume, Resumed, StartedFromMerged, StartedFresh, Seeding, Pretraining, Episode, Train)


@dataclass(frozen=True)
class Gain:
    """A merging lane against the lane that never merges, at one threshold: how many times
    fewer agent steps per worker and how much less training time it needed."""

    steps: float
    time: float
    at_least: bool = False  # the never-merging lane has not got there yet: at least this


@dataclass
class LaneRow:
    lane: int
    workers: tuple[int, ...]
    knobs: dict[str, int | float]  # only the knobs in which the lanes differ
    merges: bool
    steps: float  # agent steps per worker (mean over the lane's workers)
    steps_per_s: float  # per worker (mean)
    ret: float | None  # the smoothed training return now (per worker: the workers' mean)
    eval_ret: float | None  # the latest evaluation's mean return (no exploration noise)
    eval_episodes: int  # the episodes behind it, over the lane's workers
    episodes: int  # training episodes finished in the race
    score: float | None  # mean normalised return over the race's training time
    spread: float  # about 95 % of the score's bootstrap replicas lie within +- this
    # threshold -> (seconds of race training time, agent steps per worker) when first reached
    reached: dict[float, tuple[float, float] | None] = field(default_factory=dict)
    gain: dict[float, Gain | None] = field(default_factory=dict)  # merging lanes vs control
    leader: bool = False
    # (seconds after the race's start, the lane's mean agent step, its smoothed return)
    curve: list[tuple[float, float, float]] = field(default_factory=list)


@dataclass
class RaceTable:
    rows: list[LaneRow]  # best first
    thresholds: list[float]  # the returns whose first crossing the table times
    start_level: float | None
    top: float | None
    top_from: str  # "published" (the task's final return) or "best" (the best lane's)
    clock: float  # seconds of training since the race began (pauses and stops left out)
    warmup: float | None  # of them, seeding and pretraining (a race from the run's start)
    verdict: str  # who leads, or why nobody does
    control: int | None  # the lane that never merges, which the merge gain is against
    note: str = ""  # lanes of different sizes: the figures are per worker


class RaceTracker:
    """Follows the records of a run's workers; `table` ranks the lanes of the race now."""

    def __init__(self, published_final: float | None = None, seed_steps: int | None = None):
        """`published_final`: the task's published final return (the top of the scale;
        without one, the best smoothed return any lane has reached). `seed_steps`: where a
        worker's seeding and pretraining end (its first record past them)."""
        self.published_final = published_final
        self.seed_steps = seed_steps
        self.applied: dict[int, list[tuple[float, int, int | None]]] = defaultdict(list)
        self.episodes: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
        self.evals: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
        self.onoff: dict[int, list[tuple[float, bool]]] = defaultdict(list)  # (time, training)
        self.warmed: dict[int, float] = {}  # a worker's first record past seeding, pretraining
        self._cache: tuple[tuple | None, dict] = (None, {})

    def ingest(self, records: Iterable[Record]) -> None:
        for r in records:
            if not isinstance(r.worker, int):
                continue
            w, changes = r.worker, self.onoff[r.worker]
            if isinstance(r, OFF):
                changes.append((r.time, False))
            elif isinstance(r, ON) and changes and not changes[-1][1]:
                changes.append((r.time, True))  # back after a pause or stop
            if isinstance(r, KnobsApplied):
                self.applied[w].append((r.time, r.version, r.lane))
            elif isinstance(r, Episode):
                self.episodes[w].append((r.time, float(r.step or 0), r.ret))
            elif isinstance(r, Eval):
                self.evals[w].append((r.time, r.ret, max(len(r.returns), 1)))
            past = self.seed_steps is not None and r.step is not None and r.step > self.seed_steps
            if past and w not in self.warmed and not isinstance(r, (Seeding, Pretraining)):
                self.warmed[w] = r.time

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

    def _lane_at(self, worker: int, when: float) -> int | None:
        lane = None
        for t, _, applied_lane in self.applied[worker]:
            if t > when:
                break
            lane = applied_lane
        return lane

    # the table ----------------------------------------------------------------------------
    def table(self, record: KnobRecord, progress: list[dict], now: float) -> RaceTable | None:
        """The race in `record` ranked now (None outside a race, or before it began).
        `progress`: the run's worker snapshots (step, steps_per_s); `now`: time.time()."""
        start = self.start_time(record)
        if not record.lanes or start is None:
            return None
        racing = [w for lane in record.lanes for w in lane]
        spans = training_spans(self.onoff, racing, start, now)
        clock = float(race_clock(spans, np.array([now]))[0])
        key = (
            self.published_final,
            record.lanes,
            record.solo_lanes,
            start,
            sum(len(e) for e in self.episodes.values()),
            sum(len(c) for c in self.onoff.values()),
        )
        if self._cache[0] != key:
            self._cache = (key, self._lanes(record, start, spans))
        made = self._cache[1]
        differ = [k for k in record.values if len({str(v.get(k)) for v in record.lane_values}) > 1]
        snapshot = {w["worker"]: w for w in progress}
        rows = []
        for n, workers in enumerate(record.lanes):
            lane = made["lanes"][n]
            seen = [snapshot[w] for w in workers if w in snapshot]
            latest = [self.evals[w][-1] for w in workers if self._evals_after(w, start)]
            score, spread = lane.score(clock)
            rows.append(
                LaneRow(
                    lane=n,
                    workers=workers,
                    knobs={k: record.lane_values[n][k] for k in differ},
                    merges=record.merges(n),
                    steps=_mean([w["step"] for w in seen]) or 0.0,
                    steps_per_s=_mean([w["steps_per_s"] for w in seen]) or 0.0,
                    ret=lane.curve[-1][2] if lane.curve else None,
                    eval_ret=_mean([r for _, r, _ in latest]),
                    eval_episodes=sum(count for *_, count in latest),
                    episodes=lane.episodes,
                    score=score,
                    spread=spread,
                    reached=dict(lane.reached),
                    curve=lane.curve,
                )
            )
        control = next((n for n in range(len(record.lanes)) if not record.merges(n)), None)
        if control is not None:
            _gains(rows, control, made["thresholds"], clock)
        rows.sort(key=lambda row: math.inf if row.score is None else -row.score)  # unranked last
        verdict = _verdict(rows)
        sizes = {len(lane) for lane in record.lanes}
        note = ""
        if len(sizes) > 1:
            shape = "/".join(str(len(lane)) for lane in record.lanes)
            note = f"lanes differ in size ({shape} workers): every figure is per worker"
        return RaceTable(
            rows=rows,
            thresholds=made["thresholds"],
            start_level=made["start"],
            top=made["top"],
            top_from=made["top_from"],
            clock=clock,
            warmup=self._warmup(racing, start, spans),
            verdict=verdict,
            control=control,
            note=note,
        )

    def _evals_after(self, worker: int, start: float) -> bool:
        return bool(self.evals[worker]) and self.evals[worker][-1][0] >= start

    def _warmup(self, racing: list[int], start: float, spans: np.ndarray) -> float | None:
        """Race training time spent seeding and pretraining, the same for every lane: until
        the last worker's first record past them (None: a race started mid-run, or one whose
        workers are not all past them yet)."""
        ends = [self.warmed.get(w) for w in racing]
        if None in ends or max(ends) < start or min(ends) < start:
            return None
        return float(race_clock(spans, np.array([max(ends)]))[0])

    def _lanes(self, record: KnobRecord, start: float, spans: np.ndarray) -> dict:
        """What changes only with new episodes (minutes apart on a CPU), made once for each:
        every lane's episodes, curve, bootstrap and threshold crossings."""
        own = {
            w: [
                (t, s, r) for t, s, r in self.episodes[w] if t >= start and self._lane_at(w, t) == n
            ]
            for n, workers in enumerate(record.lanes)
            for w in workers
        }
        lanes = [
            LaneEpisodes(workers, own, start, lambda times: race_clock(spans, times))
            for workers in record.lanes
        ]
        before = [
            np.mean([r for t, _, r in self.episodes[w] if t < start][-SMOOTH:])
            for w in own
            if any(t < start for t, _, _ in self.episodes[w])
        ]
        firsts = [own[w][0][2] for w in own if own[w]]
        if before:  # a race started mid-run: where the run had got to
            start_level = float(np.mean(before))
        elif firsts:  # a race from the start: the first (random) episodes
            start_level = float(np.mean(firsts))
        else:
            start_level = None
        best = max((v for lane in lanes for *_, v in lane.curve), default=None)
        top, top_from = best, "best"
        if self.published_final is not None:
            top, top_from = self.published_final, "published"
        thresholds: list[float] = []
        if start_level is not None and top is not None and top > start_level:
            span = top - start_level
            thresholds = [round(start_level + f * span, 1) for f in FRACTIONS]
            for lane in lanes:
                lane.normalise(start_level, span, thresholds)
        return {
            "lanes": lanes,
            "thresholds": thresholds,
            "start": start_level,
            "top": top,
            "top_from": top_from,
        }


def _gains(rows: list[LaneRow], control: int, thresholds: list[float], clock: float) -> None:
    """Each merging lane's gain over the never-merging lane `control` at each threshold."""
    reference = rows[control]
    for row in rows:
        if not row.merges:
            continue
        for level in thresholds:
            mine, theirs = row.reached.get(level), reference.reached.get(level)
            if mine is None:
                row.gain[level] = None
                continue
            seconds, steps = mine
            if theirs is not None:
                row.gain[level] = Gain(theirs[1] / max(steps, 1.0), theirs[0] / max(seconds, 1e-9))
            else:  # not there yet: it has needed at least what it has done so far
                row.gain[level] = Gain(
                    reference.steps / max(steps, 1.0), clock / max(seconds, 1e-9), at_least=True
                )


def _verdict(rows: list[LaneRow]) -> str:
    ranked = [row for row in rows if row.score is not None]
    if len(ranked) < len(rows) or any(row.episodes < MIN_EPISODES for row in rows):
        return f"too early to call: {MIN_EPISODES} episodes a lane first"
    first, second = ranked[0], ranked[1]
    combined = math.hypot(first.spread, second.spread)
    if first.score - second.score > combined:
        first.leader = True
        return f"lane {first.lane} leads"
    return "too close to call: the lead is within the spread"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
