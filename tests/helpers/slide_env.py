"""A user's own gymnasium env, as the tests reach it: `helpers.slide_env:Slide-v0` (tests/ is
on the path) imports this module, which registers it. A block slides on a rail; the agent
pushes it towards the middle. Non-symmetric action bounds, a Dict observation, and a
termination when the block falls off either end (else the 40-step time limit truncates)."""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces

ID = "Slide-v0"


class Slide(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(self, rail: float = 1.0):
        self.rail = rail
        # push in [0, 4] (2 is no push) and a brake in [-1, 3]: neither is [-1, 1]
        self.action_space = spaces.Box(
            np.array([0.0, -1.0]), np.array([4.0, 3.0]), dtype=np.float32
        )
        self.observation_space = spaces.Dict(
            {
                "velocity": spaces.Box(-np.inf, np.inf, (1,), np.float32),
                "position": spaces.Box(-np.inf, np.inf, (1,), np.float32),
            }
        )
        self.pos = self.vel = 0.0
        self.actions: list[np.ndarray] = []  # what the env was given, for the tests

    def _obs(self) -> dict:
        return {
            "velocity": np.array([self.vel], np.float32),
            "position": np.array([self.pos], np.float32),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = float(self.np_random.uniform(-0.5, 0.5) * self.rail)
        self.vel = float(self.np_random.uniform(-0.3, 0.3))
        return self._obs(), {}

    def step(self, action):
        self.actions.append(np.asarray(action))
        push, brake = float(action[0]) - 2.0, (float(action[1]) + 1.0) / 4.0
        self.vel = (self.vel + 0.1 * push) * (1.0 - 0.5 * brake)
        self.pos += 0.1 * self.vel
        terminated = abs(self.pos) > self.rail
        reward = -1.0 if terminated else 1.0 - abs(self.pos) / self.rail
        return self._obs(), reward, terminated, False, {}


class BrokenSlide(Slide):
    """Its reset returns an observation outside its own observation space."""

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        return {**obs, "position": np.zeros(3, np.float32)}, info


if ID not in gymnasium.registry:
    gymnasium.register(ID, entry_point=Slide, max_episode_steps=40)
    gymnasium.register("SlideBroken-v0", entry_point=BrokenSlide, max_episode_steps=40)
