"""What a showcase frame must show: a task rendered as the player renders it, and a measure of
how unlike that a frame is (for the tests that read frames of the player or the window)."""

import numpy as np

from agent.envs import make_env
from workers.showcase.player import light_rendering


def task_view(
    task: str, height: int, width: int, rendered=(300, 400), camera: int = 0
) -> np.ndarray:
    """`task` at its reset pose as the showcase player renders it (its light rendering) from
    `camera` at `rendered` (height, width), scaled to height x width by nearest pixel."""
    env = make_env(task, seed=0, render_size=tuple(rendered))
    light_rendering(env)
    env.reset(seed=0)
    frame = env.render(camera_id=camera).astype(int)
    env.close()
    rows = np.arange(height) * rendered[0] // height
    cols = np.arange(width) * rendered[1] // width
    return frame[rows][:, cols]


def unlike(image: np.ndarray, reference: np.ndarray, block: int = 4) -> float:
    """The share of square blocks of pixels (`block` on a side) whose mean colour differs from
    the reference's by more than 30 in some channel (blocks: a frame scaled onto the screen is
    compared as well; a frame rendered at the reference's size pixel by pixel, block 1).

    cartpole's fixed camera does not move: its floor, rails and sky fill the frame, and the
    cart and pole are a small part of it. Measured at 300x400: any pose of a 60-step episode
    is within 0.03 of the reset pose; cheetah-run 0.10, acrobot-swingup 0.12, hopper-stand
    0.12, pendulum-swingup 0.58. On the window's screen (2026-12-05): its viewport 0.01-0.02
    unlike cartpole and 0.14-0.16 unlike those three; a black frame 1.0, a uniform one 0.73.
    At 60x80, block 1: cartpole's poses within 0.03, those three 0.09-0.11. At 48x64 from
    MuJoCo's free camera (-1), block 1: within 0.02, those three 0.31-0.42."""
    b = block
    h, w = image.shape[0] // b * b, image.shape[1] // b * b

    def blocks(a: np.ndarray) -> np.ndarray:
        return a[:h, :w, :3].astype(float).reshape(h // b, b, w // b, b, 3).mean(axis=(1, 3))

    return float((np.abs(blocks(image) - blocks(reference)).max(axis=-1) > 30).mean())


LIKE = 0.06  # unlike() of a frame that shows cartpole-balance: less than this
