"""When the window draws: at the full rate while someone uses it, within a CPU budget otherwise.

A frame of the whole window costs 25-45 ms of CPU on software GL (llvmpipe under Xvfb) and a
millisecond or two on a GPU. The training workers lose whatever the window takes, so while
nobody touches it the window spends at most `watch_share` of a core on drawing: new showcase
frames and numbers are drawn as often as that allows (about 2 a second on software GL, the
full rate on a GPU), and the rest are skipped (latest wins); between frames the loop wakes 20
times a second to look for input. Any input makes it draw at the full rate for `active_s`.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

WATCH_SHARE = 0.04  # cores the window may spend drawing while nobody uses it
# ... while the viewport replays an episode at 1x: more frames, so the motion reads as motion
REPLAY_WATCH_SHARE = 0.10
WATCH_TICK_S = 0.05  # while nobody uses it, the loop looks for input and news this often
ACTIVE_S = 1.0  # after input, draw at the full rate for this long
IDLE_S = 1.0  # draw at least this often: keys and clicks are read only when a frame is drawn


class FramePacer:
    def __init__(
        self,
        fps_cap: float,
        watch_share: float = WATCH_SHARE,
        active_s: float = ACTIVE_S,
        idle_s: float = IDLE_S,
    ):
        self.fps_cap, self.watch_share = fps_cap, watch_share
        self.active_s, self.idle_s = active_s, idle_s
        self.last_draw = -math.inf
        self.last_input = -math.inf
        self._work: deque[float] = deque(maxlen=15)  # seconds of work of the last frames

    def input(self, now: float) -> None:
        """Someone used the window at `now` (seconds, any monotonic clock)."""
        self.last_input = now

    def active(self, now: float) -> bool:
        return now - self.last_input < self.active_s

    def tick_s(self, now: float) -> float:
        """Seconds until the loop should look again: a frame period while someone uses the
        window, else WATCH_TICK_S (or sooner, at the cap)."""
        return 1.0 / self.fps_cap if self.active(now) else max(1.0 / self.fps_cap, WATCH_TICK_S)

    def watch_gap(self) -> float:
        """Seconds between frames while nobody uses the window: a frame's work over the
        share, never shorter than the frame-rate cap allows."""
        work = statistics.median(self._work) if self._work else 0.0
        return max(1.0 / self.fps_cap, work / self.watch_share)

    def due(self, now: float, changed: bool) -> bool:
        """Whether to draw a frame now; `changed`: something new to show since the last."""
        if self.active(now):
            return True
        gap = now - self.last_draw
        return gap >= self.idle_s or (changed and gap >= self.watch_gap())

    def drew(self, now: float, work_s: float) -> None:
        """A frame was drawn at `now` and took `work_s` seconds of the loop's time."""
        self.last_draw = now
        self._work.append(work_s)
