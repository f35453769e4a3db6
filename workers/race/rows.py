"""A race table's rows as the window and the command line read them: each lane's figures, with
replicas their mean and each replica's own, a merge gain, and the table around them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from agent.knobs import KnobValue


@dataclass(frozen=True)
class Gain:
    """A merging lane against the lane that never merges, at one threshold: how many times
    fewer agent steps per worker and how much less training time it needed."""

    steps: float
    time: float
    at_least: bool = False  # the never-merging lane has not got there yet: at least this
    # 95 % half-widths across the replicas (0: one replica, no spread to tell)
    steps_spread: float = 0.0
    time_spread: float = 0.0


@dataclass
class LaneRow:
    """One race lane; with replicas every figure is the mean over them (score and spread: the
    mean and 95 % interval across replicas; one replica: its episodes' bootstrap)."""

    lane: int
    workers: tuple[int, ...]  # of every replica
    knobs: dict[str, KnobValue]  # only the knobs in which the lanes differ
    merges: bool
    steps: float  # agent steps per worker (mean over the lane's workers)
    steps_per_s: float  # per worker (mean)
    ret: float | None  # the smoothed training return now (the curve's last value)
    eval_ret: float | None  # the latest evaluation's mean return (no exploration noise)
    eval_episodes: int  # the episodes behind it, over the lane's workers
    episodes: int  # training episodes finished in the race
    score: float | None  # mean normalised return over the race's training time
    spread: float  # a 95 % interval: +- this (see the class)
    # threshold -> (seconds of race training time, agent steps per worker) when first reached
    reached: dict[float, tuple[float, float] | None] = field(default_factory=dict)
    gain: dict[float, Gain | None] = field(default_factory=dict)  # merging lanes vs control
    leader: bool = False
    # (seconds after the race's start, the lane's mean agent step, its smoothed return)
    curve: list[tuple[float, float, float]] = field(default_factory=list)
    # with replicas: (seconds, the lowest replica's return, the highest's) along the curve
    band: list[tuple[float, float, float]] = field(default_factory=list)
    # per replica: its score, episodes, threshold crossings, agent steps per worker
    replica_scores: list[float | None] = field(default_factory=list)
    replica_episodes: list[int] = field(default_factory=list)
    replica_reached: list[dict] = field(default_factory=list)
    replica_steps: list[float] = field(default_factory=list)

    def best_replica(self) -> int:
        """The replica with the best score (0 while none is scored): a promotion's weights."""
        scores = [-math.inf if s is None else s for s in self.replica_scores]
        return max(range(len(scores)), key=scores.__getitem__, default=0)


@dataclass
class RaceTable:
    rows: list[LaneRow]  # best first
    thresholds: list[float]  # the returns whose first crossing the table times
    start_level: float | None
    top: float | None
    top_from: str  # "published" (the task's final return) or "best" (the best lane's)
    top_note: str  # why a published final is not the top (the run's protocol differs)
    clock: float  # seconds of training since the race began (pauses and stops left out)
    warmup: float | None  # of them, seeding and pretraining (a race from the run's start)
    verdict: str  # who leads, or why nobody does
    control: int | None  # the lane that never merges, which the merge gain is against
    note: str = ""  # lanes of different sizes: the figures are per worker
    replicas: int = 1
    # the first lane's lead in score over the second: (mean, 95 % half-width), paired
    # across replicas (one replica: the two bootstraps' spreads combined)
    lead: tuple[float, float] | None = None
    # the race has ended (its length, or every lane's steps): the table as it stood then,
    # with its verdict; before, the first lane is only ahead so far
    ended: bool = True
