"""The run directory's records, typed: one frozen dataclass per kind, one writer, one reader.
Over 300 lines because the whole on-disk schema is kept on one page.

Metrics lines (worker-K.jsonl, player.jsonl) are `Record`s, requests.jsonl lines `Request`s,
knobs.json a `KnobRecord` and knobs.jsonl lines `KnobChange`s. `to_json` is the only writer of
a line (RunDir.log, RequestLog.send, KnobStore) and `from_json` the only reader (lines.py
checks every field's type): the workers, the run, the window, the exporters and the command
line hold these types, never raw dicts.

Following MuJoCo Studio, a record is either an event, which no reader may drop (an episode, a
merge, a knob change, an error), or a snapshot of progress, of which a reader that falls behind
keeps only the newest per worker (LATEST_WINS: the train and phase records).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from agent.knobs import KnobValue
from workers.rundir.lines import Line, Malformed, is_number, iter_jsonl, now_s


@dataclass(frozen=True, kw_only=True)
class Record(Line):
    """A metrics record. `worker` says whose file it was read from (a worker's number, or
    "player" for the showcase); the file name holds it, so it is not written."""

    KIND: ClassVar[str] = ""
    LATEST_WINS: ClassVar[bool] = False

    step: int | None = None  # the worker's agent step when written
    time: float = field(default_factory=now_s)  # the writer's clock, time.time()
    worker: int | str | None = field(default=None, compare=False)

    def to_json(self) -> dict:
        out = {"kind": self.KIND, **super().to_json()}
        del out["worker"]  # the reader's, from the file name
        return out

    @classmethod
    def upgraded(cls, obj: dict) -> dict:
        """A line of this kind in today's format (a kind whose format changed reads both)."""
        return obj


# Worker progress (snapshots: latest wins) -------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Train(Record):
    KIND: ClassVar[str] = "train"
    LATEST_WINS: ClassVar[bool] = True
    updates: int
    steps_per_s: float
    losses: dict[str, float] = field(default_factory=dict)

    @classmethod
    def upgraded(cls, obj: dict) -> dict:
        if "losses" in obj:
            return obj
        # Written before losses were a field of their own: every other number was one.
        known = {f.name for f in fields(cls)} | {"kind"}
        losses = {k: v for k, v in obj.items() if k not in known and (v is None or is_number(v))}
        return {**obj, "losses": losses}


@dataclass(frozen=True, kw_only=True)
class Seeding(Record):
    KIND: ClassVar[str] = "seeding"
    LATEST_WINS: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True)
class Pretraining(Record):
    KIND: ClassVar[str] = "pretraining"
    LATEST_WINS: ClassVar[bool] = True
    updates: int


# Learning (events) -------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Episode(Record):
    KIND: ClassVar[str] = "episode"
    ret: float
    length: int
    env: int = 0  # which of the worker's environments
    terminated: bool = False  # it ended in a terminal state (else at its time limit)


