"""The one place where each command of a run (commands.py) is carried out: a run's `do`.

The window's commands and those an owner serves for attached windows (Run.serve_requests) all
come here; a view of another process's run asks that process for what only the owner can do.
"""

from __future__ import annotations

from agent.errors import UserError
from agent.knobs import knob_text
from workers.run.base import BaseRun
from workers.run.checks import check_command
from workers.run.commands import (
    AddWorker,
    Checkpoint,
    ChooseShowcase,
    Command,
    MakeMontage,
    OpenShowcase,
    Outcome,
    Pause,
    PauseRendering,
    PinEpisode,
    Promote,
    RemoveWorker,
    ResetShowcase,
    RestartWorker,
    Resume,
    SetKnobs,
    ShowPanes,
    StartRace,
    Stop,
)
from workers.rundir.lanes import describe_lane
from workers.showcase.shown_weights import lane_source


def handle(run: BaseRun, command: Command) -> Outcome:
    """Carry out `command` on `run`. A refusal raises UserError (ConfigError for a value out of
    range) and changes nothing."""
    check_command(run.settings, command)  # the window's and the wire's alike
    asked = run.wording.asked  # "" for the owner; a view's requests go to the owner
    match command:
        case MakeMontage(episodes):
            path, shown = run.montages.start(episodes)  # refused (UserError) before it starts
            return Outcome((f"making a montage of {shown} album episodes: {path}",))
        case SetKnobs(changes, lane):
            version = run.knobs.set(lane=lane, **changes)  # names checked: none is "lane"
            text = ", ".join(f"{k}={knob_text(v)}" for k, v in changes.items())
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
            record = run.race.record()
            joined = record.lane_of(index)
            pool = (
                "the merged weights"
                if joined is None
                else f"{record.pool_name(joined)}'s merged weights"
            )
            return Outcome((f"worker {index} {run.wording.added}: it starts from {pool}",), index)
        case RemoveWorker(worker):
            worker = _newest_merging(run) if worker is None else worker
            run.workers.remove(worker)
            verb = run.wording.removed
            return Outcome((f"worker {worker} {verb}: it writes a checkpoint and leaves",), worker)
        case RestartWorker(worker):
            return _restart(run, worker)
        case StartRace(lanes, replicas):
            version = run.race.start(lanes, replicas)
            text = "; ".join(
                f"lane {n}: {describe_lane(lane) or 'as the run'}" for n, lane in enumerate(lanes)
            )
            if replicas > 1:
                text += f"; {replicas} replicas of each"
            _show_racing_weights(run)
            notice = f"race started (knobs v{version}), from the merged weights: {text}"
            return Outcome((notice,), version)
        case Promote(lane, weights, replica):
            whose = "its" if run.race.record().replicas <= 1 else f"its replica {replica}'s"
            version = run.race.promote(lane, weights, replica)
            if run.showcase.settings()["source"] <= -2:  # a lane's: the race is over
                run.showcase.choose(source=-1)
            if run.showcase.settings()["panes"] == "lanes":
                run.showcase.show_panes("single")
            what = (
                f"its values and {whose} weights for every worker"
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
