"""What the window draws from: the controller thread's latest-wins snapshot of the run (View)
and the chart options the user chose (ChartOptions). Plain data, no GUI."""

from __future__ import annotations

from dataclasses import dataclass, field

from viewer.model import KnobRow
from viewer.timeline import TimelinePoint
from workers.door import OWNED, LaneRow, RaceTable, Wording


@dataclass(frozen=True)
class ChartOptions:
    wall_axis: bool = False
    smoothing: float = 0.0
    loss: str = "total_loss"
    by_lane: bool = False  # in a race: one return line per lane instead of per worker


@dataclass(frozen=True)
class RaceView:
    """A race as the window shows it: the table (rows best first, thresholds, verdict, merge
    gain) and how lanes share the machine."""

    lanes: int
    table: RaceTable
    sharing: str

    @property
    def rows(self) -> list[LaneRow]:
        return self.table.rows

    @property
    def thresholds(self) -> list[float]:
        return self.table.thresholds


@dataclass(frozen=True)
class View:
    """Everything the window draws from, built off the GUI thread."""

    version: int
    phase: str  # idle, starting, running, stopping, stopped
    task: str = ""
    obs: str = "state"  # what the run's agent sees: state or rgb (the agent's view pane)
    run_path: str = ""
    wording: Wording = OWNED  # how to word what was done with the run shown
    paused: bool = False
    workers: list[dict] = field(default_factory=list)
    knobs: list[KnobRow] = field(default_factory=list)
    knob_version: int = -1
    startup: tuple[float, str] | None = None
    returns: dict = field(default_factory=dict)
    bands: dict = field(default_factory=dict)  # a race's replicas: label -> (xs, lows, highs)
    speed: dict = field(default_factory=dict)
    losses: dict = field(default_factory=dict)
    distances: dict = field(default_factory=dict)
    merge_marks: list[float] = field(default_factory=list)
    knob_marks: list[float] = field(default_factory=list)
    published: tuple[list[float], list[float]] | None = None
    published_note: str = ""  # said instead of a reference line the task does not have
    errors: list[str] = field(default_factory=list)
    error_count: int = 0
    notes: list[str] = field(default_factory=list)  # the Log tab's lines that are no error
    note_count: int = 0
    cameras: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    source_ids: list[int] = field(default_factory=list)  # the showcase's number of each source
    source: int = -1  # the source the showcase plays now
    showcase_mode: str = "auto"  # auto, live or replay (workers/showcase/replay.py)
    album: list[TimelinePoint] = field(default_factory=list)  # the shown source's, by step
    pin: tuple[int, str, int] | None = None  # (worker, kind, step) pinned; None: the newest
    panes: str = "single"  # the viewport's layout (door.LAYOUTS)
    machine: str = ""
    race: RaceView | None = None  # None: the run is no race
