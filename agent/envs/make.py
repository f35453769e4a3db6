"""Environments by task name (a DMControl task, or any gymnasium id), one or a vector of copies
stepped together, each with its seed."""

from __future__ import annotations

import gc
import os
import sys
import warnings
from collections.abc import Callable, Sequence

import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv

from agent.config import Config
from agent.envs.dmcontrol import TASKS, DMControlEnv, canonical, task_names
from agent.envs.gym import (
    GymEnv,
    can_terminate,
    check_contract,
    gym_spec,
    is_gym_id,
    time_limit,
)
from agent.errors import ConfigError

Env = DMControlEnv | GymEnv


def task_kind(task: str) -> str:
    """ "dmcontrol" or "gymnasium"; an unknown name is a ConfigError listing what there is."""
    if canonical(task) in TASKS:
        return "dmcontrol"
    if is_gym_id(task):
        gym_spec(task)  # `module:EnvId`: the module imports and registers it
        return "gymnasium"
    raise ConfigError(
        f"unknown task {task!r}: neither a DMControl task ({', '.join(task_names())}) nor a "
        "gymnasium id (e.g. Hopper-v5, or my_pkg.envs:MyArm-v0 to import the package first)",
        "task",
    )


def check_task(task: str, env_kwargs: dict | None = None, obs: str = "state") -> None:
    """Everything a run checks about its task before it writes anything: the name, for a
    gymnasium env its contract and gymnasium's own env check, for pixels that the task
    renders here."""
    if task_kind(task) == "gymnasium":
        if obs == "rgb":
            raise ConfigError(
                f"--obs rgb renders DMControl tasks (as the authors' obs=rgb); {task} is a "
                "gymnasium env: leave --obs at state",
                "obs",
            )
        check_contract(task, env_kwargs)
    elif env_kwargs:
        raise ConfigError("env_kwargs are for gymnasium envs: DMControl tasks take none")
    elif obs == "rgb":
        check_renders(task)


