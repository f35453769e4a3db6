"""The commands a run carries out (workers/run/commands.py), in-process: each as data through the
one dispatch (run.do), on a run that was created but never started (no process is spawned), and
through an attached view whose requests the owner serves."""

import json

import pytest
from conftest import tiny_run as tiny

from agent.errors import ConfigError, UserError
from workers.run.commands import (
    OWNER_COMMANDS,
    AddWorker,
    Checkpoint,
    ChooseShowcase,
    Command,
    Outcome,
    Pause,
    PauseRendering,
    RemoveWorker,
    ResetShowcase,
    RestartWorker,
    Resume,
    SetKnobs,
    Stop,
    from_request,
    request_fields,
)
from workers.run.owner import Run, RunSettings
from workers.rundir.records import Request


@pytest.fixture
def run(tmp_path):
    return Run.create(tmp_path / "run", tiny(100), RunSettings(workers=3, pack=1))


def sent(run: Run) -> list[dict]:
    lines = run.requests.path.read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in lines]


def test_a_command_is_data_compared_by_value_and_frozen():
    # Equal values: the round trip below. Every field and the kind count in the comparison.
    knobs = SetKnobs({"horizon": 3}, lane=1)
    assert knobs != SetKnobs({"horizon": 3}, lane=0) and knobs != SetKnobs({"horizon": 4}, lane=1)
    assert RemoveWorker(2) != RemoveWorker(1)
    assert Pause() != Resume() and RestartWorker(2) != RemoveWorker(2)
    with pytest.raises(AttributeError):
        RemoveWorker(2).worker = 1  # type: ignore[misc]
    assert PauseRendering().instant and not Pause().instant


@pytest.mark.parametrize(
    "command", [Pause(), Resume(), Checkpoint(), Stop(), AddWorker(1), RemoveWorker(2)]
)
def test_an_owner_command_travels_as_a_request_and_comes_back_the_same(command):
    request = Request(action=command.action, **request_fields(command))
    assert from_request(Request.from_json(json.loads(json.dumps(request.to_json())))) == command
    assert from_request(Request(action="restart_worker", worker=1)) == RestartWorker(1)


def test_every_owner_command_has_its_own_action_and_anything_else_is_refused(run):
    actions = [kind.action for kind in OWNER_COMMANDS]
    assert len(set(actions)) == len(actions) and None not in actions
    assert SetKnobs.action is None and ChooseShowcase.action is None  # done where asked
    with pytest.raises(TypeError, match="not a command"):
        run.do(Command())


def test_set_knobs_publishes_a_version_and_says_so(run):
    before = run.knobs.values()
    outcome = run.do(SetKnobs({"horizon": 4}))
    assert outcome == Outcome((f"knobs v{before[0] + 1}: horizon=4",), before[0] + 1)
    assert run.knobs.values() == (before[0] + 1, {**before[1], "horizon": 4})
    with pytest.raises(ConfigError, match="horizon"):
        run.do(SetKnobs({"horizon": 0}))  # refused: nothing changes
    assert run.knobs.values()[0] == before[0] + 1


def test_pause_and_resume_on_the_owner_need_no_owner_to_ask(run):
    assert run.do(Pause()).notices == ("training paused",) and run.is_paused()
    assert run.do(Resume()).notices == ("training resumed",) and not run.is_paused()


def test_stop_on_the_owner_is_left_to_its_caller(run):
    assert run.do(Stop()) == Outcome(stop=True)
    assert not run.is_paused()  # nothing was stopped or paused by it


def test_the_showcase_commands_change_its_controls(run):
    assert run.do(ChooseShowcase(source=1, mode="replay")) == Outcome()
    assert run.showcase.settings()["source"] == 1
    assert run.showcase.settings()["mode"] == "replay"
    with pytest.raises(ConfigError, match="source"):
        run.do(ChooseShowcase(source=7))
    run.do(ResetShowcase())
    assert run.showcase._controls.reset.is_set()
    run.do(PauseRendering(True))
    assert run.showcase._render_paused.is_set()
    run.do(PauseRendering(False))
    assert not run.showcase._render_paused.is_set()


def test_remove_without_a_worker_takes_the_newest_merging_one(run):
    outcome = run.do(RemoveWorker())
    assert outcome.value == 2 and run.settings.removed == (2,)
    assert outcome.notices == ("worker 2 removed: it writes a checkpoint and leaves",)
    with pytest.raises(UserError, match="not in the run"):
        run.do(RemoveWorker(2))


def test_restart_without_a_worker_restarts_none_when_none_crashed(run):
    assert run.do(RestartWorker()) == Outcome()


def test_a_worker_is_added_only_to_a_started_run(run):
    with pytest.raises(UserError, match="start the run"):
        run.do(AddWorker())


def test_a_view_sends_the_owner_commands_and_the_owner_serves_them(run):
    view = Run.attach(run.path)
    assert view.do(Pause()).notices == ("training paused: asked of the process that owns the run",)
    assert not run.is_paused()  # asked, not done: the owner serves it
    removed = view.do(RemoveWorker())
    assert removed.notices == ("worker 2 removal asked: it writes a checkpoint and leaves",)
    stop = view.do(Stop())
    assert not stop.stop and "owns the run" in stop.notices[0]
    assert sent(run) == [
        {"action": "pause", "worker": None, "lane": None, "error": None},
        {"action": "remove_worker", "worker": 2, "lane": None, "error": None},
        {"action": "stop", "worker": None, "lane": None, "error": None},
    ]
    served = run.serve_requests()
    assert [(r.action, r.worker, r.error) for r in served] == [
        ("pause", None, None),
        ("remove_worker", 2, None),
        ("stop", None, None),  # left to the owner's caller
    ]
    assert run.is_paused() and run.settings.removed == (2,)


def test_a_request_the_owner_refuses_comes_back_with_the_reason(run):
    run.requests.send("remove_worker", worker=9)
    (served,) = run.serve_requests()
    assert served.action == "remove_worker" and "not in the run" in served.error
    assert run.settings.removed == ()
