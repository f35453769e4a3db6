"""The race table: one row per lane, ranked by how soon and how much each lane learned per second
of training, whatever the reward's sign or scale. Built from the workers' records (which lane
each worker ran in, from its knobs_applied records; its episodes, evaluations, pauses and
stops), so that the window, the command line and a run read later all rank a race the same way.
No GUI here: the window draws the rows.

A lane's score is its smoothed training return normalised between the race's starting level
(0) and the top (1: the task's published final return, else the best any lane reached),
averaged over the race's training time (pauses and stops left out; before its first episode a
lane is at the starting level). Its spread comes from a bootstrap over its episodes; a lane
leads only when its lead is larger than the two lanes' spreads together.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agent.published import published_curve
from workers.rundir.paths import metrics_name
from workers.rundir.records import (
    Crashed,
    Episode,
    Eval,
    KnobRecord,
    KnobsApplied,
    Pause,
    Pretraining,
    Record,
    Seeding,
    Stop,
    parse_records,
)

SMOOTH = 5  # a worker's return now: the mean of its last SMOOTH episodes
FRACTIONS = (0.5, 0.75, 0.9)  # thresholds, as fractions from the starting level to the top
REPLICAS = 100  # bootstrap replicas of each lane's episodes
MIN_EPISODES = 3  # episodes each lane needs in the race before a leader is named
OFF = (Pause, Stop, Crashed)  # a worker trains no more after these until its next record


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

    @property
    def published_final(self) -> float | None:
        return self._published

    @published_final.setter
    def published_final(self, value: float | None) -> None:
        self._published = value
        self._cache = (None, {})

    def ingest(self, records: Iterable[Record]) -> None:
        for r in records:
            if not isinstance(r.worker, int):
                continue
            w, changes = r.worker, self.onoff[r.worker]
            if isinstance(r, OFF):
                changes.append((r.time, False))
            elif changes and not changes[-1][1]:
                changes.append((r.time, True))  # a record after a pause or stop: training
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

    # the race clock ---------------------------------------------------------------------------
    def _training_spans(self, workers: Iterable[int], start: float, now: float) -> np.ndarray:
        """(K, 2) the stretches of wall time after `start` in which some worker of the race
        trained: a pause or stop of the whole run is left out."""
        spans = []
        for w in workers:
            on, since = True, start
            for t, training in sorted(self.onoff[w]):
                if t <= start:
                    on = training
                    continue
                if on and not training:
                    spans.append((since, min(t, now)))
                elif training and not on:
                    since = t
                on = training
            if on:
                spans.append((since, now))
        merged: list[list[float]] = []
        for a, b in sorted(s for s in spans if s[1] > s[0]):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return np.array(merged, dtype=float).reshape(-1, 2)

    @staticmethod
    def _clock(spans: np.ndarray, times: np.ndarray) -> np.ndarray:
        """Seconds of training time from the race's start to each of `times`."""
        if not len(spans):
            return np.zeros_like(times, dtype=float)
        inside = np.clip(times[:, None], spans[:, 0], spans[:, 1]) - spans[:, 0]
        return inside.sum(axis=1)

    # the table ----------------------------------------------------------------------------
    def table(self, record: KnobRecord, progress: list[dict], now: float) -> RaceTable | None:
        """The race in `record` ranked now (None outside a race, or before it began).
        `progress`: the run's worker snapshots (step, steps_per_s); `now`: time.time()."""
        start = self.start_time(record)
        if not record.lanes or start is None:
            return None
        racing = [w for lane in record.lanes for w in lane]
        spans = self._training_spans(racing, start, now)
        clock = float(self._clock(spans, np.array([now]))[0])
        key = (
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
        return float(self._clock(spans, np.array([max(ends)]))[0])

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
        lanes = [_LaneEpisodes(workers, own, start, spans, self._clock) for workers in record.lanes]
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


class _LaneEpisodes:
    """One lane's episodes in the race: its smoothed curve and, once normalised, the area under
    it in every bootstrap replica (replica 0: the episodes as they were)."""

    def __init__(self, workers: tuple[int, ...], own: dict, start: float, spans, clock) -> None:
        self.workers = tuple(w for w in workers if own.get(w))
        self.episodes = sum(len(own.get(w, ())) for w in workers)
        events = sorted((t, w, s) for w in self.workers for t, s, _ in own[w])
        order = np.array([w for _, w, _ in events], dtype=int)
        self.times = np.array([t for t, _, _ in events], dtype=float)
        self.clock = clock(spans, self.times) if events else np.zeros(0)
        self.rets = {w: np.array([r for *_, r in own[w]], dtype=float) for w in self.workers}
        # Each worker's newest episode at each of the lane's episodes (-1: none yet).
        self.position = {w: np.cumsum(order == w) - 1 for w in self.workers}
        own_steps = {w: np.array([s for _, s, _ in own[w]], dtype=float) for w in self.workers}
        self.steps = self._mean_over_workers({w: own_steps[w][None, :] for w in self.workers})[0]
        values = self._values(None)
        self.curve = [
            (float(t - start), float(s), float(v))
            for t, s, v in zip(self.times, self.steps, values[0])
        ]
        self.reached: dict[float, tuple[float, float] | None] = {}
        self.area: np.ndarray | None = None  # per replica, up to the last episode
        self.last = np.zeros(1)
        self.last_clock = 0.0

    def _mean_over_workers(self, per_worker: dict[int, np.ndarray]) -> np.ndarray:
        """(R, E): at each lane episode, the mean over the workers seen so far of each one's
        newest value in `per_worker` ((R, n_w) each)."""
        count = next(iter(per_worker.values())).shape[0] if per_worker else 1
        total = np.zeros((count, len(self.times)))
        seen = np.zeros(len(self.times))
        for w, values in per_worker.items():
            position = self.position[w]
            has = position >= 0
            total[:, has] += values[:, position[has]]
            seen += has
        return total / np.maximum(seen, 1)

    def _values(self, rng: np.random.Generator | None) -> np.ndarray:
        """(R, E) the lane's smoothed return at each of its episodes: as they were (rng None),
        or that and REPLICAS residual-bootstrap replicas."""
        return self._mean_over_workers(
            {w: _smoothed(_replicas(self.rets[w], rng)) for w in self.workers}
        )

    def normalise(self, start_level: float, span: float, thresholds: list[float]) -> None:
        """The bootstrap areas under the normalised curve (0: the starting level, 1: the top)
        and the first crossing of each threshold."""
        if not len(self.times):
            self.reached = {level: None for level in thresholds}
            return
        values = (self._values(np.random.default_rng(0)) - start_level) / span
        self.area = (values[:, :-1] * np.diff(self.clock)).sum(axis=1)
        self.last, self.last_clock = values[:, -1], float(self.clock[-1])
        for level in thresholds:
            crossed = next((i for i, (*_, v) in enumerate(self.curve) if v >= level), None)
            self.reached[level] = (
                None
                if crossed is None
                else (float(self.clock[crossed]), float(self.steps[crossed]))
            )

    def score(self, clock: float) -> tuple[float | None, float]:
        """(the mean normalised return over `clock` seconds of race training, its spread:
        twice the bootstrap replicas' standard deviation). Before the lane's first episode it
        is at the starting level, 0."""
        if self.area is None or clock <= 0:
            return None, 0.0
        scores = (self.area + self.last * max(clock - self.last_clock, 0.0)) / clock
        return float(scores[0]), 2 * float(np.std(scores[1:]))


def _replicas(rets: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    """(R, n) a worker's returns: as they were, then (rng given) REPLICAS residual-bootstrap
    replicas: each episode's local trend (the mean of the 5 around it) plus a residual drawn
    from the worker's own, so that learning stays and the episode-to-episode noise is redrawn."""
    if rng is None:
        return rets[None, :]
    trend = np.convolve(np.pad(rets, 2, mode="edge"), np.ones(5) / 5, mode="valid")
    residuals = rets - trend
    draws = trend + residuals[rng.integers(0, len(rets), size=(REPLICAS, len(rets)))]
    return np.vstack([rets[None, :], draws])


def _smoothed(returns: np.ndarray) -> np.ndarray:
    """(R, n) each episode's trailing mean of the last SMOOTH returns (fewer at the start)."""
    sums = np.cumsum(np.pad(returns, ((0, 0), (1, 0))), axis=1)
    index = np.arange(1, returns.shape[1] + 1)
    low = np.maximum(index - SMOOTH, 0)
    return (sums[:, index] - sums[:, low]) / (index - low)


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
        return f"too early to call: each lane needs {MIN_EPISODES} episodes in the race"
    first, second = ranked[0], ranked[1]
    combined = math.hypot(first.spread, second.spread)
    if first.score - second.score > combined:
        first.leader = True
        return f"lane {first.lane} leads"
    return "too close to call: the lead is within the spread"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


# as text --------------------------------------------------------------------------------------
def race_text(table: RaceTable) -> str:
    """The table as plain text (the command line's, BENCHMARKS.md)."""
    levels = table.thresholds
    head = ["lane", "knobs", "workers", "steps/worker", "steps/s", "return", "eval (n)"]
    head += ["score", *(f"to {level_text(level)}" for level in levels), ""]
    lines = [head]
    for row in table.rows:
        cells = [
            str(row.lane),
            lane_knobs(row),
            str(len(row.workers)),
            f"{row.steps:.0f}",
            f"{row.steps_per_s:.2f}",
            "-" if row.ret is None else f"{row.ret:.1f}",
            "-" if row.eval_ret is None else f"{row.eval_ret:.1f} ({row.eval_episodes})",
            score_text(row),
        ]
        cells += [reached_text(row, level) for level in levels]
        cells.append("leads" if row.leader else "")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    text += [f"  {line}" for line in summary_lines(table)]
    return "\n".join(text)


def lane_knobs(row: LaneRow) -> str:
    parts = [f"{k}={v}" for k, v in row.knobs.items()] + ([] if row.merges else ["merge=off"])
    return ",".join(parts) or "-"


def score_text(row: LaneRow) -> str:
    return "-" if row.score is None else f"{row.score:.2f} +- {row.spread:.2f}"


def reached_text(row: LaneRow, level: float, unit: str = " steps") -> str:
    """When the lane first reached `level`, "m:ss, N steps" ("-": not yet)."""
    reached = row.reached.get(level)
    if reached is None:
        return "-"
    return f"{clock_text(reached[0])}, {reached[1]:.0f}{unit}"


def level_text(level: float) -> str:
    """A threshold as a column's name: whole numbers from 100 up (returns of hundreds)."""
    return f"{level:.0f}" if abs(level) >= 100 else f"{level:g}"


def gain_text(gain: Gain | None) -> str:
    if gain is None:
        return "not yet"
    more = ">" if gain.at_least else ""
    return f"{more}{gain.steps:.1f}x steps, {more}{gain.time:.1f}x time"


def summary_lines(table: RaceTable, short: bool = False) -> list[str]:
    """The verdict, what the score means (`short`: in brief, as the window says it beside a
    tooltip), seeding and pretraining, lanes of different sizes and the merge gain, a line
    each."""
    lines = [table.verdict]
    if table.start_level is not None and table.top is not None:
        top = "published final" if table.top_from == "published" else "best lane"
        scale = f"0 = start {table.start_level:.1f}, 1 = {table.top:.1f} ({top})"
        if short:
            lines.append(f"score: {scale}; mean over {clock_text(table.clock)} of training")
        else:
            lines.append(
                f"score: the smoothed training return, {scale}, averaged over "
                f"{clock_text(table.clock)} of training (pauses and stops left out); +- about "
                "95 % of a bootstrap over episodes; to X: training time, agent steps per worker"
            )
    if table.warmup is not None:
        lines.append(f"of which seeding and pretraining: {clock_text(table.warmup)}, every lane")
    if table.note:
        lines.append(table.note)
    if table.control is not None:
        for row in table.rows:
            if row.merges and row.gain:
                gains = "; ".join(
                    f"to {level_text(level)}: {gain_text(gain)}" for level, gain in row.gain.items()
                )
                lines.append(f"merge gain of lane {row.lane} over lane {table.control}: {gains}")
    return lines


def clock_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def race_of(
    path: Path, record: KnobRecord, progress: list[dict], task: str, seed_steps: int | None = None
) -> str:
    """The race table of the run in `path` as text, read from its files ("" outside a race)."""
    if not record.lanes:
        return ""
    curve = published_curve(task)
    tracker = RaceTracker(float(curve[1][-1]) if curve is not None else None, seed_steps)
    for worker in {w for lane in record.lanes for w in lane}:
        try:
            tracker.ingest(parse_records((path / metrics_name(worker)).read_bytes(), worker)[0])
        except OSError:
            continue  # a worker without a file yet: no row data
    table = tracker.table(record, progress, time.time())
    return "" if table is None else race_text(table)
