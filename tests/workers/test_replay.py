"""The viewport's replay: recorded poses draw the episode's own frames, files in the run
directory are atomic snapshots (a run from before them opens without), and the playhead keeps
real speed whatever the frame rate (a fake clock)."""

import json
import multiprocessing as mp
import threading
import time
from dataclasses import asdict

import numpy as np
import pytest
from conftest import tiny_run
from helpers.clock import FakeClock

from agent.envs import make_env
from workers.rundir.directory import RunDir
from workers.rundir.replays import (
    EpisodeReplay,
    newest_replay,
    read_replay,
    replay_path,
    write_replay,
)
from workers.showcase.frames import FrameBuffer
from workers.showcase.player import Player, PlayerSpec, ShowcaseControls, light_rendering
from workers.showcase.replay import Playhead, newest_episode, use_replay
from workers.training.trainer import Trainer


def episode(worker: int = 0, kind: str = "train", length: int = 50, step: int = 500):
    rewards = np.linspace(0.0, 1.0, length, dtype=np.float32)
    states = np.stack([np.array([0.01 * t, 0.05 * t]) for t in range(length + 1)])
    return EpisodeReplay(states, rewards, worker, kind, step, 3, 0.02)


def test_recorded_poses_draw_the_episodes_own_frames():
    env = make_env("cartpole-balance", seed=3, render_size=(48, 64))
    _, info = env.reset(seed=3)
    rng = np.random.default_rng(0)
    states, frames = [info["state"]], [env.render()]
    for _ in range(15):
        *_, info = env.step(rng.uniform(-1, 1, env.action_space.shape))
        states.append(info["state"])
        frames.append(env.render())
    env.close()
    assert not np.array_equal(frames[0], frames[-1]), "the cart must have moved"
    other = make_env("cartpole-balance", seed=9, render_size=(48, 64))
    other.reset(seed=9)
    for state, frame in zip(states, frames):
        other.show_state(state)
        assert np.array_equal(other.render(), frame)
    other.close()


def test_replay_files_are_whole_snapshots_and_old_runs_have_none(tmp_path):
    assert newest_replay(tmp_path) is None and newest_episode(tmp_path, -1) is None
    write_replay(tmp_path, episode(worker=0, step=500))
    write_replay(tmp_path, episode(worker=1, kind="eval", step=600))
    back = read_replay(replay_path(tmp_path, 0))
    assert back.step == 500 and back.length == 50 and back.states.shape == (51, 2)
    assert back.ret == pytest.approx(25.0) and back.return_at(10) == pytest.approx(
        back.rewards[:10].sum()
    )
    assert newest_replay(tmp_path, [0]) == replay_path(tmp_path, 0)
    assert newest_replay(tmp_path) == replay_path(tmp_path, 1, "eval")  # written last
    assert newest_replay(tmp_path, [1], ("train",)) is None
    assert newest_episode(tmp_path, 1).kind == "eval"
    assert [p.name for p in (tmp_path / "replays").iterdir()] != []
    assert not list((tmp_path / "replays").glob(".*tmp"))  # no temporary file left
    replay_path(tmp_path, 0).write_bytes(b"half a file")
    assert read_replay(replay_path(tmp_path, 0)) is None  # damaged: skipped, never a crash


def test_the_playhead_shows_the_pose_of_the_moment_at_real_speed():
    clock = FakeClock()
    head = Playhead(episode(length=50), clock)
    assert head.index() == 0
    clock.sleep(0.5)  # 0.5 s at 0.02 s per agent step
    assert head.index() == 25
    clock.sleep(0.013)
    assert head.index() == 25
    clock.sleep(0.5)
    assert head.index() == 50 and not head.finished()  # the last pose is held a moment
    clock.sleep(1.0)
    assert head.finished()


def test_auto_replays_only_where_live_play_is_slow_on_a_cpu_budget():
    assert use_replay("replay", None, budgeted=False)
    assert not use_replay("live", 0.01, budgeted=True)
    assert not use_replay("auto", None, budgeted=True)  # not measured yet: live first
    assert use_replay("auto", 0.04, budgeted=True)
    assert not use_replay("auto", 0.9, budgeted=True)
    assert not use_replay("auto", 0.04, budgeted=False)  # a GPU, or training paused


