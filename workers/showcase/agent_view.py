"""The agent's view beside the viewport (a pixel run's pane choice, and the montage's): the
frames its encoder takes, 64x64 each, scaled to a column at the frame's right, oldest on top.
Live play shows its observation's frames; a replay renders them again from its recorded poses
(the same pose draws the same frame), the first pose standing in before an episode's start as
the env's reset fills the stack.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from agent.pixels import FRAMES, SIZE

MARGIN = 4  # pixels around each frame of the column
OVERLAY = 6  # the column leaves the top 1/OVERLAY of the frame to the overlay's text


def frame_side(height: int, width: int) -> int:
    """Each frame's side in the column: as large as FRAMES of them fit below the overlay's
    rows, the column at most a third of the width."""
    tall = (height - height // OVERLAY - (FRAMES + 1) * MARGIN) // FRAMES
    return max(1, min(tall, width // 3 - 2 * MARGIN))


def view_width(height: int, width: int) -> int:
    """The viewport's width beside the column."""
    return width - (frame_side(height, width) + 2 * MARGIN)


def frame_boxes(height: int, width: int) -> list[tuple[int, int, int]]:
    """(top, left, side) of each frame in the column, oldest first, the last at the bottom."""
    side = frame_side(height, width)
    left = view_width(height, width) + MARGIN
    top = height - FRAMES * (side + MARGIN)
    return [(top + n * (side + MARGIN), left, side) for n in range(FRAMES)]


def compose(view: np.ndarray, frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """A (height, width, 3) frame: `view` (height x view_width) at the left, `frames`
    (FRAMES, SIZE, SIZE, 3) scaled (nearest pixel: each shows as the agent got it) in the
    column, the rest black."""
    out = np.zeros((height, width, 3), np.uint8)
    out[:, : view.shape[1]] = view
    side = frame_side(height, width)
    pick = np.arange(side) * SIZE // side  # the source pixel of each shown one
    for (top, left, _), frame in zip(frame_boxes(height, width), frames, strict=True):
        out[top : top + side, left : left + side] = frame[pick][:, pick]
    return out


def pose_frame(env, pose: np.ndarray) -> np.ndarray:
    """The frame a pixel env's agent was given at `pose` (the env is left in it)."""
    env.show_state(pose)
    return env.pixel_frame()


class PoseFrames:
    """The frames the agent was given at each pose of one replay, each pose rendered once (a
    64x64 render costs 30 ms on software GL, and a replay shows a pose several times).
    `render(pose)` draws one pose's frame; the env is left in any of the poses."""

    def __init__(self, states: np.ndarray, render: Callable[[np.ndarray], np.ndarray]):
        self.states, self._render = states, render
        self._cache: dict[int, np.ndarray] = {}

    def at(self, index: int) -> np.ndarray:
        """(FRAMES, SIZE, SIZE, 3): the frames of poses index - FRAMES + 1 ... index, the
        first pose repeated before the episode's start."""
        wanted = [max(0, index - back) for back in range(FRAMES - 1, -1, -1)]
        for i in wanted:
            if i not in self._cache:
                self._cache[i] = self._render(self.states[i])
        for i in [i for i in self._cache if i not in wanted]:  # a replay moves on
            del self._cache[i]
        return np.stack([self._cache[i] for i in wanted])
