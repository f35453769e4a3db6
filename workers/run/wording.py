"""How the window and the command line word what they did with a run: one set of words for a
run this process owns, one for a view of another process's run (the run answers, so that no
caller asks which kind it has)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Wording:
    """How a window or the command line words what it did with a run of this kind."""

    opened: str  # "started" a run, or "attached to" it
    added: str  # a worker "added", or "asked for"
    removed: str  # a worker "removed", or its "removal asked"
    asked: str  # after a pause, resume or checkpoint notice: where the action went
    label: str  # after the run's path in a status line
    stopped: str  # once its workers stopped ({path}); empty: not this process's to say
    closing: str  # printed as the window closes
    after_close: str  # printed after it closed ({path}); empty: nothing to say


OWNED = Wording(
    opened="started",
    added="added",
    removed="removed",
    asked="",
    label="",
    stopped="stopped; checkpoints in {path}",
    closing="stopping workers (each writes a checkpoint)...",
    after_close="run directory {path}; continue with --resume {path}",
)
ATTACHED = Wording(
    opened="attached to",
    added="asked for",
    removed="removal asked",
    asked=": asked of the process that owns the run",
    label=" (attached)",
    stopped="",
    closing="letting go of the attached run: its workers are not ours",
    after_close="",
)
