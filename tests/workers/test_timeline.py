"""The timeline and the panes, on the run's side: which album episode a step or a chart click
finds, the player replaying the episode pinned (a fake clock: no sleeps), panes tiling the
episodes asked for, and the commands that ask for them, as data through run.do."""

import threading

import numpy as np
import pytest
from conftest import tiny_run
from helpers import players

from agent.envs import make_env
from agent.errors import ConfigError, UserError
from workers.run.commands import ChooseShowcase, Outcome, PinEpisode, ShowPanes
from workers.run.owner import Run, RunSettings
from workers.rundir.album import AlbumEntry, album_entries, keep_in_album
from workers.rundir.knob_record import KnobStore
from workers.rundir.lanes import Lane
from workers.rundir.replays import EpisodeReplay
from workers.showcase.episodes import (
    find_entry,
    nearest_entry,
    pane_boxes,
    pane_episodes,
    spread_entries,
)
from workers.showcase.frames import FrameBuffer, PaneInfo, pane_infos
from workers.showcase.player import Player, light_rendering

H, W = 48, 64


class TakenFrames:
    """A reader that takes every frame at once; stops the player after `last` frames."""

    def __init__(self, stop: threading.Event | None = None, last: int = 10**9) -> None:
        self.written: list[tuple[np.ndarray, dict]] = []
        self.stop, self.last = stop, last

    def wanted(self) -> bool:
        return True

    def write(self, frame, episode, step, weights_round, ret, **info) -> None:
        self.written.append((frame.copy(), {"step": step, "return": ret, **info}))
        if self.stop is not None and len(self.written) >= self.last:
            self.stop.set()

    def close(self) -> None:
        pass


def pose_episode(angle: float, worker: int, step: int, kind: str = "train", length: int = 10):
    """A cartpole episode standing still at `angle` (qpos: cart position, pole angle)."""
    states = np.tile(np.array([0.0, angle]), (length + 1, 1))
    rewards = np.full(length, step / 1000, np.float32)
    return EpisodeReplay(states, rewards, worker, kind, step, 1, 0.02)


def entries(*steps: int, worker: int = 0) -> list[AlbumEntry]:
    return [AlbumEntry(worker, "train", s, None) for s in steps]  # type: ignore[arg-type]


def test_a_step_finds_the_nearest_album_episode_within_reach():
    album = entries(100, 200, 400, 1600)
    assert nearest_entry(album, 290, reach=500).step == 200
    assert nearest_entry(album, 300, reach=500).step == 200  # a tie: the earlier
    assert nearest_entry(album, 5000, reach=500) is None  # none near enough
    assert nearest_entry([], 100, reach=500) is None


def test_then_and_now_takes_the_first_the_thirds_and_the_newest():
    album = entries(*range(100, 1100, 100))  # 10 episodes
    assert [e.step for e in spread_entries(album, 2)] == [100, 1000]
    assert [e.step for e in spread_entries(album, 4)] == [100, 400, 700, 1000]
    assert [e.step for e in spread_entries(album[:3], 4)] == [100, 200, 300]  # fewer: all


def test_panes_tile_the_frame_side_by_side_then_two_by_two():
    assert pane_boxes(48, 64, 1) == [(0, 0, 48, 64)]
    assert pane_boxes(48, 64, 2) == [(0, 0, 48, 32), (0, 32, 48, 32)]
    assert pane_boxes(48, 64, 3) == [(0, 0, 24, 32), (0, 32, 24, 32), (24, 0, 24, 32)]
    assert len(pane_boxes(48, 64, 4)) == 4


def test_pane_info_travels_through_the_frame_header():
    buffer = FrameBuffer(H, W)
    try:
        panes = [PaneInfo(0, 1, 128, 3.5, -1), PaneInfo(1, 2, 900, 41.25, 1)]
        buffer.write(np.zeros((H, W, 3), np.uint8), 0, 0, -1, 0.0, replay=1, panes=panes)
        _, info = buffer.read()
        assert info["panes"] == 2 and pane_infos(info) == panes
        buffer.write(np.zeros((H, W, 3), np.uint8), 0, 0, -1, 0.0, pinned=True)
        _, info = buffer.read()
        assert info["pinned"] == 1 and pane_infos(info) == []
    finally:
        buffer.close(unlink=True)


