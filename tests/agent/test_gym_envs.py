"""Any gymnasium env (agent/envs/gym.py): reached by id or `module:EnvId`, held to the contract
TD-MPC2 needs, its actions rescaled and its observations flattened, terminations kept apart from
the time limit."""

import numpy as np
import pytest

from agent.envs import (
    check_task,
    make_env,
    make_vector_env,
    task_defaults,
    task_kind,
    time_limit,
)
from agent.errors import ConfigError

SLIDE = "helpers.slide_env:Slide-v0"


def test_a_users_env_is_reached_as_module_colon_id_and_flattened_in_key_order():
    assert task_kind(SLIDE) == "gymnasium" and time_limit(SLIDE) == 40
    env = make_env(SLIDE, seed=3, action_repeat=1, episode_length=40)
    obs, _ = env.reset()
    inner = env._env.unwrapped
    # position before velocity: sorted keys, whatever order the Dict was declared in
    assert obs.dtype == np.float32 and obs.tolist() == pytest.approx([inner.pos, inner.vel])
    assert env.observation_space.shape == (2,) and env.action_space.shape == (2,)
    env.close()


def test_actions_in_minus_one_to_one_reach_the_env_at_its_own_bounds():
    env = make_env(SLIDE, seed=0, action_repeat=1, episode_length=40)
    env.reset()
    for action, expected in (([-1, -1], [0, -1]), ([1, 1], [4, 3]), ([0, 0], [2, 1])):
        env.step(np.array(action, np.float32))
        assert env._env.unwrapped.actions[-1].tolist() == pytest.approx(expected)
    env.step(np.array([5.0, -7.0]))  # outside [-1, 1]: clipped to the bounds, never beyond
    assert env._env.unwrapped.actions[-1].tolist() == pytest.approx([4, -1])
    env.close()


def test_a_termination_stays_one_and_the_time_limit_truncates():
    env = make_env(SLIDE, seed=0, action_repeat=1, episode_length=40)
    env.reset(seed=0)
    steps, terminated, truncated = 0, False, False
    while not (terminated or truncated):  # full push: off the rail within a few steps
        _, reward, terminated, truncated, _ = env.step(np.array([1.0, -1.0]))
        steps += 1
    assert terminated and not truncated and reward == -1.0 and steps < 40
    env.reset(seed=0)
    steps, terminated, truncated = 0, False, False
    while not (terminated or truncated):  # no push, full brake: it stays on the rail
        _, _, terminated, truncated, _ = env.step(np.array([0.0, 1.0]))
        steps += 1
    assert truncated and not terminated and steps == 40


def test_action_repeat_sums_rewards_and_the_episode_length_counts_agent_steps():
    one = make_env(SLIDE, seed=1, action_repeat=1, episode_length=40)
    two = make_env(SLIDE, seed=1, action_repeat=2, episode_length=20)
    one.reset(seed=5), two.reset(seed=5)
    calm = np.array([0.0, 1.0])
    rewards = [one.step(calm)[1] for _ in range(4)]
    assert two.step(calm)[1] + two.step(calm)[1] == pytest.approx(sum(rewards))
    steps, truncated = 2, False
    while not truncated:
        truncated = two.step(calm)[3]
        steps += 1
    assert steps == 20


def test_seeds_give_each_env_copy_its_own_start():
    env = make_vector_env(SLIDE, 3, seed=10, action_repeat=1, episode_length=40)
    obs, _ = env.reset(seed=[10, 11, 12])
    again = make_vector_env(SLIDE, 3, seed=10, action_repeat=1, episode_length=40)
    obs2, _ = again.reset(seed=[10, 11, 12])
    assert len({tuple(o) for o in obs}) == 3 and np.array_equal(obs, obs2)
    env.close(), again.close()


