"""What may be asked of a run, as data, and the one place where each request is carried out.

A command is a frozen dataclass: the window queues it, a test builds and compares it, a log can
print it. `handle` (a run's `do`) carries it out and returns an Outcome: the notices to show,
the number it made (a knob version, a new worker's index) and whether the caller must stop the
run. A view of another process's run asks that process for those only the owner can do
(AttachedRun: the command's `action` and fields, a line of requests.jsonl,
workers/rundir/requests.py); the owner turns each line back into the same command
(`from_request`) and carries it out here too (Run.serve_requests).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, ClassVar

from agent.errors import UserError
from workers.rundir.lanes import Lane, describe_lane
from workers.rundir.records import Request
from workers.showcase.shown_weights import lane_source

if TYPE_CHECKING:
    from workers.run.base import BaseRun


@dataclass(frozen=True)
class Command:
    """A request of a run."""

    # The name a view's request carries to the owner (requests.jsonl); None: done where asked.
    action: ClassVar[str | None] = None
    # True when it only sets a flag and never waits: the window's own thread may do it.
    instant: ClassVar[bool] = False


@dataclass(frozen=True)
class SetKnobs(Command):
    """New knob values (validated on the way in: KnobStore.set), for lane `lane` of a race or
    (None) for every worker."""

    changes: Mapping[str, object]
    lane: int | None = None


@dataclass(frozen=True)
class Pause(Command):
    action: ClassVar[str] = "pause"


@dataclass(frozen=True)
class Resume(Command):
    action: ClassVar[str] = "resume_training"


@dataclass(frozen=True)
class Checkpoint(Command):
    action: ClassVar[str] = "checkpoint"


@dataclass(frozen=True)
class Stop(Command):
    """Stop training. The owner leaves it to its caller (Outcome.stop), which owns the process's
    lifetime: the command line exits, a window shows the run stopped."""

    action: ClassVar[str] = "stop"


@dataclass(frozen=True)
class AddWorker(Command):
    """A merging worker more (in a race: in lane `lane`, None: the smallest)."""

    action: ClassVar[str] = "add_worker"
    lane: int | None = None


@dataclass(frozen=True)
class RemoveWorker(Command):
    """Worker `worker` out of the run; None: the newest merging worker (a lane that never
    merges keeps its own)."""

    action: ClassVar[str] = "remove_worker"
    worker: int | None = None


@dataclass(frozen=True)
class RestartWorker(Command):
    """Start dead worker `worker` again; None: every crashed one."""

    action: ClassVar[str] = "restart_worker"
    worker: int | None = None


@dataclass(frozen=True)
class StartRace(Command):
    """Split the run's workers into `lanes`, each with its changes, size and merging."""

    lanes: tuple[Lane, ...]


@dataclass(frozen=True)
class Promote(Command):
    """End the race with lane `lane`'s values and (`weights`) its weights for every worker."""

    lane: int
    weights: bool = True


@dataclass(frozen=True)
class OpenShowcase(Command):
    """Set the run going as a window opens it (its owner starts the workers unless they run),
    and its showcase playing frames of `height` x `width` in `mode`."""

    height: int
    width: int
    mode: str = "auto"
    nice: int = 0  # the workers' CPU priority, if they start now (see Run.start)


@dataclass(frozen=True)
class ChooseShowcase(Command):
    """The showcase's camera, weights or mode (None: unchanged; Showcase.choose)."""

    camera: int | None = None
    source: int | None = None
    mode: str | None = None


@dataclass(frozen=True)
class ResetShowcase(Command):
    """End the showcase episode and start a new one."""


@dataclass(frozen=True)
class PinEpisode(Command):
    """Loop the album episode of `worker`, `kind`, `step` (None: the newest again; Showcase.pin)."""

    worker: int | None = None
    kind: str = "train"
    step: int = 0


@dataclass(frozen=True)
class ShowPanes(Command):
    """Split the viewport: "single", "then-now-2", "then-now-4" or "lanes" (Showcase.show_panes)."""

    layout: str = "single"


@dataclass(frozen=True)
class PauseRendering(Command):
    instant: ClassVar[bool] = True
    paused: bool = True


@dataclass(frozen=True)
class Outcome:
    notices: tuple[str, ...] = ()  # one line each, for the status line or the command line
    value: int | None = None  # the knob version made, or the index of the worker added
    stop: bool = False  # the caller should stop the run (Stop, asked of its owner)


OWNER_COMMANDS = (Pause, Resume, Checkpoint, Stop, AddWorker, RemoveWorker, RestartWorker)


def from_request(request: Request) -> Command:
    """The command an attached window sent (ValueError: none has that action)."""
    for kind in OWNER_COMMANDS:
        if kind.action == request.action:
            names = {f.name for f in fields(kind)}
            return kind(**{k: v for k, v in request.to_json().items() if k in names})
    raise ValueError(f"unknown request {request.action!r}")


def request_fields(command: Command) -> dict[str, int | None]:
    """The worker and lane a request carries for `command` (RequestLog.send)."""
    return {k: getattr(command, k, None) for k in ("worker", "lane")}


