"""What one worker of a trainer owns: its episodes in progress, buffer, random actions, returns
and run directory (a pack's workers share the networks, never these)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agent.buffer import EpisodeBuffer
from workers.rundir.directory import RunDir
from workers.rundir.records import Record


@dataclass
class EpisodeSoFar:
    """One env's episode in progress."""

    obs: list[np.ndarray] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)


@dataclass
class Member:
    """What one worker of a trainer owns: its seed, envs' episodes, buffer, random actions,
    returns and run directory."""

    seed: int
    buffer: EpisodeBuffer
    run_dir: RunDir | None
    rng: np.random.Generator
    episodes: list[EpisodeSoFar] = field(default_factory=list)
    episode_returns: list[float] = field(default_factory=list)
    eval_returns: list[tuple[int, float]] = field(default_factory=list)

    def log(self, record: Record) -> None:
        if self.run_dir is not None:
            self.run_dir.log(record)
