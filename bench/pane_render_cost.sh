#!/usr/bin/env bash
# The player's rendering cost per frame with 1, 2 and 4 panes (BENCHMARKS.md, "The window's
# frame with 1, 2 and 4 panes"): cartpole in the window's 400x300 frame with the player's light
# rendering, each pane rendered at its own size and tiled as the player tiles them
# (Player.play_panes), the poses of an episode of random actions. Per layout one untimed frame
# (GL's set-up), then FRAMES frames REPEATS times: CPU time per frame (all threads; software GL
# may use several), and wall time. Usage: bash bench/pane_render_cost.sh [FRAMES [REPEATS]]
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python - "${1:-40}" "${2:-2}" <<'PY'
import os
import sys
import time

import numpy as np

from agent.config import make_config
from agent.envs import env_of
from workers.door import pane_boxes
from workers.showcase.player import light_rendering  # the player's own set-up, timed alone

frames, repeats = int(sys.argv[1]), int(sys.argv[2])
height, width = 300, 400  # viewer/panels/showcase.py's FRAME_H, FRAME_W
env = env_of(make_config(1, task="cartpole-balance", device="cpu"), 0, (height, width))
light_rendering(env)
env.reset(seed=0)
rng = np.random.default_rng(0)
poses = [env.step(rng.uniform(-1, 1, env.action_space.shape))[4]["state"] for _ in range(frames)]


def frame_of(boxes, n):
    frame = np.zeros((height, width, 3), np.uint8)
    for p, (top, left, h, w) in enumerate(boxes):
        env.show_state(poses[(n + 7 * p) % len(poses)])  # each pane its own moment
        env.render_size = (h, w)
        frame[top : top + h, left : left + w] = env.render(camera_id=0)
    env.render_size = (height, width)
    return frame


print(f"MUJOCO_GL={os.environ.get('MUJOCO_GL')}, {frames} frames x {repeats} per layout")
for count in (1, 2, 4):
    boxes = pane_boxes(height, width, count)
    frame_of(boxes, 0)
    cpu, wall = [], []
    for _ in range(repeats):
        c, w = time.process_time(), time.perf_counter()
        for n in range(frames):
            frame_of(boxes, n)
        cpu.append((time.process_time() - c) / frames * 1000)
        wall.append((time.perf_counter() - w) / frames * 1000)
    print(
        f"{count} pane(s): "
        + ", ".join(f"{x:.1f}" for x in cpu)
        + " ms CPU a frame (wall "
        + ", ".join(f"{x:.1f}" for x in wall)
        + " ms)"
    )
env.close()
PY