@dataclass(frozen=True, kw_only=True)
class Eval(Record):
    KIND: ClassVar[str] = "eval"
    ret: float  # the mean over the evaluation episodes
    returns: tuple[float, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ShowcaseEpisode(Record):
    KIND: ClassVar[str] = "showcase_episode"
    episode: int
    ret: float
    weights_round: int  # the merge round of the weights shown (-1: untrained)
    source: int  # whose weights: -1 the merged ones, k worker k's newest
    weights_step: int


@dataclass(frozen=True, kw_only=True)
class FirstUpdate(Record):
    KIND: ClassVar[str] = "first_update"
    seconds: float  # from the worker's process start (compiling included)


@dataclass(frozen=True, kw_only=True)
class SelfCheck(Record):
    """The start-up self-check (agent/self_check.py): the fast path a process trains on, and
    why. Each of a pack's workers records the same line."""

    KIND: ClassVar[str] = "self_check"
    path: str  # graphs, compile or eager; split: one process per worker from now on
    pack: int  # workers computed as one model
    bf16: bool
    asked: str  # auto (the check chose), or the path asked for by hand (--fast-path)
    sound: bool  # the path trained on agrees with the plain path (or is it, or a split)
    seconds: float  # the check's time, compile_seconds of it compiling
    compile_seconds: float = 0.0
    trials: tuple[str, ...] = ()  # each path tried, in order, with its outcome
    message: str  # the one line: what runs, and why


# Merging -----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Merge(Record):
    KIND: ClassVar[str] = "merge"
    round: int
    participants: tuple[int, ...] = ()
    left_out: dict[int, str] = field(default_factory=dict)  # worker -> why
    distances: dict[int, float] = field(default_factory=dict)  # worker -> from the mean, before
    merge_ms: float | None = None


@dataclass(frozen=True, kw_only=True)
class MergeSkipped(Record):
    KIND: ClassVar[str] = "merge_skipped"
    round: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class MergeStopped(Record):
    KIND: ClassVar[str] = "merge_stopped"
    round: int


# Knobs -------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class KnobsApplied(Record):
    KIND: ClassVar[str] = "knobs_applied"
    version: int
    values: dict[str, KnobValue]
    lane: int | None = None  # the lane whose values these are (None: the run is no race)


@dataclass(frozen=True, kw_only=True)
class KnobsRefused(Record):
    KIND: ClassVar[str] = "knobs_refused"
    version: int | None  # None: the knob record could not be read at all
    knob: str | None
    value: Any = None
    reason: str
    in_force: dict[str, KnobValue] = field(default_factory=dict)
    in_force_version: int = -1
    message: str


# A worker's life ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class StartedFresh(Record):
    KIND: ClassVar[str] = "started_fresh"


@dataclass(frozen=True, kw_only=True)
class StartedFromMerged(Record):
    KIND: ClassVar[str] = "started_from_merged"
    lane: int | None = None  # whose pool's merged weights (None: the run's)
    buffer: int = 0  # transitions kept from its own checkpoint (0: it starts with none)


@dataclass(frozen=True, kw_only=True)
class StartedFromWeights(Record):
    KIND: ClassVar[str] = "started_from_weights"
    file: str


@dataclass(frozen=True, kw_only=True)
class Resumed(Record):
    KIND: ClassVar[str] = "resumed"
    checkpoint: str
    fallback: str | None = None  # a damaged checkpoint passed over: what and why


@dataclass(frozen=True, kw_only=True)
class Checkpoint(Record):
    KIND: ClassVar[str] = "checkpoint"
    path: str


@dataclass(frozen=True, kw_only=True)
class Pause(Record):
    KIND: ClassVar[str] = "pause"


@dataclass(frozen=True, kw_only=True)
class Resume(Record):
    KIND: ClassVar[str] = "resume"


@dataclass(frozen=True, kw_only=True)
class Stop(Record):
    KIND: ClassVar[str] = "stop"
    reason: str  # "done" or "interrupted"


@dataclass(frozen=True, kw_only=True)
class DiskResumed(Record):
    KIND: ClassVar[str] = "disk_resumed"
    path: str
    error: str
    paused_s: float


@dataclass(frozen=True, kw_only=True)
class Error(Record):
    KIND: ClassVar[str] = "error"
    message: str
    traceback: str | None = None  # set when the worker itself crashed


@dataclass(frozen=True, kw_only=True)
class RunDirGone(Record):
    KIND: ClassVar[str] = "run_dir_gone"
    message: str


@dataclass(frozen=True, kw_only=True)
class Crashed(Record):
    """Written by the run's owner into a worker's file when it saw the process die."""

    KIND: ClassVar[str] = "crashed"
    message: str
    exitcode: int | None = None
    signal: str | None = None
    last_error: str | None = None
    restarts: int = 0
    final: bool = False


RECORD_TYPES: dict[str, type[Record]] = {
    cls.KIND: cls
    for cls in Record.__subclasses__()  # one level: every kind is a leaf
}


# Requests to a run's owner (requests.jsonl): events, never dropped ------------------------
ACTIONS = (
    "pause",
    "resume_training",
    "checkpoint",
    "stop",
    "restart_worker",
    "add_worker",
    "remove_worker",
)


@dataclass(frozen=True, kw_only=True)
class Request(Line):
    action: str
    worker: int | None = None  # restart_worker, remove_worker
    lane: int | None = None  # add_worker in a race: the lane it joins (None: the smallest)
    time: float = field(default_factory=now_s)
    error: str | None = None  # set by the owner that served it: why it was refused

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown request {self.action!r}")


# The live knobs (knobs.json: a snapshot; knobs.jsonl: its history, events) ----------------
@dataclass(frozen=True, kw_only=True)
class KnobRecord(Line):
    """knobs.json: the knob values to run with, and their version. In a race (lanes not
    empty) lane L's workers run with lane_values[L]; a worker in no lane (every worker outside
    a race) with `values`."""

    version: int
    values: dict[str, KnobValue]
    lanes: tuple[tuple[int, ...], ...] = ()  # the workers of each lane; empty: no race
    lane_values: tuple[dict[str, KnobValue], ...] = ()  # each lane's values
    # The version that formed today's merge pools (a race's start, a promotion): each pool's
    # merge files carry it, so that a new pool never averages an old pool's weights.
    pool: int = 0
    solo_lanes: tuple[int, ...] = ()  # lanes whose workers never merge (merge=off)
    # A promotion with weights: every worker entering this pool takes lane `promoted_lane`'s
    # weights as they were at the promotion (paths.py promoted_path): its workers' mean, or
    # (a lane that never merged) its worker `promoted_worker`'s own.
    promoted_lane: int | None = None
    promoted_worker: int | None = None
    # The pool the promoted lane raced in (its workers make the weights: merge_rounds.py).
    promoted_pool: int | None = None
    # Copies of each race lane, each with its own workers, seeds and merge pool: `lanes` holds
    # race lane l's copies at l * replicas ... (l + 1) * replicas - 1 (a pool per entry).
    replicas: int = 1

    def lane_of(self, worker: int) -> int | None:
        """The pool (an entry of `lanes`: a race lane's copy) `worker` races in, or None."""
        return next((n for n, lane in enumerate(self.lanes) if worker in lane), None)

    @property
    def race_lanes(self) -> int:
        """The lanes a person raced (each with `replicas` copies in `lanes`)."""
        return len(self.lanes) // max(self.replicas, 1)

    def copies(self, lane: int) -> range:
        """The entries of `lanes` that are race lane `lane`'s replicas."""
        return range(lane * self.replicas, (lane + 1) * self.replicas)

    def race_lane(self, pool: int) -> int:
        """The race lane whose replica the entry `pool` of `lanes` is."""
        return pool // max(self.replicas, 1)

    def pool_name(self, pool: int) -> str:
        """ "lane L", or with replicas "lane L replica R", for the entry `pool` of `lanes`."""
        lane = f"lane {self.race_lane(pool)}"
        return lane if self.replicas <= 1 else f"{lane} replica {pool % self.replicas}"

    def values_for(self, worker: int) -> dict[str, KnobValue]:
        lane = self.lane_of(worker)
        return self.values if lane is None else self.lane_values[lane]

    def merges(self, lane: int | None) -> bool:
        """Whether the workers of lane `lane` (None: outside a race) merge."""
        return lane not in self.solo_lanes


@dataclass(frozen=True, kw_only=True)
class KnobChange(Line):
    """A line of knobs.jsonl: a version as it was set, with only what it changed (for one
    lane, or for all). A race's start, a promotion and a change of a lane's workers are
    `event`s; every line of a race also holds the whole layout and its values, so that the
    history alone can rebuild a damaged knobs.json."""

    version: int
    changes: dict[str, KnobValue]
    time: float = field(default_factory=now_s)
    # The race lane it changed, every replica of it (None: every lane, and the run's values);
    # a promotion's: the entry of `lanes` (one replica) whose values won.
    lane: int | None = None
    # "race" (lanes formed), "promote" (lane `lane` won: `changes` are its values that
    # differ from the run's), "lanes" (workers moved)
    event: str = ""
    lanes: tuple[tuple[int, ...], ...] = ()
    lane_values: tuple[dict[str, KnobValue], ...] = ()
    pool: int = 0
    solo_lanes: tuple[int, ...] = ()
    promoted_lane: int | None = None
    promoted_worker: int | None = None
    promoted_pool: int | None = None
    replicas: int = 1


# The reader --------------------------------------------------------------------------------
def parse_records(data: bytes, worker: int | str | None = None) -> tuple[list[Record], int]:
    """The records of metrics-log bytes (`worker`'s file), and how many lines were damaged
    (torn, not JSON, not a record); records of kinds this version does not know are passed
    over."""
    records, skipped = [], 0
    for obj in iter_jsonl(data):
        if obj is None:
            skipped += 1
            continue
        try:
            record = record_from_json(obj, worker)
        except Malformed:
            skipped += 1
            continue
        if record is not None:
            records.append(record)
    return records, skipped


def record_from_json(obj: object, worker: int | str | None = None) -> Record | None:
    """The record a metrics line's object holds (read from `worker`'s file); None for a kind
    this version does not know (written by a newer one). Malformed for an object that is not
    a record."""
    if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
        raise Malformed("not a record: no kind")
    cls = RECORD_TYPES.get(obj["kind"])
    if cls is None:
        return None
    return cls.from_json(cls.upgraded(obj), worker=worker)  # whose: the file's, not the line's
