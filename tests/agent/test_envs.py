import os

import numpy as np
import pytest

from agent.envs import make_env, make_vector_env, resolve_task, start_step, task_names
from agent.errors import ConfigError


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
