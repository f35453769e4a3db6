"""A training process's watch over where it writes: the run directory must stay where it was
(deleted or moved: the worker stops, rather than recreate a partial run there), and a write
that fails for want of space pauses training until it succeeds (every complete file stays as
it was). Apart from the hooks (hooks.py), which call it between steps, because it is
about the disk, not about training.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from workers.rundir.directory import human_size
from workers.rundir.records import DiskResumed, Record
from workers.training.spec import STATES
from workers.training.stop_training import StopTraining

DIR_CHECK_S = 0.5  # seconds between checks that the run directory is still where it was
DISK_RETRY_S = 2.0  # seconds between tries of a write that failed for want of space


class RunDirVanished(Exception):
    """The run directory was deleted or moved while the worker ran."""


def _free_space(path: Path) -> str:
    for folder in (path, *path.parents):
        try:
            return human_size(shutil.disk_usage(folder).free)
        except OSError:
            continue
    return "unknown"


def dir_identity(path: str | Path) -> tuple[int, int] | None:
    """(device, inode) of a directory, None if it is not there: a directory moved away and
    another made in its place is told apart."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


class DiskGuard:
    """The run directory and disk checks of one process (for all the workers of a pack)."""

    def __init__(
        self,
        index: int,
        run_path: str,
        set_snapshot: Callable[..., None],
        log: Callable[[Record], None],
        stop_now: Callable[[], bool],
    ):
        """`index`: the worker named in what is printed. `set_snapshot`: writes snapshot fields,
        `log`: a record, `stop_now`: whether to stop (a stop asked, or the run's process
        gone)."""
        self.index, self.run_path = index, run_path
        self.set, self.log, self.stop_now = set_snapshot, log, stop_now
        self.run_dir_id, self._next_dir_check = dir_identity(run_path), 0.0
        self._disk_paused: tuple[float, OSError, Path] | None = None  # since, error, path

    def wait_for_disk(self, err: OSError, path: Path, size: int) -> None:
        """RunDir's write-error handler: a write failed for want of space. Training pauses
        here (every complete file stays as it was) and the write is tried again every
        DISK_RETRY_S; a stop ends the wait."""
        if self._disk_paused is None:
            self._disk_paused = (time.monotonic(), err, path)
            print(
                f"worker {self.index}: cannot write {path} ({err.strerror or err}): "
                f"{_free_space(path)} free, it needs about {human_size(size)}; training paused "
                "until writes succeed again",
                file=sys.stderr,
            )
        self.set(state=STATES.index("disk full"), blocked_bytes=size, heartbeat=time.time())
        until = time.monotonic() + DISK_RETRY_S
        while time.monotonic() < until:
            if self.stop_now():
                raise StopTraining
            time.sleep(0.05)

    def resumed(self, step: int) -> None:
        """Called between steps (at agent step `step`): if training had waited for space,
        writes succeed again; say so, in the record too."""
        if self._disk_paused is None:
            return
        since, err, path = self._disk_paused
        self._disk_paused = None
        self.set(blocked_bytes=0)
        paused_s = round(time.monotonic() - since, 1)
        message = (
            f"worker {self.index}: writes succeed again; training resumed after "
            f"{paused_s} s paused (writing {path} had failed: {err.strerror or err})"
        )
        print(message, file=sys.stderr)
        self.log(DiskResumed(step=step, path=str(path), error=str(err), paused_s=paused_s))

    def check_run_dir(self) -> None:
        """Stop (RunDirVanished) once the run directory was deleted or moved: writing on would
        recreate a partial run where it was."""
        now = time.monotonic()
        if now < self._next_dir_check:
            return
        self._next_dir_check = now + DIR_CHECK_S
        if dir_identity(self.run_path) != self.run_dir_id:
            raise RunDirVanished(self.run_path)
