"""A run from pixels (issue 55) end to end on a tiny preset: spawned workers merge their
convolution weights, are killed, resume from their checkpoints, and the album makes a montage
with the agent's frames; the trainer's buffer holds what the env gave; the player's agent view."""

import os
import signal
from functools import partial

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from conftest import events, tiny_run, wait_until
from helpers.players import make_player

from agent.errors import UserError
from agent.pixels import FRAMES, OBS_DIM, frames_of
from workers.run.owner import Run, RunSettings
from workers.rundir.directory import load_state
from workers.rundir.records import Merge, Resumed, SelfCheck, Stop
from workers.showcase.agent_view import PoseFrames, frame_boxes, pose_frame
from workers.showcase.episodes import LAYOUTS
from workers.showcase.montage import render_montage
from workers.showcase.montage_plan import plan_montage
from workers.training.trainer import Trainer

H, W = 150, 200  # the player's frame in these tests


def pixel_run(steps: int, **overrides):
    return tiny_run(steps, obs="rgb", **overrides)


def test_two_pixel_workers_merge_are_killed_resume_and_make_a_montage(tmp_path):
    """Only spawned workers show the whole loop: the conv encoder's weights in the merge
    files, a kill -9 after a checkpoint, a resume that goes on from it, and the album's poses
    drawn again with the agent's frames beside them."""
    settings = RunSettings(
        workers=2, merge_every=50, checkpoint_every=100, merge_timeout_s=120, max_restarts=0
    )
    run = Run.create(tmp_path / "run", pixel_run(200), settings)
    run.start()
    done = lambda: min(len(events(run, Merge, w)) for w in (0, 1)) >= 3  # noqa: E731
    assert wait_until(done, timeout=300)
    assert wait_until(lambda: (run.path / "checkpoints" / "worker-1.pt").exists(), timeout=120)
    for worker in run.workers.procs.values():
        os.kill(worker.process.pid, signal.SIGKILL)
    assert wait_until(lambda: all(w["state"] == "crashed" for w in run.workers.progress()), 60)
    run.stop()
    assert all(m.participants == (0, 1) for w in (0, 1) for m in events(run, Merge, w))
    assert all(c.sound for c in events(run, SelfCheck))
    merged = load_state(run.path / "merge" / "merged.pt")["model"]
    conv = merged["encoder.convs.0.weight"]
    assert conv.shape == (32, 9, 7, 7) and torch.isfinite(conv).all()

    resumed = Run.resume(run.path, steps=250)
    resumed.start()
    resumed.workers.wait()
    for worker in (0, 1):
        assert events(resumed, Resumed, worker)[-1].step >= 100
        assert events(resumed, Stop, worker)[-1].step == 250

    plan = plan_montage(run.path, episodes=2)
    size = (120, 200)
    with_view = iio.imread(render_montage(plan, tmp_path / "seen.mp4", size), index=10)
    without = iio.imread(
        render_montage(plan, tmp_path / "plain.mp4", size, agent_view=False), index=10
    )
    top, left, side = frame_boxes(*size)[-1]
    column = with_view[top : top + side, left : left + side].astype(float)
    assert column.std() > 5, "the agent's newest frame is drawn in the column"
    assert not np.allclose(column, without[top : top + side, left : left + side], atol=20)


def test_the_buffer_gives_back_the_observations_the_env_gave(monkeypatch):
    """Every valid row's stacked observation, rebuilt from single frames, equals what the env
    returned at that step of that episode (seed steps only: no learning needed)."""
    cfg = pixel_run(60, seed_steps=100, episode_length=20, eval_every=0)
    seen: list[np.ndarray] = []
    finish = Trainer._finish_episode

    def keep(self, m, ep, terminated, env_index):
        seen.append(np.stack(ep.obs))
        finish(self, m, ep, terminated, env_index)

    monkeypatch.setattr(Trainer, "_finish_episode", keep)
    trainer = Trainer(cfg, progress=False)
    monkeypatch.setattr(trainer, "_evaluate", lambda: None)
    trainer.run()
    buffer = trainer.buffer
    assert len(seen) == 3 and buffer.obs.shape[1] == OBS_DIM // FRAMES
    rows = torch.arange(buffer.capacity)[buffer.episode >= 0]
    stacked = buffer.stacked(rows).numpy()
    for row, obs in zip(rows.tolist(), stacked, strict=True):
        episode, step = int(buffer.episode[row]), int(buffer.position[row])
        assert np.array_equal(obs, seen[episode][step]), (episode, step)
    first = frames_of(seen[1][0])
    assert all(np.array_equal(f, first[0]) for f in first), "a new episode's stack is its own"


def test_the_player_shows_the_frames_the_agent_was_given_live_and_in_a_replay(tmp_path):
    """The agent-view layout: live, the column holds the observation's frames; replayed from
    poses, the same frames again (the same pose draws the same frame). The player renders with
    the training quality (its light settings would change what the agent sees)."""
    panes = LAYOUTS.index("agent-view")
    player = make_player(tmp_path, pixel_run(10, episode_length=40), (H, W), panes=panes)
    env = player.env
    try:
        assert player.agent_view() and env.mujoco_model.vis.quality.offsamples > 0
        obs, info = env.reset(seed=0)
        observations, poses = [obs], [info["state"]]
        for _ in range(4):
            obs, *_, info = env.step(np.full(1, 0.8, np.float32))
            observations.append(obs)
            poses.append(info["state"])
        shot, _, renders = player.render_shown(frames_of(obs))
        assert renders and shot.shape == (H, W, 3)
        for (top, left, side), frame in zip(frame_boxes(H, W), frames_of(obs), strict=True):
            pick = np.arange(side) * 64 // side
            assert np.array_equal(shot[top : top + side, left : left + side], frame[pick][:, pick])
        replayed = PoseFrames(np.stack(poses), partial(pose_frame, env))
        for index, given in enumerate(observations):
            assert np.array_equal(replayed.at(index), frames_of(given)), index
    finally:
        env.close()
        player.log.close()


def test_the_agents_view_is_for_runs_from_pixels(tmp_path):
    run = Run.create(tmp_path / "run", tiny_run(100), RunSettings(workers=1))
    with pytest.raises(UserError, match="frames a run from pixels learns from"):
        run.showcase.show_panes("agent-view")
    assert run.showcase.settings()["panes"] == "single"
