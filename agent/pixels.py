"""Pixel observations as the authors take them (`obs=rgb`): the last FRAMES camera frames of
SIZE x SIZE pixels, each CHW uint8, concatenated on channels (9x64x64), a new episode filling
every slot with its first frame. They travel flat (OBS_DIM values, frame by frame) like a state
vector, so the planner, the buffer's rows and a pack's batches keep one shape rule; the
encoder (agent/conv.py) and the window's agent view (frames_of) give them back their shape."""

from __future__ import annotations

from collections import deque

import numpy as np

FRAMES = 3  # frames stacked per observation
SIZE = 64  # pixels per side (the authors' encoder assumes 64)
CHANNELS = 3  # RGB
FRAME_DIM = CHANNELS * SIZE * SIZE
OBS_DIM = FRAMES * FRAME_DIM


def camera_of(domain: str) -> int:
    """The authors' camera for a DMControl domain: 2 for quadruped (its tracking camera), 0
    for every other."""
    return 2 if domain == "quadruped" else 0


def frames_of(obs: np.ndarray) -> np.ndarray:
    """A flat stacked observation (OBS_DIM,) as its FRAMES frames, oldest first, each
    SIZE x SIZE x 3 (HWC, as an image is shown)."""
    return np.asarray(obs).reshape(FRAMES, CHANNELS, SIZE, SIZE).transpose(0, 2, 3, 1)


class FrameStack:
    """The last FRAMES frames of an episode as one flat observation. Written out rather than
    gymnasium's FrameStackObservation: that wraps the env, and the player and the replays
    call the DMControl env's own methods (poses, cameras, render sizes) on it."""

    def __init__(self, frames: int = FRAMES):
        self._frames: deque[np.ndarray] = deque(maxlen=frames)

    def reset(self, frame: np.ndarray) -> np.ndarray:
        """A new episode: its first frame (HWC) in every slot."""
        chw = np.ascontiguousarray(frame.transpose(2, 0, 1))
        for _ in range(self._frames.maxlen):
            self._frames.append(chw)
        return self.observation()

    def push(self, frame: np.ndarray) -> np.ndarray:
        """The next frame (HWC): the oldest drops out."""
        self._frames.append(np.ascontiguousarray(frame.transpose(2, 0, 1)))
        return self.observation()

    def observation(self) -> np.ndarray:
        return np.concatenate([f.ravel() for f in self._frames])
