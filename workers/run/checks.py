"""The one check of a command's values before a run carries it out (handle.py): the same for the
window's commands and those a run server takes over the wire, so nothing the window refuses is
taken from elsewhere. What needs the run's state in full (a knob's range with the config, a
race's layout) is checked where it is carried out; this is what a command can be wrong in on
its face: a knob name that is no knob, a lane of no workers, more replicas or workers than a
run can have.
"""

from __future__ import annotations

from agent.errors import ConfigError, UserError, printable
from agent.knobs import knobs
from workers.run.commands import (
    AddWorker,
    Command,
    RemoveWorker,
    RestartWorker,
    SetKnobs,
    StartRace,
)
from workers.rundir.lanes import check_lane, check_replicas
from workers.rundir.settings import MAX_WORKERS, RunSettings


def check_knob_names(names: object) -> None:
    table = knobs()
    for name in names:  # type: ignore[attr-defined]
        if not isinstance(name, str) or name not in table:
            raise ConfigError(
                f"{printable(name, 60)!r} is not a live knob (knobs: {', '.join(table)})", "knobs"
            )


def check_command(settings: RunSettings, command: Command) -> None:
    """ConfigError or UserError (one line) when `command` cannot be right for a run laid out
    as `settings`; nothing is carried out."""
    match command:
        case SetKnobs(changes, _lane):
            check_knob_names(changes)
        case StartRace(lanes, replicas):
            check_replicas(replicas)
            merging = len(settings.merging)
            if len(lanes) * replicas > merging:
                raise ConfigError(
                    f"{len(lanes)} lanes x {replicas} replicas need at least "
                    f"{len(lanes) * replicas} merging workers, the run has {merging}",
                    "lanes",
                )
            for n, lane in enumerate(lanes):
                try:
                    check_lane(lane)
                except ConfigError as err:
                    raise ConfigError(f"lane {n}: {err}", err.field) from None
        case AddWorker():
            if settings.workers >= MAX_WORKERS:
                raise UserError(f"a run has at most {MAX_WORKERS} workers: none added")
        case RestartWorker(worker) | RemoveWorker(worker) if worker is not None:
            if isinstance(command, RestartWorker) and worker in settings.removed:
                raise UserError(f"worker {worker} was removed from the run; add a new one instead")
            if worker not in settings.active:
                raise UserError(f"worker {worker} is not in the run (workers: {settings.active})")
