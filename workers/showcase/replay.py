"""The viewport's replay: a finished episode drawn again from its recorded poses at real speed.

On a CPU the live player plans every step within a small CPU budget and moves at a few
hundredths of real time; a replay only sets poses and renders, so it keeps 1x at whatever frame
rate the budget allows. The pose on screen at wall time t after the start is pose
floor(t / step_seconds) (1x), whatever the frame rate. Which episode: the newest one finished
by the shown source's workers (training or evaluation, replays.py in the run directory).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from agent.errors import UserError
from workers.rundir.knob_record import KnobStore
from workers.rundir.replays import EpisodeReplay, newest_replay, read_replay
from workers.rundir.settings import read_record

MODES = ("auto", "live", "replay")  # the viewport's choice; auto: replay where live is slow
HOLD_S = 1.0  # the last pose stays this long before the next episode starts


class Playhead:
    """Where a replay is, from a clock: pose floor(elapsed x speed / step_seconds)."""

    def __init__(
        self,
        replay: EpisodeReplay,
        clock: Callable[[], float] = time.monotonic,
        speed: float = 1.0,
    ):
        self.replay, self.clock, self.speed = replay, clock, speed
        self.started = clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def index(self) -> int:
        """The pose to show now (the last one once the episode is over)."""
        at = int(self.elapsed() * self.speed / self.replay.step_seconds + 1e-9)
        return min(at, self.replay.length)

    def finished(self, hold_s: float = HOLD_S) -> bool:
        """The episode has played and its last pose has been held for `hold_s`."""
        return self.elapsed() * self.speed >= self.replay.length * self.replay.step_seconds + hold_s


def source_workers(run_path: Path, source: int) -> list[int] | None:
    """The workers whose episodes stand for a source: worker k for k >= 0, lane L's workers for
    -2 - L, the merging workers for -1 (None: any, when the run's record cannot be read)."""
    if source >= 0:
        return [source]
    try:
        if source <= -2:
            lanes = KnobStore(run_path).read_record().lanes
            lane = -2 - source
            return list(lanes[lane]) if lane < len(lanes) else None
        return read_record(run_path)[1].merging
    except UserError:  # ConfigError included: a damaged record is the run's to report
        return None


def newest_episode(run_path: Path, source: int) -> EpisodeReplay | None:
    """The newest finished episode of the source's workers, or None (none yet, or a run from
    before replays)."""
    path = newest_replay(run_path, source_workers(run_path, source))
    return read_replay(path) if path is not None else None


def use_replay(mode: str, live_speed: float | None, budgeted: bool) -> bool:
    """Whether the viewport replays: always in "replay", never in "live"; in "auto" only where
    the player runs on a CPU budget (no GPU) and live play measured under half real speed."""
    if mode == "replay":
        return True
    if mode == "live" or not budgeted:
        return False
    return live_speed is not None and live_speed < 0.5
