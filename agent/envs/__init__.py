"""Environments as a gymnasium API: DeepMind Control Suite tasks (dmcontrol.py), made by task
name, alone or as a vector of copies (make.py)."""

from agent.envs.dmcontrol import DMControlEnv, choose_gl_backend, resolve_task, task_names
from agent.envs.make import action_dim, make_env, make_vector_env, start_step

__all__ = [
    "DMControlEnv",
    "action_dim",
    "choose_gl_backend",
    "make_env",
    "make_vector_env",
    "resolve_task",
    "start_step",
    "task_names",
]
