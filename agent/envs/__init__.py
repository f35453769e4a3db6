"""Environments as a gymnasium API: DeepMind Control Suite tasks (dmcontrol.py), any gymnasium
env (gym.py), made by task name, alone or as a vector of copies (make.py)."""

from agent.envs.dmcontrol import DMControlEnv, choose_gl_backend, resolve_task, task_names
from agent.envs.gym import GymEnv, check_record_task, time_limit
from agent.envs.make import (
    Env,
    action_dim,
    check_task,
    env_of,
    make_env,
    make_vector_env,
    obs_action_dims,
    start_step,
    task_defaults,
    task_kind,
)
from agent.envs.named import check_task_named, name_task

__all__ = [
    "DMControlEnv",
    "Env",
    "GymEnv",
    "action_dim",
    "check_task",
    "check_record_task",
    "check_task_named",
    "choose_gl_backend",
    "env_of",
    "make_env",
    "make_vector_env",
    "name_task",
    "obs_action_dims",
    "resolve_task",
    "start_step",
    "task_defaults",
    "task_kind",
    "task_names",
    "time_limit",
]
