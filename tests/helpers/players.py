"""A showcase player in the test's own process (no frame reader, a fake clock): its loop's
pieces are called one by one."""

import multiprocessing as mp
import threading
from dataclasses import asdict
from pathlib import Path

from agent.config import Config
from helpers.clock import FakeClock
from workers.showcase.frames import FrameBuffer
from workers.showcase.player import Player, PlayerSpec, ShowcaseControls


def make_player(
    run_path: Path,
    cfg: Config,
    size: tuple[int, int],
    pin=(-1, 0, 0),
    panes: int = 0,
    stop: threading.Event | None = None,
) -> Player:
    """A player of `cfg` for the run at `run_path`, frames of `size` (height, width), with
    the album episode `pin` pinned and the layout `panes` (an index into LAYOUTS)."""
    height, width = size
    buffer = FrameBuffer(height, width)
    spec = PlayerSpec(str(run_path), asdict(cfg), buffer.name, height, width, max_fps=10)
    controls = ShowcaseControls(
        mp.Value("i", 0),
        mp.Value("i", 0),
        mp.Event(),
        None,
        mp.Value("i", 0),
        pin=mp.Array("q", list(pin)),
        panes=mp.Value("i", panes),
    )
    stop = stop or threading.Event()
    player = Player(spec, threading.Event(), stop, controls, threading.Event())
    player.frames.close()
    buffer.close(unlink=True)
    clock = FakeClock()
    player.clock, player.sleep = clock, clock.sleep
    return player
