"""How fast the showcase player may go: a CPU budget it sleeps to stay within, and the pace it
reaches (simulated time per wall second), which says when live play is slow motion."""

from __future__ import annotations

import time
from collections import deque


class CpuBudget:
    """Keeps a process under `share` cores of CPU time by sleeping when it gets ahead.

    A priority alone does not work for the showcase: at the lowest priority it is starved by
    workers that keep every core busy (no frames at all), at normal priority it takes a worker's
    share. With a budget it plays (in slow motion when it must) and costs at most its share.
    """

    def __init__(self, share: float, window_s: float = 10.0):
        self.share, self.window_s = share, window_s
        self.restart()

    def restart(self) -> None:
        """Count from now: time used while the budget did not apply is not charged later."""
        self.cpu0, self.wall0 = time.process_time(), time.monotonic()

    def throttle(self) -> float:
        """Sleep as long as needed to be back within budget; returns the seconds slept."""
        if self.share <= 0:
            return 0.0
        ahead = (time.process_time() - self.cpu0) / self.share - (time.monotonic() - self.wall0)
        if ahead > 0:
            time.sleep(ahead)
        if time.monotonic() - self.wall0 > self.window_s:
            self.restart()
        return max(0.0, ahead)


class Pace:
    """The showcase's speed relative to the simulation's clock over the last few seconds."""

    def __init__(self, step_seconds: float, window_s: float = 5.0):
        self.step_seconds, self.window_s = step_seconds, window_s
        self.times: deque[float] = deque()
        self.speed = 1.0

    def slow(self) -> bool:
        """Under half of real time: an episode takes minutes rather than seconds."""
        return self.speed < 0.5

    def step(self, now: float) -> float:
        self.times.append(now)
        while self.times[0] < now - self.window_s:
            self.times.popleft()
        span = now - self.times[0]
        simulated = (len(self.times) - 1) * self.step_seconds
        self.speed = 1.0 if span <= 0 else min(1.0, simulated / span)
        return self.speed