@pytest.mark.parametrize(
    "task, says",
    [
        ("CartPole-v1", r"needs continuous Box actions .*; its action space is Discrete\(2\)"),
        ("Pendulum-v1", None),
        ("nope_pkg:Thing-v0", "cannot import 'nope_pkg'"),
        (
            "helpers.broken_env:Rail-v0",
            r"cannot import 'helpers.broken_env' \(RuntimeError: the rail's length is not set\)",
        ),
        (  # sys.exit at import: SystemExit, no Exception, and not the program's end
            "helpers.exiting_env:Rail-v0",
            r"cannot import 'helpers.exiting_env' \(SystemExit: set RAIL_LENGTH first\)$",
        ),
        ("NoSuchEnv-v3", "neither a DMControl task"),
    ],
)
def test_what_td_mpc2_cannot_use_is_one_line_saying_what_it_needs(task, says):
    if says is None:  # a continuous classic-control env is fine
        env = make_env(task, action_repeat=1, episode_length=200)
        assert env.action_space.shape == (1,)
        env.close()
        return
    with pytest.raises(ConfigError, match=says) as refused:
        make_env(task)
    assert "\n" not in str(refused.value) and refused.value.field == "task"


def test_a_gymnasium_task_brings_its_own_defaults_and_dmcontrol_none():
    assert task_defaults("cartpole-balance") == {}
    assert task_defaults("Hopper-v5") == {
        "action_repeat": 1,
        "episode_length": 1000,
        "episodic": True,
        "discount": 0.99,  # the heuristic's 0.995, capped as the authors cap it for these
        "rho": 0.7,
    }
    assert task_defaults(SLIDE)["discount"] == pytest.approx(0.95)  # 40 steps: the floor
    assert task_defaults(SLIDE)["episodic"]  # a user's env may terminate (this one does)


@pytest.mark.parametrize(
    "task, env_kwargs, episodic",
    [
        ("HalfCheetah-v5", None, False),
        ("Swimmer-v5", None, False),
        ("Reacher-v5", None, False),
        ("Pusher-v5", None, False),
        ("Pendulum-v1", None, False),
        ("Hopper-v5", None, True),
        ("Hopper-v5", {"terminate_when_unhealthy": False}, False),
        ("InvertedPendulum-v5", None, True),
    ],
)
def test_episodic_by_default_only_where_the_env_can_terminate(task, env_kwargs, episodic):
    assert task_defaults(task, env_kwargs=env_kwargs)["episodic"] is episodic
    assert task_defaults("Hopper-v5", action_repeat=3)["episode_length"] == 334
    with pytest.raises(ConfigError, match="env_kwargs are for gymnasium envs"):
        make_env("cartpole-balance", env_kwargs={"x": 1})


def test_env_kwargs_reach_the_env_and_bad_ones_are_one_line():
    env = make_env(SLIDE, action_repeat=1, episode_length=40, env_kwargs={"rail": 3.0})
    assert env._env.unwrapped.rail == 3.0
    env.close()
    with pytest.raises(ConfigError, match="cannot be made with"):
        make_env(SLIDE, env_kwargs={"wings": 2})


def test_a_mujoco_env_renders_at_the_asked_size_from_its_cameras():
    env = make_env(
        "InvertedPendulum-v5", action_repeat=1, episode_length=1000, render_size=(60, 80)
    )
    env.reset(seed=0)
    assert env.renders and env.render().shape == (60, 80, 3)
    # It has no camera of its own: any id shows the env's own view, never a black frame.
    assert env.camera_names() == [] and env.render(camera_id=0).max() > 0
    assert env.control_timestep == pytest.approx(0.04)
    env.close()
    hopper = make_env("Hopper-v5", action_repeat=1, episode_length=1000, render_size=(60, 80))
    hopper.reset(seed=0)
    assert hopper.camera_names() == ["track"] and hopper.render(camera_id=0).max() > 0
    hopper.close()
    slide = make_env(SLIDE, action_repeat=1, episode_length=40)
    assert slide.render() is None and slide.mujoco_model is None  # it draws nothing
    slide.close()


def test_an_env_that_fails_gymnasiums_own_check_is_refused_in_one_line():
    check_task(SLIDE)  # passes gymnasium's checker
    with pytest.raises(ConfigError, match="SlideBroken-v0 fails gymnasium's env check") as bad:
        check_task("helpers.slide_env:SlideBroken-v0")
    assert "\n" not in str(bad.value)
    with pytest.raises(ConfigError, match="env_kwargs are for gymnasium envs"):
        check_task("cartpole-balance", {"x": 1})
