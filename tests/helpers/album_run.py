"""A run directory with a synthetic album: real poses of a task, stepped with random actions
(a montage's cost and look do not depend on the policy), kept with keep_in_album, and each
worker's metrics with the episodes' returns; a race's lanes in the knob record."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from agent.config import make_config
from agent.envs import make_env
from workers.cli.presets import CPU_PLANNING
from workers.rundir.album import keep_in_album
from workers.rundir.directory import RunDir
from workers.rundir.knob_record import KnobStore
from workers.rundir.lanes import Lane
from workers.rundir.paths import metrics_name
from workers.rundir.records import Episode
from workers.rundir.replays import EpisodeReplay
from workers.rundir.settings import RunSettings, write_settings


def episode_poses(task: str, length: int, seed: int, shift: float = 0.0) -> tuple:
    """(states, rewards) of `length` random-action steps of `task`; `shift` moves the first
    pose number (cartpole's cart) so that episodes look apart."""
    env = make_env(task, seed=seed)
    try:
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        states, rewards = [env.physics_state()], []
        for _ in range(length):
            _, reward, _, _, _ = env.step(rng.uniform(-1, 1, env.action_space.shape))
            states.append(env.physics_state())
            rewards.append(reward)
        step_seconds = env.control_timestep
    finally:
        env.close()
    states = np.array(states, np.float32)
    states[:, 0] += shift
    return states, np.array(rewards, np.float32), step_seconds


def make_album_run(
    path: Path,
    task: str = "cartpole-balance",
    lengths: tuple[int, ...] = (5, 20, 40),
    workers: int = 1,
    lanes: tuple[tuple[int, ...], ...] = (),
    shifts: tuple[float, ...] | None = None,
) -> Path:
    """A run of `workers` workers on `task`, each with one training episode per length in
    its album, at steps 100, 200, ...; returns its path."""
    cfg = make_config(1, task=task, **CPU_PLANNING)  # a valid knob record needs planning set
    path.mkdir(parents=True, exist_ok=True)
    RunDir(path).write_config({"config": dataclasses.asdict(cfg)})
    write_settings(path, RunSettings(workers=workers, lanes=lanes))
    store = KnobStore(path)
    store.initialise(cfg, RunSettings.merge_every, lanes, [Lane() for _ in lanes])
    for worker in range(workers):
        log = RunDir(path, metrics=metrics_name(worker))
        for n, length in enumerate(lengths):
            step = 100 * (n + 1)
            shift = shifts[n] if shifts else 0.0
            states, rewards, step_seconds = episode_poses(task, length, 10 * worker + n, shift)
            replay = EpisodeReplay(states, rewards, worker, "train", step, n + 1, step_seconds)
            keep_in_album(path, replay)
            log.log(Episode(step=step, ret=float(rewards.sum()), length=length))
        log.close()
    return path