def make_player(tmp_path, pin=(-1, 0, 0), panes=0, stop=None):
    return players.make_player(tmp_path, tiny_run(10, episode_length=40), (H, W), pin, panes, stop)


def close(player: Player) -> None:
    player.env.close()
    player.log.close()


def test_the_player_replays_the_pinned_album_episode_and_loops_it(tmp_path):
    for step, angle in ((128, 0.3), (640, -0.4)):
        keep_in_album(tmp_path, pose_episode(angle, 0, step))
    assert find_entry(tmp_path, 0, "train", 128) is not None
    assert find_entry(tmp_path, 0, "eval", 128) is None
    stop = threading.Event()
    player = make_player(tmp_path, pin=(0, 0, 128), stop=stop)
    # Two loops of a 10-step episode (0.2 s + 1 s held) at 10 frames a second: about 24 frames.
    player.frames = TakenFrames(stop, last=30)
    player.run()  # in this thread: the GL context is made and freed here
    written = player.frames.written
    assert len(written) == 30
    for _, info in written:
        assert info["pinned"] and info["replay_worker"] == 0 and info["weights_step"] == 128
        assert info["replay_return"] == pytest.approx(10 * 0.128, abs=1e-4)
    assert sum(info["step"] == 0 for _, info in written) >= 2, "the episode loops"
    # An album episode that is gone by the time it is played: the newest plays instead (live
    # here, a run without replays).
    player.pinned_replay = None
    player.controls.pin[:] = [0, 0, 999]
    assert player.pin() == (0, 0, 999) and player.pinned_episode((0, 0, 999)) is None
    close(player)


