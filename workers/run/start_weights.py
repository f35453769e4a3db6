"""The weights every worker of a new run starts from (--load): read from a file of another run,
checked against the run's task and model before anything is written, and written as the run's
start weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from agent.agent import TDMPC2
from agent.config import Config
from agent.envs import env_of
from agent.errors import WeightsError
from agent.world_model import weights_obs
from workers.rundir.directory import load_state, save_state
from workers.rundir.paths import start_path

State = dict[str, torch.Tensor]
OBS_WORDS = {"state": "states", "rgb": "pixels"}


def read_start_weights(path: str | Path, cfg: Config) -> State:
    """One worker's networks from `path`: a worker's final weights (worker-K.pt, weights.pt),
    its checkpoint or merged weights, checked against cfg's task and model (WeightsError)."""
    state = load_state(path)
    if isinstance(state.get("agent"), dict):  # a checkpoint: the trainer's state
        state = state["agent"]
    model = state.get("model")
    if not isinstance(model, dict):
        raise WeightsError(f"{path} holds no networks: not weights of TD-MPC2 Live")
    learned = weights_obs(model)
    if learned != cfg.obs:
        raise WeightsError(
            f"{path}: these weights learned from {OBS_WORDS[learned]}, and this run learns from "
            f"{OBS_WORDS[cfg.obs]} (--obs {cfg.obs}): load weights of a run with --obs {cfg.obs}"
        )
    env = env_of(cfg, 0)
    dims = (env.observation_space.shape[0], env.action_space.shape[0])
    env.close()
    if "obs_dim" in state and (state["obs_dim"], state.get("action_dim")) != dims:
        raise WeightsError(
            f"{path}: weights are for obs/action dims {(state['obs_dim'], state.get('action_dim'))}"
            f", {cfg.task} has {dims}"
        )
    agent = TDMPC2(dataclasses.replace(cfg, device="cpu", compile=False), *dims)
    try:
        return agent.checked_model_state(model)
    except WeightsError as err:
        raise WeightsError(f"{path}: {err}") from None


def write_start_weights(run_path: Path, weights: State, source: str | Path) -> None:
    """Every worker of the run starts from `weights` (the window shows them until a merge)."""
    save_state(start_path(run_path), {"model": weights, "step": 0, "source": str(source)})
