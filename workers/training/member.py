"""What one worker of a trainer owns: its episodes in progress, buffer, random actions, returns
and run directory (a pack's workers share the networks, never these)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from agent.buffer import EpisodeBuffer
from workers.rundir.album import forget_after, keep_in_album
from workers.rundir.directory import RunDir
from workers.rundir.records import Record
from workers.rundir.replays import EpisodeReplay, write_replay


@dataclass
class EpisodeSoFar:
    """One env's episode in progress."""

    obs: list[np.ndarray] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    states: list[np.ndarray] | None = None  # poses for a replay (None: the env has none)

    def add_state(self, state: np.ndarray | None) -> None:
        if state is None:
            self.states = None
        elif self.states is not None:
            self.states.append(state)

    def replay_states(self) -> np.ndarray | None:
        """The poses after reset and after every step, or None when some are missing."""
        if self.states is None or len(self.states) != len(self.rewards) + 1:
            return None
        return np.stack(self.states)


def state_at(info: dict, j: int) -> np.ndarray | None:
    """Env j's pose from a vector env's step info (None: the env reports none)."""
    states, have = info.get("state"), info.get("_state")
    if states is None or (have is not None and not have[j]):
        return None
    return np.asarray(states[j])


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

    @property
    def worker(self) -> int | None:
        """The worker number of a run's worker (None: a lone agent, or no run directory)."""
        found = self.run_dir and re.fullmatch(r"worker-(\d+)\.jsonl", self.run_dir.metrics_name)
        return int(found.group(1)) if found else None

    def keep_replay(
        self, states: np.ndarray | None, rewards: list[float], kind: str, step: int, dt: float
    ) -> None:
        """Keep this finished episode for the viewport's replay, and in the album when its
        schedule keeps it (best effort: what cannot be written is skipped, training goes on)."""
        if states is None or self.worker is None or self.run_dir is None:
            return
        count = len(self.episode_returns) if kind == "train" else len(self.eval_returns)
        replay = EpisodeReplay(
            states, np.asarray(rewards, np.float32), self.worker, kind, step, count, dt
        )
        try:
            write_replay(self.run_dir.path, replay)
            keep_in_album(self.run_dir.path, replay)
        except OSError:
            pass

    def forget_album_after(self, step: int) -> None:
        """Resumed at `step`: the album's episodes past it are of steps trained again."""
        if self.worker is not None and self.run_dir is not None:
            try:
                forget_after(self.run_dir.path, self.worker, step)
            except OSError:
                pass
