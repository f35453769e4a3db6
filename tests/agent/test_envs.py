import os

import numpy as np
import pytest

from agent.envs import make_env, make_vector_env, resolve_task, start_step, task_names
from agent.errors import ConfigError
from agent.pixels import OBS_DIM, SIZE, frames_of


def test_unknown_task_lists_valid_names():
    with pytest.raises(ConfigError) as err:
        resolve_task("walker-fly")
    assert "walker-walk" in str(err.value) and "humanoid-walk" in str(err.value)


def test_every_suite_task_is_named():
    names = task_names()
    assert len(names) >= 50
    for name in (
        "walker-walk",
        "cheetah-run",
        "humanoid-walk",
        "cartpole-balance",
        "dog-run",
        "ball-in-cup-catch",
        "cup-catch",
        "cartpole-swingup-sparse",
    ):
        assert name in names
    assert resolve_task("cartpole_swingup_sparse") == ("cartpole", "swingup_sparse")


def test_episode_has_500_agent_steps_with_action_repeat():
    env = make_env("cartpole-balance", seed=0)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs.shape == env.observation_space.shape == (5,)
    assert env.action_space.low.min() == -1 and env.action_space.high.max() == 1
    steps, truncated = 0, False
    while not truncated:
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert not terminated and 0 <= reward <= 2  # two control steps, each rewarded in [0, 1]
        steps += 1
    assert steps == 500 and env.physics.data.time == pytest.approx(10.0, abs=0.05)
    env.close()


def test_seeding_is_reproducible():
    def rollout(seed):
        env = make_env("walker-walk", seed=seed)
        obs, _ = env.reset(seed=seed)
        out = [obs]
        for _ in range(5):
            out.append(env.step(np.full(6, 0.3, np.float32))[0])
        env.close()
        return np.stack(out)

    assert np.array_equal(rollout(3), rollout(3))
    assert not np.array_equal(rollout(3), rollout(4))


def test_offscreen_rendering_works_and_backend_is_set():
    assert os.environ["MUJOCO_GL"] in ("egl", "osmesa", "glfw")
    env = make_env("cartpole-balance", seed=0)
    env.reset(seed=0)
    frame = env.render()
    assert frame.shape == (240, 320, 3) and frame.dtype == np.uint8
    assert frame.std() > 5, "blank frame"
    env.close()


def test_vector_env_resets_finished_envs_and_keeps_final_obs():
    env = make_vector_env("cartpole-balance", 2, seed=0, episode_length=3)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, 5)
    for _ in range(3):
        obs, _, _, truncated, info = env.step(np.zeros((2, 1), np.float32))
    assert truncated.all() and info["final_obs"][0].shape == (5,)
    assert not np.array_equal(info["final_obs"][0], obs[0])
    env.close()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["in-process", "subprocesses"])
def test_a_started_step_finishes_as_a_plain_step(asynchronous):
    # The trainer starts the envs' step, updates meanwhile, then finishes it: the same
    # transition as a plain step, whichever kind of vector env it is.
    """The trainer's started-then-finished step gives the transition of a plain step, for an
    in-process vector env and one stepped in subprocesses: only the subprocess case shows the
    step's result crossing back from the env processes."""
    started = make_vector_env("cartpole-balance", 2, seed=3, asynchronous=asynchronous)
    plain = make_vector_env("cartpole-balance", 2, seed=3, asynchronous=False)
    action = np.array([[0.5], [-0.5]], np.float32)
    try:
        for env in (started, plain):
            env.reset(seed=[3, 4])
        finish = start_step(started, action)
        expected = plain.step(action)
        got = finish()
        for a, b in zip(got[:4], expected[:4]):
            np.testing.assert_array_equal(a, b)
    finally:
        started.close()
        plain.close()


# pixels ----------------------------------------------------------------------------------------
def test_a_pixel_env_stacks_the_cameras_frames_at_reset_and_at_each_step():
    env = make_env("cartpole-swingup", seed=0, obs="rgb")
    assert env.observation_space.shape == (OBS_DIM,) and env.observation_space.dtype == np.uint8
    obs, _ = env.reset(seed=0)
    first = env.pixel_frame()
    assert first.shape == (SIZE, SIZE, 3) and first.std() > 5, "a blank frame"
    # the camera: the authors' (0 here), 64x64
    assert np.array_equal(first, env.physics.render(height=64, width=64, camera_id=0))
    assert all(np.array_equal(f, first) for f in frames_of(obs)), "reset fills every slot"
    seen = [first]
    for _ in range(4):
        obs, *_ = env.step(np.ones(1, np.float32))
        seen.append(env.pixel_frame())
        expected = ([first] * 2 + seen)[-3:]
        assert all(np.array_equal(f, s) for f, s in zip(frames_of(obs), expected, strict=True))
    assert not np.array_equal(seen[-1], seen[-2]), "the cart moved between frames"
    env.close()


def test_quadruped_is_seen_through_its_camera_2():
    env = make_env("quadruped-walk", seed=0, obs="rgb")
    obs, _ = env.reset(seed=0)
    assert env.pixel_camera == 2
    assert np.array_equal(frames_of(obs)[-1], env.physics.render(64, 64, camera_id=2))
    env.close()


def test_a_new_episode_does_not_stack_frames_of_the_one_before():
    env = make_vector_env("cartpole-balance", 1, seed=0, episode_length=3, obs="rgb")
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        obs, _, _, truncated, info = env.step(np.ones((1, 1), np.float32))
    assert truncated.all()
    fresh = frames_of(obs[0])
    assert all(np.array_equal(f, fresh[0]) for f in fresh), "the reset's frame in every slot"
    ended = frames_of(info["final_obs"][0])
    assert not np.array_equal(ended[-1], fresh[-1]) and not np.array_equal(ended[0], ended[-1])
    env.close()


def test_pixels_are_for_dmcontrol_tasks():
    with pytest.raises(ConfigError, match="DMControl tasks only"):
        make_env("Pendulum-v1", obs="rgb")
