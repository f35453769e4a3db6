"""The viewport's timeline and panes, without a display: the album episodes of the shown source
as points along the run (step, whose, return), where the slider stands, its label, which
episode a click on the returns chart pins, and each pane's overlay. The panels only show these
and send what they give."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.knobs import knob_text
from viewer.series import Series
from workers.door import AlbumEntry, PaneInfo, PinEpisode, agent_view_boxes, nearest_entry

# A chart click pins an album episode at most this far from the step clicked, as a fraction of
# the album's whole span of steps (and at least MIN_REACH steps): farther means "none there".
REACH_FRACTION = 0.05
MIN_REACH = 100


@dataclass(frozen=True)
class TimelinePoint:
    """One album episode as the timeline shows it."""

    worker: int
    kind: str  # "train" or "eval"
    step: int
    ret: float | None  # from the run's records (None: not among them, e.g. before a resume)

    @property
    def pin(self) -> PinEpisode:
        return PinEpisode(self.worker, self.kind, self.step)

    def label(self) -> str:
        whose = f"worker {self.worker}'s " + ("evaluation" if self.kind == "eval" else "episode")
        ret = "return ?" if self.ret is None else f"return {self.ret:.1f}"
        return f"step {self.step:,}  ·  {whose}  ·  {ret}"


def record_return(series: Series | None, step: int) -> float | None:
    """The value recorded at exactly `step` in a worker's series (None: none there)."""
    if series is None or not len(series):
        return None
    steps = series.steps
    at = int(np.searchsorted(steps, step))
    return float(series.values[at]) if at < len(steps) and steps[at] == step else None


def timeline_points(
    entries: list[AlbumEntry], returns: dict[int, Series], evals: dict[int, Series]
) -> list[TimelinePoint]:
    """The album's entries with their returns from the run's records (an evaluation's: the mean
    over its episodes, as the chart shows it)."""
    points = []
    for e in entries:
        series = (evals if e.kind == "eval" else returns).get(e.worker)
        points.append(TimelinePoint(e.worker, e.kind, e.step, record_return(series, e.step)))
    return points


def slider_index(points: list[TimelinePoint], pin: tuple[int, str, int] | None) -> int:
    """Where the slider stands: on the pinned episode, else on the newest (the right end)."""
    if pin is not None:
        for n, p in enumerate(points):
            if (p.worker, p.kind, p.step) == pin:
                return n
    return max(0, len(points) - 1)


def chart_pick(
    points: list[TimelinePoint], step: float, wall_axis: bool
) -> tuple[TimelinePoint | None, str]:
    """The album episode a click at `step` on the returns chart pins, or None and why not."""
    if wall_axis:
        return None, "refused: pick an episode on the agent-steps axis, not wall time"
    if not points:
        return None, "refused: the album of the shown weights has no episode yet"
    span = points[-1].step - points[0].step
    reach = max(MIN_REACH, REACH_FRACTION * span)
    found = nearest_entry(points, step, reach)
    if found is None:
        return None, f"refused: the album keeps no episode near step {step:,.0f}"
    return found, ""


# Over the agent's view (a pixel run): its frames, oldest first, as its encoder takes them.
AGENT_FRAME_LABELS = ("t-2", "t-1", "t")


Point = tuple[int, int]


def agent_labels(frame: Point, scale: float) -> list[tuple[str, Point, tuple[Point, Point]]]:
    """(text, where it starts, its background's corners) of each label over the agent's
    frames (the showcase's agent view) in a frame of (height, width) drawn `scale` times its
    size: at each frame's top left."""
    labels = []
    for (top, left, _), text in zip(agent_view_boxes(*frame), AGENT_FRAME_LABELS, strict=True):
        top, left = int(top * scale), int(left * scale)
        labels.append(
            (text, (left + 3, top + 1), ((left, top), (left + 6 + 7 * len(text), top + 18)))
        )
    return labels


def pane_roles(count: int, layout: str) -> list[str]:
    """What each pane of then and now is along the album ("" for a lane's pane)."""
    if not layout.startswith("then-now") or count < 2:
        return [""] * count
    return ["then", *["later"] * (count - 2), "now"]


def pane_label(pane: PaneInfo, lane_knobs: dict[int, dict] | None = None, role: str = "") -> str:
    """A pane's overlay: whose episode at which step and its return (led by its role in then
    and now); a lane's pane leads with the lane and the knobs it races with."""
    if pane.kind == 0:
        return f"lane {pane.lane}: no episode yet" if pane.lane >= 0 else "no episode yet"
    what = "eval" if pane.kind == 2 else "train"
    lead = f"{role}: " if role else ""
    text = f"{lead}worker {pane.worker} {what}, step {pane.step:,}\nreturn {pane.ret:.1f}"
    if pane.lane < 0:
        return text
    knobs = (lane_knobs or {}).get(pane.lane) or {}
    values = ", ".join(f"{k}={knob_text(v)}" for k, v in knobs.items())
    return f"lane {pane.lane}" + (f": {values}" if values else "") + f"\n{text}"