def check_renders(task: str) -> None:
    """A pixel run's task must render offscreen here (MuJoCo's GL backend): one frame is
    rendered, else a ConfigError that says why."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the GL library's own warnings: the error says it
        failure = _render_failure(task)
    if failure:
        raise ConfigError(failure, "obs")


def _render_failure(task: str) -> str | None:
    env = DMControlEnv(task, obs="rgb")
    hook = sys.unraisablehook
    sys.unraisablehook = lambda _: None  # a half-made GL context complains as it is freed
    try:
        env.reset(seed=0)  # renders the first frame
        return None
    except Exception as err:  # noqa: BLE001  (whatever the GL backend raises)
        return render_failure(task, err)
    finally:
        env.close()
        del env
        gc.collect()
        sys.unraisablehook = hook


def render_failure(task: str, err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
    return (
        f"--obs rgb: {task} cannot render here (MUJOCO_GL={os.environ.get('MUJOCO_GL')}: "
        f"{first}); install EGL (libegl1) or OSMesa (libosmesa6), or train from states"
    )


def task_defaults(
    task: str, action_repeat: int | None = None, env_kwargs: dict | None = None
) -> dict:
    """Config values a task brings unless they are given. A gymnasium env, as the authors set up
    gymnasium's MuJoCo tasks: action repeat 1 (their envs skip frames already), episodes as
    long as the env's own time limit allows at the chosen repeat, the discount heuristic
    capped at 0.99 and rho 0.7; episodic mode where the env can terminate (HalfCheetah's
    episodes never do: no termination head to learn for nothing). A DMControl task: none
    (Config's defaults are its own)."""
    if task_kind(task) != "gymnasium":
        return {}
    repeat = action_repeat or 1
    length = -(-(time_limit(task) or 1000) // repeat)
    heuristic = Config(episode_length=length).gamma
    return {
        "action_repeat": 1,
        "episode_length": length,
        "episodic": can_terminate(task, env_kwargs),
        "discount": min(heuristic, 0.99),
        "rho": 0.7,
    }


def obs_action_dims(cfg: Config) -> tuple[int, int]:
    """The sizes of a run's observations (flat) and actions, read from one env of it."""
    env = env_of(cfg, 0)  # loads the model; a pixel env renders nothing until reset
    try:
        return int(env.observation_space.shape[0]), int(env.action_space.shape[0])
    finally:
        env.close()


def action_dim(task: str, env_kwargs: dict | None = None) -> int:
    """The task's action dimension (what the auto planner settings depend on)."""
    env = make_env(task, env_kwargs=env_kwargs)
    try:
        return int(env.action_space.shape[0])
    finally:
        env.close()


def make_env(
    task: str,
    seed: int = 0,
    action_repeat: int = 2,
    episode_length: int = 500,
    env_kwargs: dict | None = None,
    render_size: tuple[int, int] = (240, 320),
    obs: str = "state",
) -> Env:
    """One env of `task`; `env_kwargs` go to a gymnasium env's constructor; `obs`: state, or
    rgb (a DMControl task's stacked frames)."""
    if task_kind(task) == "dmcontrol":
        if env_kwargs:
            raise ConfigError("env_kwargs are for gymnasium envs: DMControl tasks take none")
        return DMControlEnv(task, seed, action_repeat, episode_length, render_size, obs=obs)
    if obs != "state":
        raise ConfigError(f"--obs {obs} renders DMControl tasks only; {task} is a gymnasium env")
    return GymEnv(task, seed, action_repeat, episode_length, render_size, env_kwargs=env_kwargs)


def env_of(cfg: Config, seed: int, render_size: tuple[int, int] = (240, 320)) -> Env:
    """One env as `cfg` has it: its task, repeat, episode length and env_kwargs."""
    return make_env(
        cfg.task,
        seed,
        cfg.action_repeat,
        cfg.episode_length,
        cfg.env_options,
        render_size,
        obs=cfg.obs,
    )


def _env_factory(
    task: str,
    seed: int,
    action_repeat: int,
    episode_length: int,
    env_kwargs: dict | None,
    obs: str,
) -> Callable:
    def make() -> Env:
        return make_env(task, seed, action_repeat, episode_length, env_kwargs, obs=obs)

    return make


def make_vector_env(
    task: str,
    num_envs: int,
    seed: int = 0,
    action_repeat: int = 2,
    episode_length: int = 500,
    asynchronous: bool | None = None,
    seeds: Sequence[int] | None = None,
    env_kwargs: dict | None = None,
    obs: str = "state",
) -> VectorEnv:
    """num_envs copies of a task (seeds seed, seed+1, ..., or the given `seeds`) stepped
    together.

    A finished env resets in the same step; its last observation is in info["final_obs"].
    Subprocesses (asynchronous) are used by default only when there are spare cores for them:
    on a 2-core machine the inter-process hops cost more than the physics they parallelise.
    """
    task_kind(task)
    seeds = list(seeds) if seeds is not None else [seed + i for i in range(num_envs)]
    factories = [
        _env_factory(task, s, action_repeat, episode_length, env_kwargs, obs) for s in seeds
    ]
    num_envs = len(seeds)
    if asynchronous is None:
        asynchronous = num_envs > 1 and (os.cpu_count() or 1) > num_envs
    if asynchronous:
        return AsyncVectorEnv(factories, context="spawn", autoreset_mode=AutoresetMode.SAME_STEP)
    return SyncVectorEnv(factories, autoreset_mode=AutoresetMode.SAME_STEP)


def start_step(env: VectorEnv, action: np.ndarray) -> Callable[[], tuple]:
    """Start a step of `env`; the call returned finishes it and returns what step() returns.
    Subprocess envs step while the caller goes on (the update runs meanwhile); in-process envs
    step when the call is made."""
    if isinstance(env, AsyncVectorEnv):
        env.step_async(action)
        return env.step_wait
    return lambda: env.step(action)
