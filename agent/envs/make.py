"""Environments by task name, one or a vector of copies stepped together, each with its seed."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv

from agent.envs.dmcontrol import DMControlEnv, resolve_task


def action_dim(task: str) -> int:
    """The task's action dimension (what the auto planner settings depend on)."""
    env = make_env(task)
    try:
        return int(env.action_space.shape[0])
    finally:
        env.close()


def make_env(task: str, seed: int = 0, action_repeat: int = 2, episode_length: int = 500):
    return DMControlEnv(task, seed, action_repeat, episode_length)


def _env_factory(task: str, seed: int, action_repeat: int, episode_length: int) -> Callable:
    def make() -> DMControlEnv:
        return DMControlEnv(task, seed, action_repeat, episode_length)

    return make


def make_vector_env(
    task: str,
    num_envs: int,
    seed: int = 0,
    action_repeat: int = 2,
    episode_length: int = 500,
    asynchronous: bool | None = None,
    seeds: Sequence[int] | None = None,
) -> VectorEnv:
    """num_envs copies of a task (seeds seed, seed+1, ..., or the given `seeds`) stepped
    together.

    A finished env resets in the same step; its last observation is in info["final_obs"].
    Subprocesses (asynchronous) are used by default only when there are spare cores for them:
    on a 2-core machine the inter-process hops cost more than the physics they parallelise.
    """
    resolve_task(task)
    seeds = list(seeds) if seeds is not None else [seed + i for i in range(num_envs)]
    factories = [_env_factory(task, s, action_repeat, episode_length) for s in seeds]
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
