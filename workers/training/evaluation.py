"""Evaluation episodes: each worker of an agent (or pack) with a drawn elite and no exploration
noise, on envs of its own seeds."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from agent.agent import TDMPC2
from agent.config import Config
from agent.envs import env_of


def evaluate(
    agent: TDMPC2,
    cfg: Config,
    episodes: int,
    seeds: Sequence[int],
    on_step: Callable[[int], None] | None = None,
    last_episodes: list | None = None,
) -> list[list[float]]:
    """Returns of `episodes` evaluation episodes for each worker of the agent (a drawn elite,
    no exploration noise), worker k's env seeded seeds[k]. The workers' episodes run in
    lockstep (one plan for all). `on_step(j)` is called after every env step and episode end,
    j episodes done (an evaluation of a big model on a CPU takes minutes: the progress display
    follows it). `last_episodes`, when given, receives each worker's last episode as (poses or
    None, rewards), for the viewport's replay."""
    envs = [env_of(cfg, seed) for seed in seeds]
    returns: list[list[float]] = [[] for _ in envs]
    try:
        for i in range(episodes):
            starts = [env.reset(seed=seed + i) for env, seed in zip(envs, seeds)]
            obs = np.stack([o for o, _ in starts])
            states = [[info.get("state")] for _, info in starts]
            rewards: list[list[float]] = [[] for _ in envs]
            totals, done, t0 = np.zeros(len(envs)), np.zeros(len(envs), bool), True
            while not done.all():
                packed = torch.from_numpy(obs).float().view(len(envs), 1, -1)
                action = agent.act(packed, t0=t0, eval_mode=True).cpu().numpy()
                for k, env in enumerate(envs):
                    if done[k]:
                        continue
                    obs[k], reward, terminated, truncated, info = env.step(action[k, 0])
                    totals[k] += reward
                    rewards[k].append(float(reward))
                    states[k].append(info.get("state"))
                    done[k] = terminated or truncated
                t0 = False
                if on_step is not None and not done.all():
                    on_step(i)
            for k in range(len(envs)):
                returns[k].append(float(totals[k]))
            if last_episodes is not None and i == episodes - 1:
                for poses, got in zip(states, rewards):
                    whole = all(p is not None for p in poses)
                    last_episodes.append((np.stack(poses) if whole else None, got))
            if on_step is not None:
                on_step(i + 1)
    finally:
        for env in envs:
            env.close()
    return returns
