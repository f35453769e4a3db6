"""Screenshots and video clips of the viewport, written off the GUI thread.

A clip is MP4 (H.264 through imageio's ffmpeg plugin) when that plugin is installed, else GIF.
Frames go through a bounded queue: if the encoder falls behind, frames are dropped from the
clip rather than stalling the window.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import imageio.v2 as imageio
import imageio.v3 as iio
import numpy as np

from workers.door import RUNS


def media_dir(run_path: str | Path | None) -> Path:
    """Where screenshots and clips go: the run's media/ folder; with no run open, media/ beside
    the runs, where git ignores it as it does the runs."""
    return Path(run_path or RUNS) / "media"


def media_path(directory: str | Path, stem: str, suffix: str) -> Path:
    """A new file name in `directory` (created), stamped with the time."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = directory / f"{stem}-{stamp}{suffix}"
    n = 1
    while path.exists():
        path = directory / f"{stem}-{stamp}-{n}{suffix}"
        n += 1
    return path


def save_screenshot(frame: np.ndarray, directory: str | Path) -> Path:
    path = media_path(directory, "screenshot", ".png")
    iio.imwrite(path, frame)
    return path


def mp4_available() -> bool:
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        return False
    return True


class ClipRecorder:
    """Records frames to a video file on a background thread until `stop()`."""

    def __init__(self, directory: str | Path, fps: float = 30.0, max_queue: int = 120):
        self.suffix = ".mp4" if mp4_available() else ".gif"
        self.path = media_path(directory, "clip", self.suffix)
        self.fps = fps
        self.frames_written = 0
        self.frames_dropped = 0
        self.error: str | None = None
        self._queue: queue.Queue[np.ndarray | None] = queue.Queue(max_queue)
        self._thread = threading.Thread(target=self._write, name="clip-recorder", daemon=True)
        self._thread.start()

    def add(self, frame: np.ndarray) -> None:
        try:
            self._queue.put_nowait(frame.copy())
        except queue.Full:
            self.frames_dropped += 1

    def stop(self, timeout: float = 60.0) -> Path:
        """Finish the file; returns its path (check `error`)."""
        self._queue.put(None)
        self._thread.join(timeout)
        return self.path

    def _write(self) -> None:
        try:
            if self.suffix == ".mp4":
                writer = imageio.get_writer(
                    self.path, fps=self.fps, codec="libx264", macro_block_size=2, quality=7
                )
            else:
                writer = imageio.get_writer(self.path, mode="I", duration=1000 / self.fps, loop=0)
            with writer:
                while (frame := self._queue.get()) is not None:
                    writer.append_data(frame)
                    self.frames_written += 1
        except Exception as err:  # a clip that cannot be written must not take the window down
            self.error = f"{type(err).__name__}: {err}"
            while self._queue.get() is not None:  # let stop() finish
                pass