def handle(run: BaseRun, command: Command) -> Outcome:
    """Carry out `command` on `run`. A refusal raises UserError (ConfigError for a value out of
    range) and changes nothing."""
    asked = run.wording.asked  # "" for the owner; a view's requests go to the owner
    match command:
        case MakeMontage(episodes):
            path, shown = run.montages.start(episodes)  # refused (UserError) before it starts
            return Outcome((f"making a montage of {shown} album episodes: {path}",))
        case SetKnobs(changes, lane):
            version = run.knobs.set(lane=lane, **changes)
            text = ", ".join(f"{k}={v}" for k, v in changes.items())
            where = "" if lane is None else f" (lane {lane})"
            return Outcome((f"knobs v{version}{where}: {text}",), version)
        case Pause():
            run.pause()
            return Outcome((f"training paused{asked}",))
        case Resume():
            run.resume_training()
            return Outcome((f"training resumed{asked}",))
        case Checkpoint():
            run.checkpoint()
            return Outcome((f"checkpoint requested{asked}",))
        case Stop():
            if not run.attached:
                return Outcome(stop=True)
            run.request_stop()
            return Outcome(("stop asked of the process that owns the run: its workers stop",))
        case AddWorker(lane):
            index = run.workers.add(lane)
            joined = run.race.record().lane_of(index)
            pool = "the merged weights" if joined is None else f"lane {joined}'s merged weights"
            return Outcome((f"worker {index} {run.wording.added}: it starts from {pool}",), index)
        case RemoveWorker(worker):
            worker = _newest_merging(run) if worker is None else worker
            run.workers.remove(worker)
            verb = run.wording.removed
            return Outcome((f"worker {worker} {verb}: it writes a checkpoint and leaves",), worker)
        case RestartWorker(worker):
            return _restart(run, worker)
        case StartRace(lanes):
            version = run.race.start(lanes)
            text = "; ".join(
                f"lane {n}: {describe_lane(lane) or 'as the run'}" for n, lane in enumerate(lanes)
            )
            _show_racing_weights(run)
            notice = f"race started (knobs v{version}), from the merged weights: {text}"
            return Outcome((notice,), version)
        case Promote(lane, weights):
            version = run.race.promote(lane, weights)
            if run.showcase.settings()["source"] <= -2:  # a lane's: the race is over
                run.showcase.choose(source=-1)
            if run.showcase.settings()["panes"] == "lanes":
                run.showcase.show_panes("single")
            what = (
                "its values and its weights for every worker"
                if weights
                else "its values for every worker; the next merge averages every worker's weights"
            )
            return Outcome((f"lane {lane} promoted (knobs v{version}): {what}",), version)
        case OpenShowcase(height, width, mode, nice):
            run.launch(nice)
            run.showcase.choose(mode=mode)
            run.showcase.start(height, width)
            _show_racing_weights(run)
            return Outcome()
        case ChooseShowcase(camera, source, mode):
            run.showcase.choose(camera=camera, source=source, mode=mode)
            return Outcome()
        case ResetShowcase():
            run.showcase.reset()
            return Outcome()
        case PinEpisode(None):
            run.showcase.pin(None)
            return Outcome(("viewport: the newest episodes again",))
        case PinEpisode(worker, kind, step):
            run.showcase.pin(worker, kind, step)
            what = "evaluation episode" if kind == "eval" else "episode"
            return Outcome((f"viewport: worker {worker}'s {what} at step {step:,}, looping",))
        case ShowPanes(layout):
            run.showcase.show_panes(layout)
            return Outcome()
        case PauseRendering(paused):
            run.showcase.pause_rendering(paused)
            return Outcome()
    raise TypeError(f"not a command of a run: {command!r}")


def _newest_merging(run: BaseRun) -> int:
    record = run.race.record()
    merging = [w for w in run.settings.merging if record.merges(record.lane_of(w))]
    if not merging:
        raise UserError("no merging worker left to remove")
    return merging[-1]


def _restart(run: BaseRun, worker: int | None) -> Outcome:
    if worker is not None:
        run.workers.restart(worker)
        return Outcome((f"worker {worker} restarted from the merged weights",), worker)
    notices = []
    for row in run.workers.progress():
        if row["state"] == "crashed":
            run.workers.restart(row["worker"])
            notices.append(f"worker {row['worker']} restarted from the merged weights")
    return Outcome(tuple(notices))


def _show_racing_weights(run: BaseRun) -> None:
    """In a race the run's own pool does not merge: a showcase on "merged" plays the first
    merging lane's merged weights instead (the source list offers every lane's)."""
    record = run.race.record()
    merging = [n for n in range(len(record.lanes)) if record.merges(n)]
    if merging and run.showcase.settings()["source"] == -1:
        run.showcase.choose(source=lane_source(merging[0]))


@dataclass(frozen=True)
class MakeMontage(Command):
    """A montage of the album into media/, in a process here (run.montages; showcase/montage.py)."""

    episodes: int = 8
