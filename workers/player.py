"""The showcase player: a process that plays the newest merged policy and renders it offscreen.

It reloads merge/merged.pt whenever the file changes (before the first merge it plays worker 0's
checkpoint, or the untrained model), acts with the planner in evaluation mode at real-time pace
(or as fast as it can), writes each rendered frame into shared memory and logs each episode's
return to player.jsonl. Frames are a latest-wins snapshot guarded by a sequence counter (odd
while a frame is being written), so the reader never waits and never sees half a frame.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import torch

from agent.agent import TDMPC2
from agent.config import Config
from agent.envs import DMControlEnv
from agent.errors import WeightsError
from workers.rundir import RunDir, load_state

HEADER = 8  # int64 fields: sequence, height, width, episode, step, weights_round, return x1000, 0


class FrameBuffer:
    """Shared-memory frame of a size chosen by the reader: header + height x width x 3 bytes."""

    def __init__(self, height: int, width: int, name: str | None = None, create: bool = True):
        size = HEADER * 8 + height * width * 3
        self.shm = shared_memory.SharedMemory(name=name, create=create, size=size)
        self.header = np.ndarray((HEADER,), np.int64, self.shm.buf)
        self.pixels = np.ndarray((height, width, 3), np.uint8, self.shm.buf, offset=HEADER * 8)
        if create:
            self.header[:] = 0
            self.header[1:3] = (height, width)
        self.name, self.height, self.width = self.shm.name, height, width

    def write(self, frame: np.ndarray, episode: int, step: int, weights_round: int, ret: float):
        self.header[0] += 1  # odd: writing
        self.pixels[:] = frame
        self.header[3:7] = (episode, step, weights_round, int(ret * 1000))
        self.header[0] += 1  # even: complete

    def read(self) -> tuple[np.ndarray, dict] | None:
        """The newest complete frame and its info, or None if none yet (or mid-write)."""
        seq = int(self.header[0])
        if seq == 0 or seq % 2:
            return None
        frame = self.pixels.copy()
        info = self.header[3:7].copy()
        if int(self.header[0]) != seq:
            return None
        episode, step, weights_round, ret = (int(v) for v in info)
        return frame, {
            "episode": episode,
            "step": step,
            "weights_round": weights_round,
            "return": ret / 1000,
            "sequence": seq,
        }

    def close(self, unlink: bool = False) -> None:
        del self.header, self.pixels
        self.shm.close()
        if unlink:
            self.shm.unlink()


@dataclass(frozen=True)
class PlayerSpec:
    run_path: str
    cfg: dict
    frame_name: str
    height: int
    width: int
    realtime: bool = True
    camera_id: int = 0
    max_fps: float = 30.0  # rendering is the player's main cost: cap it, skip frames beyond it


def _newest_weights(run_path: Path) -> tuple[Path, float] | None:
    for path in (run_path / "merge" / "merged.pt", run_path / "checkpoints" / "worker-0.pt"):
        if path.exists():
            return path, path.stat().st_mtime
    return None


def player_main(spec: PlayerSpec, render_paused, stop) -> None:
    # The showcase is best effort: lowest CPU priority, so it drops frames rather than take
    # time from the training workers.
    os.nice(19)
    torch.set_num_threads(1)
    cfg = Config(**spec.cfg)
    env = DMControlEnv(
        cfg.task,
        cfg.seed + 99_999,
        cfg.action_repeat,
        cfg.episode_length,
        render_size=(spec.height, spec.width),
        camera_id=spec.camera_id,
    )
    agent = TDMPC2(cfg, env.observation_space.shape[0], env.action_space.shape[0])
    frames = FrameBuffer(spec.height, spec.width, spec.frame_name, create=False)
    log = RunDir(spec.run_path, metrics="player.jsonl")
    run_path = Path(spec.run_path)
    step_seconds = env.physics.timestep() * cfg.action_repeat
    loaded_mtime, weights_round, episode, last_render = None, -1, 0, 0.0
    try:
        while not stop.is_set():
            newest = _newest_weights(run_path)
            if newest is not None and newest[1] != loaded_mtime:
                try:
                    state = load_state(newest[0], agent.device)
                    agent.model.load_state_dict(
                        state["model"] if "model" in state else state["agent"]["model"]
                    )
                    weights_round = int(state.get("round", -1))
                    loaded_mtime = newest[1]
                except (WeightsError, KeyError, RuntimeError) as err:
                    log.log("error", message=f"showcase could not load {newest[0].name}: {err}")
                    loaded_mtime = newest[1]
            obs, _ = env.reset(seed=cfg.seed + episode)
            total, done, t, t0 = 0.0, False, 0, True
            next_time = time.monotonic()
            while not done and not stop.is_set():
                action = agent.act(torch.from_numpy(obs), t0=t0, eval_mode=True)
                obs, reward, terminated, truncated, _ = env.step(action.numpy())
                total, t, t0, done = total + reward, t + 1, False, terminated or truncated
                now = time.monotonic()
                if not render_paused.is_set() and now - last_render >= 1.0 / spec.max_fps:
                    last_render = now
                    frames.write(env.render(), episode, t, weights_round, total)
                if spec.realtime:
                    next_time += step_seconds
                    time.sleep(max(0.0, next_time - time.monotonic()))
            if done:
                log.log("showcase_episode", episode=episode, ret=total, weights_round=weights_round)
            episode += 1
    finally:
        log.close()
        frames.close()
        env.close()