class TakenFrames:
    """A frame buffer whose reader takes every frame at once, kept with the clock's time."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.written = clock, []

    def wanted(self) -> bool:
        return True

    def write(self, frame, episode, step, weights_round, ret, **info) -> None:
        self.written.append((self.clock(), step, frame.copy(), ret, {"replay": 0, **info}))

    def close(self) -> None:
        pass


def test_a_replay_draws_each_frame_at_its_moment_of_the_episode(tmp_path):
    cfg = tiny_run(10, episode_length=40)
    env = make_env(cfg.task, seed=5, render_size=(48, 64))
    light_rendering(env)  # the player's look
    _, info = env.reset(seed=5)
    states, rewards, truth = [info["state"]], [], [env.render()]
    rng = np.random.default_rng(1)
    for _ in range(40):
        _, reward, *_, info = env.step(rng.uniform(-1, 1, env.action_space.shape))
        states.append(info["state"])
        rewards.append(reward)
        truth.append(env.render())
    env.close()
    replay = EpisodeReplay(np.stack(states), np.array(rewards), 1, "train", 400, 8, 0.02)

    clock = FakeClock()
    buffer = FrameBuffer(48, 64)
    spec = PlayerSpec(str(tmp_path), asdict(cfg), buffer.name, 48, 64, max_fps=10)
    controls = ShowcaseControls(
        mp.Value("i", 0), mp.Value("i", 1), mp.Event(), None, mp.Value("i", 2)
    )
    player = Player(spec, threading.Event(), threading.Event(), controls, threading.Event())
    player.frames.close()
    player.frames = TakenFrames(clock)
    player.clock, player.sleep = clock, clock.sleep
    wrong = EpisodeReplay(np.zeros((41, 7)), np.zeros(40), 1, "train", 400, 8, 0.02)
    assert player.fits(replay) and not player.fits(wrong)  # another model's poses: passed over
    started = clock()
    try:
        player.play_replay(replay)
    finally:
        player.env.close()
        player.log.close()
        buffer.close(unlink=True)
    written = player.frames.written
    assert len(written) >= 8  # 0.8 s of episode at most 10 frames a second
    for at, step, frame, ret, info in written:
        assert step == min(40, int((at - started) / 0.02 + 1e-9))  # the pose of that moment
        assert np.array_equal(frame, truth[step])
        assert ret == pytest.approx(sum(rewards[:step]), abs=1e-4)
        assert info["replay"] == 1 and info["replay_worker"] == 1
    # The pace, measured from the frames played (the last pose, held, left out): the agent
    # steps shown advance by one per 0.02 s of the clock, 1x within one step; the pace each
    # frame reports is that measured figure, within one step over the span.
    moving = [(at, step, info["pace"]) for at, step, _, _, info in written if step < 40]
    (t0, s0, _), (t1, s1, _) = moving[0], moving[-1]
    assert t1 - t0 >= 0.5 and abs((s1 - s0) - (t1 - t0) / 0.02) <= 1, (t1 - t0, s1 - s0)
    measured = (s1 - s0) * 0.02 / (t1 - t0)
    for _, _, pace in moving:
        assert pace == pytest.approx(measured, abs=0.02 / (t1 - t0)), (pace, measured)
    gaps = np.diff([at for at, *_ in written])
    assert gaps.min() >= 0.1 - 1e-9  # the frame-rate cap, never more frames than asked
    assert written[-1][1] == 40  # the last pose is shown


def test_workers_keep_their_newest_training_and_evaluation_episode(tmp_path):
    cfg = tiny_run(110, episode_length=30, seed_steps=40, pretrain_updates=3, eval_every=100)
    dirs = [RunDir(tmp_path, metrics=f"worker-{k}.jsonl", weights=f"w{k}.pt") for k in (0, 1)]
    Trainer(cfg, dirs, progress=False, seeds=[1, 2]).run()
    for k in (0, 1):
        train, evaluation = (
            read_replay(replay_path(tmp_path, k)),
            read_replay(replay_path(tmp_path, k, "eval")),
        )
        assert train.worker == k and train.kind == "train" and train.episode == 3
        assert train.step == 90 and train.states.shape == (31, 2) and train.step_seconds == 0.02
        assert evaluation.kind == "eval" and evaluation.step == 110 and evaluation.length == 30
        lines = (tmp_path / f"worker-{k}.jsonl").read_text().splitlines()
        episodes = [r for r in map(json.loads, lines) if r["kind"] == "episode"]
        assert episodes[2]["ret"] == pytest.approx(train.ret, abs=1e-3)  # the third episode


def test_a_run_from_before_replays_plays_live_when_a_replay_is_asked(tmp_path):
    cfg = tiny_run(10, episode_length=40)
    buffer = FrameBuffer(48, 64)
    spec = PlayerSpec(str(tmp_path), asdict(cfg), buffer.name, 48, 64, realtime=False)
    controls = ShowcaseControls(
        mp.Value("i", 0), mp.Value("i", -1), mp.Event(), None, mp.Value("i", 2)
    )
    stop = threading.Event()
    player = Player(spec, threading.Event(), stop, controls, threading.Event())
    player.frames.close()
    player.frames = TakenFrames(time.monotonic)

    def stop_at_first_frame() -> None:
        deadline = time.monotonic() + 60
        while not player.frames.written and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()

    threading.Thread(target=stop_at_first_frame, daemon=True).start()
    try:
        player.run()  # in this thread: the GL context is made and freed here
    finally:
        buffer.close(unlink=True)
    assert player.frames.written, "no frame"
    assert all(info["replay"] == 0 for *_, info in player.frames.written)  # live play
