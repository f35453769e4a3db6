"""What may be asked of a run, as data; handle.py carries each out.

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
from typing import ClassVar

from workers.rundir.lanes import Lane
from workers.rundir.records import RACE_MINUTES, Request


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
    """Split the run's workers into `lanes`, each with its changes, size and merging, each run
    `replicas` times (a merge pool and seeds of its own per replica)."""

    lanes: tuple[Lane, ...]
    replicas: int = 1
    minutes: float = RACE_MINUTES  # the race's length in training time: its verdict then


@dataclass(frozen=True)
class Promote(Command):
    """End the race with lane `lane`'s values and (`weights`) the weights of its replica
    `replica` for every worker."""

    lane: int
    weights: bool = True
    replica: int = 0


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


@dataclass(frozen=True)
class MakeMontage(Command):
    """A montage of the album into media/, in a process here (run.montages; showcase/montage.py)."""

    episodes: int = 8
