"""What the window shows, as plain data: built from the run's events and progress snapshots.

No Dear PyGui here (napari's rule: test the model, not the widgets). The controller thread feeds
events in; the window asks for chart lines, worker rows, knob rows and the start-up progress.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from agent.knobs import knobs
from viewer.series import Series, chart_line

LOSSES = ("total_loss", "consistency_loss", "reward_loss", "value_loss", "pi_loss", "q_scale")


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
        text = "/".join(_number(v) for v in known)
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
    # Refused knob records: knob (None: the whole record unreadable) -> (version, text).
    knob_errors: dict = field(default_factory=dict)
    _merge_rounds: set = field(default_factory=set)
    _knob_versions: set = field(default_factory=set)
    _told: set = field(default_factory=set)

    def ingest(self, events: list[dict]) -> None:
        malformed = 0
        for event in events:
            try:
                self._ingest_one(event)
            except (KeyError, TypeError, ValueError, AttributeError):  # a record of bad shape
                malformed += 1
        if malformed:  # the charts go on without them: said once per batch, with how many
            self.errors.append(f"{malformed} malformed record(s) skipped")
            self.error_count += 1
        self.events_seen += len(events)

    def _ingest_one(self, e: dict) -> None:
        kind, worker = e.get("kind"), e.get("worker")
        step, wall = float(e.get("step", 0)), float(e.get("time", 0.0))
        if self.start_time is None or wall < self.start_time:
            self.start_time = wall
        if kind == "episode":
            self.returns.setdefault(worker, Series()).append(step, wall, e["ret"])
        elif kind == "eval":
            self.evals.setdefault(worker, Series()).append(step, wall, e["ret"])
        elif kind == "showcase_episode":
            self.showcase.append(self._latest_step(), wall, e["ret"])
        elif kind == "train":
            self.speed.setdefault(worker, Series()).append(step, wall, e["steps_per_s"])
            for name in LOSSES:
                if name in e and _finite(e[name]):
                    self.losses.setdefault(name, {}).setdefault(worker, Series()).append(
                        step, wall, e[name]
                    )
        elif kind == "merge":
            for k, d in e.get("distances", {}).items():
                self.distances.setdefault(int(k), Series()).append(step, wall, d)
            if e["round"] not in self._merge_rounds:
                self._merge_rounds.add(e["round"])
                self.merge_marks.append((step, wall))
            for k in e.get("participants", []):
                self.left_out.pop(int(k), None)
            for k, reason in e.get("left_out", {}).items():
                self.left_out[int(k)] = str(reason)
        elif kind == "merge_skipped":
            self.left_out[worker] = e.get("reason", "left out")
        elif kind == "knobs_applied":
            self.applied[worker] = {"version": e["version"], **e["values"]}
            for knob, (version, _) in list(self.knob_errors.items()):
                if e["version"] > version:  # a good record replaced it
                    del self.knob_errors[knob]
            if e["version"] > 0 and e["version"] not in self._knob_versions:
                self._knob_versions.add(e["version"])
                self.knob_marks.append((step, wall, f"knobs v{e['version']}"))
        elif kind == "error":
            source = "showcase" if worker == "player" else f"worker {worker}"
            self.errors.append(f"{source}: {e.get('message', 'error')}")
            self.error_count += 1
        elif kind == "knobs_refused":
            knob, in_force = e.get("knob"), e.get("in_force") or {}
            if knob in in_force:
                text = f"refused {e.get('value')!r}; {_number(in_force[knob])} stays"
            else:
                text = "record unreadable; the last good values stay"
            # Cleared by a newer version applied (unreadable: newer than the one in force).
            version = e.get("version")
            self.knob_errors[knob] = (
                e.get("in_force_version", -1) if version is None else version,
                text,
            )
            if e.get("message") not in self._told:  # every worker refuses it: say it once
                self._told.add(e.get("message"))
                self.errors.append(f"worker {worker}: {e.get('message')}")
                self.error_count += 1
        elif kind == "resumed" and e.get("fallback"):  # a damaged checkpoint passed over
            self.errors.append(f"warning: {e['fallback']}")
            self.error_count += 1
        elif kind == "crashed":  # written by the run: says why, and whether it restarts
            self.errors.append(str(e.get("message", f"worker {worker} crashed")))
            self.error_count += 1

    def _latest_step(self) -> float:
        steps = [s.steps[-1] for s in self.returns.values() if len(s)]
        return max(steps) if steps else 0.0

    # charts -------------------------------------------------------------------------
    def _line(self, series: Series, wall_axis: bool, weight: float, max_points: int):
        return chart_line(series, wall_axis, weight, max_points, self.start_time or 0.0)

    def worker_label(self, worker: int) -> str:
        return f"worker {worker}" + (" (control)" if worker == self.control_worker else "")

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
                    "state": state,
                    "step": f"{int(p.get('step', 0)):,}",
                    "speed": f"{p.get('steps_per_s', 0.0):.1f}/s",
                    "return": "-" if not _finite(ret) else f"{ret:.1f}",
                    "merges": str(int(p.get("merges", 0))),
                    "problem": state in ("crashed", "disk full") or w in self.left_out,
                }
            )
        return rows

    def knob_rows(self, requested: dict, progress: list[dict]) -> list[KnobRow]:
        """Requested value of each knob versus what each worker applied last."""
        rows = []
        for name, label in window_knobs().items():
            if name not in requested:
                continue
            applied = [self.applied.get(p["worker"], {}).get(name) for p in progress]
            error = self.knob_errors.get(name, self.knob_errors.get(None, (None, None)))[1]
            rows.append(KnobRow(name, label, requested[name], applied, error))
        return rows

    def startup(self, progress: list[dict], cfg_seed_steps: int) -> tuple[float, str] | None:
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
        # Pretraining does as many updates as there were seed steps (reported as they go).
        updates = min(int(p.get("updates", 0)) for p in pretraining)
        text = f"pretraining on the seed data: {updates} / {cfg_seed_steps} updates"
        first = max(float(p.get("first_update_s") or 0.0) for p in pretraining)
        if first > 0:  # with CUDA graphs most of it is compiling, once per process
            text += f" (first update {first:.1f} s after start, compiling included)"
        return min(1.0, updates / max(1, cfg_seed_steps)), text


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