def test_then_and_now_panes_show_the_first_and_the_newest_episode(tmp_path):
    for step, angle in ((128, 0.6), (300, 0.0), (640, -0.6)):
        keep_in_album(tmp_path, pose_episode(angle, 0, step))
    player = make_player(tmp_path, panes=1)  # then-now-2; source: worker 0
    player.frames = TakenFrames()
    try:
        player.play_panes("then-now-2")
        frame, info = player.frames.written[0]
        first, newest = info["panes"]
        assert (first.worker, first.kind, first.step, first.lane) == (0, 1, 128, -1)
        assert (newest.step, newest.ret) == (640, pytest.approx(6.4))
        truth = make_env("cartpole-balance", seed=1, render_size=(H, W // 2))
        light_rendering(truth)
        truth.reset(seed=1)
        halves = []
        for angle in (0.6, -0.6):
            truth.show_state(np.array([0.0, angle]))
            halves.append(truth.render(camera_id=0))
        truth.close()
        assert np.array_equal(frame[:, : W // 2], halves[0])  # then: the first episode
        assert np.array_equal(frame[:, W // 2 :], halves[1])  # now: the newest
        assert not np.array_equal(halves[0], halves[1])
    finally:
        close(player)


def test_lanes_panes_take_each_lanes_newest_episode(tmp_path, monkeypatch):
    """A pane per race lane, each its first replica's newest episode (with 2 replicas, lane 1's
    first copy is the record's third pool); no knob record: no lanes, no panes."""
    import workers.showcase.episodes as episodes

    assert pane_episodes(tmp_path, "lanes", -1) == []
    layout = ((0,), (1,), (2,), (3,))  # lane 0 replicas 0 and 1, lane 1 replicas 0 and 1
    KnobStore(tmp_path).initialise(tiny_run(100), 50, layout, [Lane()] * 4, replicas=2)
    shown = {-2: pose_episode(0.1, 0, 50), -4: pose_episode(0.2, 2, 60)}  # pools 0 and 2
    monkeypatch.setattr(episodes, "newest_episode", lambda _, source: shown.get(source))
    panes = pane_episodes(tmp_path, "lanes", -1)
    assert [(r.worker, lane) for r, lane in panes] == [(0, 0), (2, 1)]


@pytest.fixture
def run(tmp_path):
    return Run.create(tmp_path / "run", tiny_run(100), RunSettings(workers=2, pack=1))


def test_pin_and_panes_are_commands_carried_out_by_run_do(run):
    keep_in_album(run.path, pose_episode(0.2, 1, 256, kind="eval"))
    # The timeline panel sends a pin unless it equals the last one sent (a drag's repeats; the
    # equal case: tests/viewer/test_timeline_view.py): every field tells two pins apart.
    others = (PinEpisode(1, "eval", 384), PinEpisode(1, "train", 256), PinEpisode(0, "eval", 256))
    assert PinEpisode(1, "eval", 256) not in others
    outcome = run.do(PinEpisode(1, "eval", 256))
    assert outcome == Outcome(("viewport: worker 1's evaluation episode at step 256, looping",))
    assert run.showcase.settings()["pin"] == (1, "eval", 256)
    assert run.do(PinEpisode()).notices == ("viewport: the newest episodes again",)
    assert run.showcase.settings()["pin"] is None
    run.do(PinEpisode(1, "eval", 256))
    run.do(ChooseShowcase(source=0))
    assert run.showcase.settings()["pin"] is None, "another source: its own timeline"
    assert run.do(ShowPanes("then-now-4")) == Outcome()
    assert run.showcase.settings()["panes"] == "then-now-4"
    assert [e.step for e in album_entries(run.path)] == [256]


@pytest.mark.parametrize(
    "command, error, message",
    [
        (PinEpisode(0, "train", 999), UserError, "no train episode of worker 0 ending at step 999"),
        (PinEpisode(0, "test", 1), ConfigError, "kind must be one of train, eval"),
        (PinEpisode(-1, "train", 1), ConfigError, "a worker >= 0"),
        (ShowPanes("lanes"), UserError, "panes by lane need a race"),
        (ShowPanes("grid"), ConfigError, "panes must be one of single, then-now-2"),
    ],
)
def test_bad_pins_and_panes_are_refused_with_one_message(run, command, error, message):
    before = run.showcase.settings()
    with pytest.raises(error, match=message):
        run.do(command)
    assert run.showcase.settings() == before  # nothing changed


def test_then_and_now_ends_with_the_newest_episode_even_when_the_album_passed_it_over(tmp_path):
    from workers.rundir.replays import write_replay

    for step in (100, 200, 300):
        keep_in_album(tmp_path, pose_episode(0.1, worker=0, step=step))
    assert [r.step for r, _ in pane_episodes(tmp_path, "then-now-2", 0)] == [100, 300]
    write_replay(tmp_path, pose_episode(0.2, worker=0, step=350))  # newest, not in the album
    assert [r.step for r, _ in pane_episodes(tmp_path, "then-now-2", 0)] == [100, 350]
    assert [r.step for r, _ in pane_episodes(tmp_path, "then-now-4", 0)] == [100, 200, 300, 350]


def test_an_attached_window_finds_the_owners_album_and_pins_from_it(run):
    # The owner's workers wrote the album; a window attached to the run reads the same files.
    for step in (128, 256, 384):
        keep_in_album(run.path, pose_episode(0.1, 0, step))
    view = Run.attach(run.path)
    from workers.showcase.episodes import source_album

    assert [e.step for e in source_album(view.path, 0)] == [128, 256, 384]
    assert view.do(PinEpisode(0, "train", 256)).notices == (
        "viewport: worker 0's episode at step 256, looping",
    )
    assert view.showcase.settings()["pin"] == (0, "train", 256)
    assert run.showcase.settings()["pin"] is None, "the view's own player, not the owner's"
