"""The race table: one row per lane (rows.py), ranked by how soon and how much each lane learned
per second of training whatever the reward's sign or scale (scores.py), with replicas their
mean (replicas.py), how sure it is and the merge gain over a lane that never merges
(verdict.py). From the workers' records, so that the window, the command line and a run read
later rank a race the same way. No GUI: the window draws the rows."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from workers.race.replicas import across, mean_curve
from workers.race.rows import LaneRow, RaceTable
from workers.race.scores import SMOOTH, LaneEpisodes, race_clock, training_spans, wall_at
from workers.race.verdict import gains, mean_reached, verdict
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
OFF = (Pause, Stop, Crashed)  # a worker trains no more after these, until one of:
ON = (Resume, Resumed, StartedFromMerged, StartedFresh, Seeding, Pretraining, Episode, Train)


class RaceTracker:
    """Follows the records of a run's workers; `table` ranks the lanes of the race now."""

    def __init__(
        self,
        published_final: float | None = None,
        seed_steps: int | None = None,
        top_note: str = "",
    ):
        """`published_final`: the task's published final return (the top of the scale;
        without one, the best smoothed return any lane has reached; `top_note` says why a
        task's published final is not used). `seed_steps`: where a worker's seeding and
        pretraining end (its first record past them)."""
        self.published_final = published_final
        self.top_note = top_note
        self.seed_steps = seed_steps
        self.applied: dict[int, list[tuple[float, int, int | None]]] = defaultdict(list)
        self.episodes: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
        self.evals: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
        self.onoff: dict[int, list[tuple[float, bool]]] = defaultdict(list)  # (time, training)
        self.warmed: dict[int, float] = {}  # a worker's first record past seeding, pretraining
        self.done: dict[int, list[float]] = defaultdict(list)  # when it trained all its steps
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
            elif isinstance(r, Stop) and r.reason == "done":
                self.done[w].append(r.time)
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
        end = self._end(record, racing, start, spans)
        ended = end is not None and end <= now
        if ended:  # the race as it stood at its end, however late it is looked at
            now = end
            spans = training_spans(self.onoff, racing, start, now)
        clock = float(race_clock(spans, np.array([now]))[0])
        key = (
            self.published_final,
            record.lanes,
            record.solo_lanes,
            start,
            sum(len(e) for e in self.episodes.values()),
            sum(len(c) for c in self.onoff.values()),
            now if ended else None,
        )
        if self._cache[0] != key:
            self._cache = (key, self._lanes(record, start, spans, now if ended else None))
        made = self._cache[1]
        differ = [k for k in record.values if len({str(v.get(k)) for v in record.lane_values}) > 1]
        snapshot = {w["worker"]: w for w in progress}
        thresholds = made["levels"]
        rows = []
        for n in range(record.race_lanes):
            copies = list(record.copies(n))
            pools = [made["lanes"][c] for c in copies]
            workers = tuple(w for c in copies for w in record.lanes[c])
            seen = [snapshot[w] for w in workers if w in snapshot]
            latest = [e for w in workers if (e := self._latest_eval(w, start, now)) is not None]
            reached = [{level: pool.reached.get(level) for level in thresholds} for pool in pools]
            scored = [pool.score(clock) for pool in pools]
            scores = [score for score, _ in scored]
            curve, band = pools[0].curve, []
            score, spread = scored[0]
            if len(pools) > 1:
                curve, band = mean_curve([pool.curve for pool in pools])
                score, spread = (None, 0.0) if None in scores else across(scores)
            rows.append(
                LaneRow(
                    lane=n,
                    workers=workers,
                    knobs={k: record.lane_values[copies[0]][k] for k in differ},
                    merges=record.merges(copies[0]),
                    steps=_mean([w["step"] for w in seen]) or 0.0,
                    steps_per_s=_mean([w["steps_per_s"] for w in seen]) or 0.0,
                    ret=curve[-1][2] if curve else None,
                    eval_ret=_mean([r for _, r, _ in latest]),
                    eval_episodes=sum(count for *_, count in latest),
                    episodes=sum(pool.episodes for pool in pools),
                    score=score,
                    spread=spread,
                    reached={level: mean_reached(reached, level) for level in thresholds},
                    curve=curve,
                    band=band,
                    replica_scores=scores,
                    replica_episodes=[pool.episodes for pool in pools],
                    replica_reached=reached,
                    replica_steps=[
                        _mean([snapshot[w]["step"] for w in record.lanes[c] if w in snapshot])
                        or 0.0
                        for c in copies
                    ],
                )
            )
        control = next((row.lane for row in rows if not row.merges), None)
        if control is not None:
            gains(rows, control, thresholds, clock)
        rows.sort(key=lambda row: math.inf if row.score is None else -row.score)  # unranked last
        length = 60 * record.race_minutes
        when = (
            f"the verdict at {record.race_minutes:g} minutes of race training ("
            f"{max(length - clock, 0) / 60:.0f} to go) or when every lane has trained its steps"
        )
        said, lead = verdict(rows, record.replicas, ended, when)
        sizes = {len(lane) for lane in record.lanes}
        note = ""
        if len(sizes) > 1:
            shape = "/".join(str(len(lane)) for lane in record.lanes[:: record.replicas])
            note = f"lanes differ in size ({shape} workers): every figure is per worker"
        return RaceTable(
            rows=rows,
            thresholds=thresholds,
            start_level=made["start"],
            top=made["top"],
            top_from=made["top_from"],
            top_note=self.top_note if made["top_from"] == "best" else "",
            clock=clock,
            warmup=self._warmup(racing, start, spans),
            verdict=said,
            control=control,
            note=note,
            replicas=record.replicas,
            lead=lead,
            ended=ended,
        )

    def _end(
        self, record: KnobRecord, racing: list[int], start: float, spans: np.ndarray
    ) -> float | None:
        """When the race ended (None: it has not): its length in training time reached, or
        every racing worker done with its steps, whichever came first. Both are fixed before
        the race starts, whatever its lanes score, so a verdict then is one look."""
        ends = [wall_at(spans, 60 * record.race_minutes)]
        done = [next((t for t in self.done[w] if t >= start), None) for w in racing]
        if racing and None not in done:
            ends.append(max(done))
        return min((t for t in ends if t is not None), default=None)

    def _latest_eval(self, worker: int, start: float, now: float) -> tuple | None:
        """The worker's latest evaluation in the race up to `now` (None: none)."""
        found = [e for e in self.evals[worker] if start <= e[0] <= now]
        return found[-1] if found else None

    def _warmup(self, racing: list[int], start: float, spans: np.ndarray) -> float | None:
        """Race training time spent seeding and pretraining, the same for every lane: until
        the last worker's first record past them (None: a race started mid-run, or one whose
        workers are not all past them yet)."""
        ends = [self.warmed.get(w) for w in racing]
        if None in ends or max(ends) < start or min(ends) < start:
            return None
        return float(race_clock(spans, np.array([max(ends)]))[0])

    def _lanes(
        self, record: KnobRecord, start: float, spans: np.ndarray, until: float | None = None
    ) -> dict:
        """What changes only with new episodes (minutes apart on a CPU), made once for each:
        every lane's episodes (`until`: those up to the race's end), curve, bootstrap and
        threshold crossings."""
        last = math.inf if until is None else until
        own = {
            w: [
                (t, s, r)
                for t, s, r in self.episodes[w]
                if start <= t <= last and self._lane_at(w, t) == n
            ]
            for n, workers in enumerate(record.lanes)
            for w in workers
        }
        lanes = [
            LaneEpisodes(workers, own, start, lambda times: race_clock(spans, times))
            for workers in record.lanes
        ]
        # One scale for every lane and replica (a unit, so that replicas' scores average and
        # their differences add): the starting level, the top, the thresholds between them.
        scale = self._scale(own, lanes, start)
        if scale["levels"]:
            span = scale["top"] - scale["start"]
            for lane in lanes:
                lane.normalise(scale["start"], span, scale["levels"])
        return {"lanes": lanes, **scale}

    def _scale(self, own: dict, lanes: list[LaneEpisodes], start: float) -> dict:
        """The race's scale: its starting level (where the workers had got to before a race
        started mid-run, else their first episodes), its top (the published final, else the
        best smoothed return a lane reached) and the thresholds between them."""
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
        levels: list[float] = []
        if start_level is not None and top is not None and top > start_level:
            span = top - start_level
            levels = [round(start_level + f * span, 1) for f in FRACTIONS]
        return {"start": start_level, "top": top, "top_from": top_from, "levels": levels}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
