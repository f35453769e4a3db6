"""What the window shows, as plain data: built from the run's events and progress snapshots.

No Dear PyGui here (napari's rule: test the model, not the widgets). The controller thread feeds
events in; the window asks for chart lines, worker rows, knob rows and the start-up progress.
Over 300 lines because every chart, table and knob row reads the same ingested events.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from agent.knobs import knob_text, knobs
from viewer.series import Series, chart_line
from workers.door import (
    Crashed,
    Episode,
    Error,
    Eval,
    KnobRecord,
    KnobsApplied,
    KnobsRefused,
    LaneRow,
    Merge,
    MergeSkipped,
    RaceTracker,
    Record,
    Resumed,
    SelfCheck,
    ShowcaseEpisode,
    Train,
)

LOSSES = (
    "total_loss",
    "consistency_loss",
    "reward_loss",
    "value_loss",
    "pi_loss",
    "q_scale",
    "q_mean",
)


def window_knobs() -> dict[str, str]:
    """The knobs the window has widgets for, name -> label, in the table's order
    (agent/knobs.py; read at call time)."""
    return {name: k.title for name, k in knobs().items() if k.in_window}


@dataclass
class KnobRow:
    name: str
    label: str
    requested: float
    applied: list[float | None]  # per worker: the value it runs with now (None: not known yet)
    error: str | None = None  # a knob record the workers refused: what, and what stays
    lanes: list[str] = field(default_factory=list)  # in a race: each lane's value (and "now")
    lane_requested: list[float] = field(default_factory=list)  # in a race: each lane's value

    @property
    def pending(self) -> bool:
        return any(v != self.requested for v in self.applied)

    @property
    def applied_text(self) -> str:
        if self.error:
            return self.error
        known = sorted({v for v in self.applied if v is not None})
        if not known:
            return "waiting"
        text = "/".join(knob_text(v) for v in known)
        return f"now {text}" + (" (applying...)" if self.pending else "")


@dataclass
class RunModel:
    """Everything learned from a run's event stream, for the charts and the status panel."""

    workers: int
    seed_steps: int = 0
    control_worker: int | None = None
    returns: dict[int, Series] = field(default_factory=dict)
    evals: dict[int, Series] = field(default_factory=dict)
    showcase: Series = field(default_factory=Series)
    speed: dict[int, Series] = field(default_factory=dict)
    losses: dict[str, dict[int, Series]] = field(default_factory=dict)
    distances: dict[int, Series] = field(default_factory=dict)
    merge_marks: list[tuple[float, float]] = field(default_factory=list)
    knob_marks: list[tuple[float, float, str]] = field(default_factory=list)
    errors: deque = field(default_factory=lambda: deque(maxlen=200))
    applied: dict[int, dict] = field(default_factory=dict)
    left_out: dict[int, str] = field(default_factory=dict)
    start_time: float | None = None
    events_seen: int = 0
    error_count: int = 0  # errors ever seen (`errors` keeps the newest 200)
    # Lines to log that are no error (each process's start-up self-check), and their count.
    notes: deque = field(default_factory=lambda: deque(maxlen=200))
    note_count: int = 0
    # Refused knob records: knob (None: the whole record unreadable) -> (version, text).
    knob_errors: dict = field(default_factory=dict)
    lane_of: dict[int, int | None] = field(default_factory=dict)  # as each worker applied last
    replicas: int = 1  # the race's copies of each lane (lane_of holds each worker's copy)
    race: RaceTracker = field(default_factory=RaceTracker)
    _merge_rounds: set = field(default_factory=set)
    _knob_versions: set = field(default_factory=set)
    _told: set = field(default_factory=set)

    def __post_init__(self) -> None:
        self.race.seed_steps = self.seed_steps or None  # the race table's warm-up ends there

    def ingest(self, records: list[Record]) -> None:
        for record in records:
            self._ingest_one(record)
        self.race.ingest(records)
        self.events_seen += len(records)

    def _ingest_one(self, r: Record) -> None:
        worker, step, wall = r.worker, float(r.step or 0), r.time
        if self.start_time is None or wall < self.start_time:
            self.start_time = wall
        match r:
            case Episode():
                self.returns.setdefault(worker, Series()).append(step, wall, r.ret)
            case Eval():
                self.evals.setdefault(worker, Series()).append(step, wall, r.ret)
            case ShowcaseEpisode():
                self.showcase.append(self._latest_step(), wall, r.ret)
            case Train():
                self.speed.setdefault(worker, Series()).append(step, wall, r.steps_per_s)
                for name in LOSSES:
                    if _finite(value := r.losses.get(name)):
                        by_worker = self.losses.setdefault(name, {})
                        by_worker.setdefault(worker, Series()).append(step, wall, value)
            case Merge():
                self._merged(r, step, wall)
            case MergeSkipped():
                self.left_out[worker] = r.reason
            case KnobsApplied():
                self._knobs_applied(r, step, wall)
            case Error():
                source = "showcase" if worker == "player" else f"worker {worker}"
                self._error(f"{source}: {r.message}")
            case KnobsRefused():
                self._knobs_refused(r)
            case Resumed() if r.fallback:  # a damaged checkpoint passed over
                self._error(f"warning: {r.fallback}")
            case Crashed():  # written by the run: says why, and whether it restarts
                self._error(r.message)
            case SelfCheck() if r.message not in self._told:  # a pack's workers: one line
                self._told.add(r.message)
                self.notes.append(r.message)
                self.note_count += 1

    def _error(self, text: str) -> None:
        self.errors.append(text)
        self.error_count += 1

    def _merged(self, r: Merge, step: float, wall: float) -> None:
        for k, d in r.distances.items():
            self.distances.setdefault(k, Series()).append(step, wall, d)
        if r.round not in self._merge_rounds:
            self._merge_rounds.add(r.round)
            self.merge_marks.append((step, wall))
        for k in r.participants:
            self.left_out.pop(k, None)
        self.left_out.update(r.left_out)

    def _knobs_applied(self, r: KnobsApplied, step: float, wall: float) -> None:
        self.applied[r.worker] = {"version": r.version, **r.values}
        self.lane_of[r.worker] = r.lane
        for knob, (version, _) in list(self.knob_errors.items()):
            if r.version > version:  # a good record replaced it
                del self.knob_errors[knob]
        if r.version > 0 and r.version not in self._knob_versions:
            self._knob_versions.add(r.version)
            self.knob_marks.append((step, wall, f"knobs v{r.version}"))

    def _knobs_refused(self, r: KnobsRefused) -> None:
        if r.knob in r.in_force:
            text = f"refused {r.value!r}; {knob_text(r.in_force[r.knob])} stays"
        else:
            text = "record unreadable; the last good values stay"
        # Cleared by a newer version applied (unreadable: newer than the one in force).
        self.knob_errors[r.knob] = (r.in_force_version if r.version is None else r.version, text)
        if r.message not in self._told:  # every worker refuses it: say it once
            self._told.add(r.message)
            self._error(f"worker {r.worker}: {r.message}")

    def _latest_step(self) -> float:
        steps = [s.steps[-1] for s in self.returns.values() if len(s)]
        return max(steps) if steps else 0.0

    # charts -------------------------------------------------------------------------
    def _line(self, series: Series, wall_axis: bool, weight: float, max_points: int):
        return chart_line(series, wall_axis, weight, max_points, self.start_time or 0.0)

    def lane_text(self, worker: int) -> str | None:
        """The lane (and with replicas the replica) `worker` applied last: "1", "1 r2"."""
        pool = self.lane_of.get(worker)
        if pool is None:
            return None
        if self.replicas <= 1:
            return str(pool)
        return f"{pool // self.replicas} r{pool % self.replicas}"

    def worker_label(self, worker: int) -> str:
        lane = self.lane_text(worker)
        if worker == self.control_worker:
            return f"worker {worker} (control)"
        return f"worker {worker}" + ("" if lane is None else f" (lane {lane})")

    def lane_lines(
        self, rows: list[LaneRow], wall_axis: bool, race_start: float
    ) -> tuple[dict, dict]:
        """One line per lane in a race: its smoothed return (the race table's; with replicas
        their mean), against wall time from the run's start or the lane's mean agent step;
        and with replicas each lane's band, (xs, lowest, highest) of its replicas."""
        offset = race_start - (self.start_time or race_start)
        lines, bands = {}, {}
        for row in sorted(rows, key=lambda r: r.lane):
            if wall_axis:
                xs = [t + offset for t, _, _ in row.curve]
            else:
                xs = [s for _, s, _ in row.curve]
            lines[f"lane {row.lane}"] = (xs, [v for _, _, v in row.curve])
            if row.band:
                lows, highs = [lo for _, lo, _ in row.band], [hi for *_, hi in row.band]
                bands[f"lane {row.lane} replicas"] = (xs, lows, highs)
        return lines, bands

    def return_lines(self, wall_axis: bool, weight: float, max_points: int = 2000) -> dict:
        """Episode return per worker, eval return (mean over workers) and the showcase's."""
        lines = {
            self.worker_label(w): self._line(s, wall_axis, weight, max_points)
            for w, s in sorted(self.returns.items())
        }
        for w, s in sorted(self.evals.items()):
            lines[f"eval {self.worker_label(w)}"] = self._line(s, wall_axis, 0.0, max_points)
        if len(self.showcase):
            lines["showcase (merged)"] = self._line(self.showcase, wall_axis, weight, max_points)
        return lines

    def speed_lines(self, wall_axis: bool, max_points: int = 2000) -> dict:
        return {
            self.worker_label(w): self._line(s, wall_axis, 0.0, max_points)
            for w, s in sorted(self.speed.items())
        }

    def loss_lines(self, name: str, wall_axis: bool, weight: float, max_points: int = 2000):
        return {
            self.worker_label(w): self._line(s, wall_axis, weight, max_points)
            for w, s in sorted(self.losses.get(name, {}).items())
        }

    def distance_lines(self, wall_axis: bool, max_points: int = 2000) -> dict:
        return {
            self.worker_label(w): self._line(s, wall_axis, 0.0, max_points)
            for w, s in sorted(self.distances.items())
        }

    def marks(self, wall_axis: bool) -> tuple[list[float], list[float], list[str]]:
        """x positions of merges, of knob changes, and the knob labels."""
        t0 = self.start_time or 0.0
        merges = [(wall - t0) if wall_axis else step for step, wall in self.merge_marks]
        knobs = [(wall - t0) if wall_axis else step for step, wall, _ in self.knob_marks]
        return merges, knobs, [label for *_, label in self.knob_marks]

    # status -------------------------------------------------------------------------
    def worker_rows(self, progress: list[dict]) -> list[dict]:
        """One display row per worker: state (with 'left out' / 'crashed'), step, speed."""
        rows = []
        for p in progress:
            w = p["worker"]
            state = p["state"]
            if state in ("training", "seeding", "pretraining", "merging") and w in self.left_out:
                state = f"{state}, left out of merge"
            ret = p.get("last_return", math.nan)
            rows.append(
                {
                    "worker": self.worker_label(w),
                    "lane": self.lane_text(w) or "-",
                    "state": state,
                    "step": f"{int(p.get('step', 0)):,}",
                    "speed": f"{p.get('steps_per_s', 0.0):.1f}/s",
                    "return": "-" if not _finite(ret) else f"{ret:.1f}",
                    "merges": str(int(p.get("merges", 0))),
                    "problem": state in ("crashed", "disk full") or w in self.left_out,
                }
            )
        return rows

    def knob_rows(
        self, requested: dict, progress: list[dict], record: KnobRecord | None = None
    ) -> list[KnobRow]:
        """Requested value of each knob versus what each worker applied last; in a race
        (`record` with lanes) also each lane's value, and what its workers (every replica's)
        run with now."""
        rows = []
        lanes = []
        if record is not None:
            for n in range(record.race_lanes):
                copies = record.copies(n)
                workers = [w for c in copies for w in record.lanes[c]]
                lanes.append((copies[0], workers))
        for name, label in window_knobs().items():
            if name not in requested:
                continue
            applied = [self.applied.get(p["worker"], {}).get(name) for p in progress]
            error = self.knob_errors.get(name, self.knob_errors.get(None, (None, None)))[1]
            per_lane, lane_requested = [], []
            for first, workers in lanes:
                value = record.lane_values[first][name]
                lane_requested.append(value)
                now = {self.applied.get(w, {}).get(name) for w in workers} - {None}
                text = knob_text(value)
                if now and now != {value}:
                    text += f" (now {'/'.join(knob_text(v) for v in sorted(now))})"
                per_lane.append(text)
            rows.append(
                KnobRow(name, label, requested[name], applied, error, per_lane, lane_requested)
            )
        return rows

    def startup(
        self, progress: list[dict], cfg_seed_steps: int, pretrain_updates: int | None = None
    ) -> tuple[float, str] | None:
        """(fraction, text) while workers collect seed steps or pretrain, else None."""
        if not progress:
            return 0.0, "starting workers..."
        if any(p["state"] == "starting" for p in progress):
            return 0.0, "starting workers (loading PyTorch and MuJoCo)..."
        seeding = [p for p in progress if p["state"] == "seeding"]
        pretraining = [p for p in progress if p["state"] == "pretraining"]
        if seeding:
            step = min(p["step"] for p in seeding)
            text = f"collecting seed steps with random actions: {int(step)} / {cfg_seed_steps}"
            return min(1.0, step / max(1, cfg_seed_steps)), text
        if not pretraining:
            return None
        # By default pretraining does as many updates as there were seed steps.
        total = pretrain_updates or cfg_seed_steps
        updates = min(int(p.get("updates", 0)) for p in pretraining)
        text = f"pretraining on the seed data: {updates} / {total} updates"
        first = max(float(p.get("first_update_s") or 0.0) for p in pretraining)
        if first > 0:  # with CUDA graphs most of it is compiling, once per process
            text += f" (first update {first:.1f} s after start, compiling included)"
        return min(1.0, updates / max(1, total)), text


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
