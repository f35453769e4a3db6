"""The window's controller without a window or a process: the commands the panels send reach the
run's one dispatch as data, on the controller's thread (a flag at once), and what the run
answers becomes the status line's notices. The run is real but never started: opening it is
recorded, not carried out (it would spawn workers and the player)."""

import queue
import time

import pytest
from conftest import tiny_run as tiny
from conftest import wait_until
from helpers.album_run import episode_poses

from viewer.controller import Controller
from workers.door import (
    ChooseShowcase,
    ConnectedRun,
    MakeMontage,
    OpenShowcase,
    Outcome,
    Pause,
    PauseRendering,
    RemoveWorker,
    RunServer,
    SetKnobs,
    ShowPanes,
    Stop,
)
from workers.run.handle import handle
from workers.run.owner import AttachedRun, Run, RunSettings
from workers.rundir.album import keep_in_album
from workers.rundir.replays import EpisodeReplay


class Recording:
    """Records each command a run is given and carries out all but the opening."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.done = queue.SimpleQueue()

    def do(self, command):
        self.done.put(command)
        return Outcome() if isinstance(command, OpenShowcase) else handle(self, command)


class Recorded(Recording, Run):
    pass


class RecordedView(Recording, AttachedRun):
    pass


class UnopenedConnected(ConnectedRun):
    """A connected window's run whose opening is not carried out (no player)."""

    def do(self, command):
        return Outcome() if isinstance(command, OpenShowcase) else super().do(command)


def next_of(q: queue.SimpleQueue, timeout: float = 30.0):
    """The next item put on `q`, waiting at most `timeout` seconds."""
    return q.get(timeout=timeout)


def notices_until(controller: Controller, text: str, timeout: float = 30.0) -> list[str]:
    """The controller's notices up to the first one that contains `text`."""
    seen, deadline = [], time.monotonic() + timeout
    while not seen or text not in seen[-1]:
        seen.append(controller.notices.get(timeout=max(0.01, deadline - time.monotonic())))
    return seen


@pytest.fixture
def opened(tmp_path):
    run = Recorded.create(tmp_path / "run", tiny(100), RunSettings(workers=3, pack=1))
    controller = Controller((48, 64), viewport="replay")
    controller.open(lambda: run)
    assert next_of(run.done) == OpenShowcase(48, 64, mode="replay", nice=5)
    notices_until(controller, "started")
    yield controller, run
    controller.shutdown(timeout=60)


def test_a_knob_change_goes_to_the_run_as_data_and_its_version_is_told(opened):
    controller, run = opened
    controller.send(SetKnobs({"horizon": 4}))
    assert next_of(run.done) == SetKnobs({"horizon": 4})
    assert notices_until(controller, "knobs")[-1] == "knobs v1: horizon=4"
    assert run.knobs.values()[1]["horizon"] == 4


def test_a_refused_command_is_a_notice_and_the_controller_goes_on(opened):
    controller, run = opened
    controller.send(SetKnobs({"horizon": 0}))
    assert notices_until(controller, "refused")[-1].startswith("refused: ")
    controller.send(Pause())
    assert notices_until(controller, "paused")[-1] == "training paused"
    assert run.is_paused()


def test_a_flag_is_set_at_once_and_the_showcase_mode_is_kept_for_the_next_run(opened):
    controller, run = opened
    controller.send(PauseRendering(True))  # on this thread: no wait for the controller's
    assert run.showcase._render_paused.is_set()
    controller.send(ChooseShowcase(mode="live"))
    assert controller.viewport == "live"
    next_of(run.done)  # PauseRendering, done here
    assert next_of(run.done) == ChooseShowcase(mode="live")


def test_remove_takes_the_newest_merging_worker_and_stop_stops_the_owned_run(opened):
    controller, run = opened
    controller.send(RemoveWorker())
    assert notices_until(controller, "worker 2")[-1] == (
        "worker 2 removed: it writes a checkpoint and leaves"
    )
    controller.send(Stop())
    assert notices_until(controller, "stopped")[-1].startswith("stopped; checkpoints in")
    assert run._stop.is_set()


def test_a_view_asks_the_owner_and_its_stop_button_leaves_the_window_running(tmp_path):
    owner = Run.create(tmp_path / "run", tiny(100), RunSettings(workers=2, pack=1))
    view = RecordedView.open(owner.path)
    controller = Controller((48, 64))
    controller.open(lambda: view)
    try:
        notices_until(controller, "attached to")
        controller.send(Pause())
        asked = notices_until(controller, "paused")[-1]
        assert asked == "training paused: asked of the process that owns the run"
        assert not owner.is_paused()  # until the owner serves it
        controller.send(Stop())
        assert "owns the run: its workers stop" in notices_until(controller, "stop asked")[-1]
        served = owner.serve_requests()
        assert [r.action for r in served] == ["pause", "stop"] and owner.is_paused()
        assert controller.view.phase == "running"  # the view goes on watching
    finally:
        controller.shutdown(timeout=60)


def test_a_connected_window_steers_the_served_run_and_says_when_the_link_is_down(tmp_path):
    owner = Run.create(tmp_path / "run", tiny(100), RunSettings(workers=2, pack=1))
    server = RunServer("127.0.0.1", 0)
    server.start(owner.path)
    view = UnopenedConnected.connect(server.connect_url(), tmp_path / "mirror")
    controller = Controller((48, 64))
    controller.open(lambda: view)
    try:
        notices_until(controller, "connected to http://127.0.0.1")
        controller.send(SetKnobs({"horizon": 2}))
        assert notices_until(controller, "knobs v")[-1] == "knobs v1: horizon=2"
        assert owner.knobs.values()[1]["horizon"] == 2  # the served run has it
        server.stop()
        notices_until(controller, "link down")
        label = lambda: controller.view.wording.label  # noqa: E731
        assert wait_until(lambda: "link down" in label(), timeout=10)  # the status line says so
        controller.send(Pause())
        assert "not sent" in notices_until(controller, "refused")[-1]
    finally:
        controller.shutdown(timeout=60)


def test_a_montage_says_how_far_and_where_even_after_its_run_stopped(opened):
    controller, run = opened
    controller.send(MakeMontage())
    assert notices_until(controller, "refused")[-1].startswith("refused: no training episodes")
    states, rewards, seconds = episode_poses("cartpole-balance", 30, 0)
    keep_in_album(run.path, EpisodeReplay(states, rewards, 0, "train", 30, 1, seconds))
    controller.send(MakeMontage(episodes=1))
    started = notices_until(controller, "making a montage")[-1]
    controller.send(Stop())  # the run stops; the montage goes on and still reports
    done = notices_until(controller, "montage written", timeout=300)  # nice 10 on a busy host
    assert done[-1].endswith(started.rpartition(": ")[2])
    assert any("rendered" in line for line in done), "progress on the way"


def test_a_run_from_pixels_opens_on_the_agents_view_beside_the_pixel_curve(tmp_path):
    run = Recorded.create(tmp_path / "run", tiny(100, obs="rgb"), RunSettings(workers=1))
    controller = Controller((48, 64), viewport="replay")
    try:
        controller.open(lambda: run)
        assert next_of(run.done) == OpenShowcase(48, 64, mode="replay", nice=5)
        assert next_of(run.done) == ShowPanes("agent-view")
        notices_until(controller, "started")
        assert wait_until(lambda: controller.view.obs == "rgb")
        assert controller.view.panes == "agent-view"
        assert "no published curve for this task from pixels" in controller.view.published_note
    finally:
        controller.shutdown(timeout=60)
