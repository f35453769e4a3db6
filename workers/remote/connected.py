"""A window's run on another machine (`launch.py --connect URL`): a view attached to a local
mirror of the served run directory (mirror.py), whose commands travel back over the link.

Everything the window reads (records, knobs, the race, the album, weights for its own
showcase: of the workers' own, only the shown worker's) comes from the mirror exactly as from
an attached run's directory; the commands that change the run go to the server
(wire.REMOTE_COMMANDS), which carries them out with the run's own checks. The viewport,
montages and screenshots are this machine's.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

from filelock import FileLock, Timeout

from agent.config import Config
from agent.envs import check_record_task
from agent.errors import UserError
from workers.remote.mirror import Mirror
from workers.remote.wire import REMOTE_COMMANDS, split_url, token_from
from workers.run.attached import AttachedRun
from workers.run.commands import ChooseShowcase, Command, Outcome
from workers.run.handle import handle
from workers.run.wording import ATTACHED, Wording
from workers.rundir.paths import MEDIA, OUTER, PLAYER_LOG, merged_path
from workers.rundir.settings import RunSettings, read_record

WINDOW_LOCK = ".window.lock"  # held by the window that keeps a copy: one window per copy
# One worker's weights: its merge contribution (in any pool), checkpoint or final weights.
WORKER_WEIGHTS = re.compile(r"(?:^|/)worker-(\d+)(?:\.prev)?\.pt$")


def wanted(path: str, source: int, merged_here: bool) -> bool:
    """Whether the mirror fetches `path` while the viewport shows `source` (a showcase source:
    -1 merged, k >= 0 worker k, <= -2 a lane's merged). Not a window's own files (its player's
    log, its media: this window writes its own there), not the outer step's state (twice a
    model's size, for the workers only); of the workers' weights only the shown
    worker's, and worker 0's checkpoint while the mirror holds no merged weights (the merged
    source's stand-in before the first merge, shown_weights.py)."""
    if path == PLAYER_LOG or path.startswith(f"{MEDIA}/") or path.endswith(f"/{OUTER}"):
        return False  # the window's own, or a pool's outer-step state (no window reads it)
    match = WORKER_WEIGHTS.search(path)
    if match is None:
        return True
    worker = int(match[1])
    stand_in = source == -1 and worker == 0 and path.startswith("checkpoints/")
    return worker == source or (stand_in and not merged_here)


def mirrors_root() -> Path:
    """Where copies go unless told (--mirror): the user's cache folder, where nothing is
    imported from (not runs/ beside launch.py, which Python's path reaches)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "tdmpc2-live" / "connected"


def mirror_name(run: str, base: str) -> str:
    """The copy's folder name, made here from the served run's name and the address: letters,
    digits, _ and - only, so whatever the server calls its run it names one folder."""
    where = urlsplit(base)
    safe = re.sub(r"[^A-Za-z0-9_-]+", "_", run)[:60].strip("_") or "run"
    host = re.sub(r"[^A-Za-z0-9_-]+", "_", where.hostname or "host")[:60]
    return f"{safe}@{host}-{where.port}"


def hold_folder(folder: Path | None, name: str) -> tuple[Path, FileLock]:
    """A copy's folder this window alone uses (`folder`, or `name` under mirrors_root, with a
    number added while another window holds it): the folder and the lock held."""
    choices = (
        [Path(folder)]
        if folder is not None
        else [mirrors_root() / (name if n == 1 else f"{name}-{n}") for n in range(1, 10)]
    )
    for choice in choices:
        choice.mkdir(parents=True, exist_ok=True)
        lock = FileLock(choice / WINDOW_LOCK)
        try:
            lock.acquire(timeout=0)
            return choice, lock
        except Timeout:
            continue
    raise UserError(
        f"{choices[-1]}: another window on this machine keeps this copy: close it, or give "
        "--mirror DIR"
    )


class ConnectedRun(AttachedRun):
    def __init__(self, path: Path, cfg: Config, settings: RunSettings, link: Mirror) -> None:
        super().__init__(path, cfg, settings)
        self.link = link
        self.folder_lock: FileLock | None = None
        self.watching = False  # the server takes no command from this window

    @staticmethod
    def check(url: str, token: str = "") -> None:
        """UserError unless a run server answers at `url` and takes the token (`token`, else
        the one in `url`; reads only)."""
        base, url_token = split_url(url)
        Mirror(base, token or token_from(url_token), Path(".")).hello()

    @classmethod
    def connect(cls, url: str, folder: str | Path | None = None, token: str = "") -> ConnectedRun:
        """Copy the served run at `url` into `folder` (default: RUN@HOST-PORT under
        mirrors_root) and keep it up to date: UserError when the address answers nothing, is
        not a run server, or refuses the token, or when the run's task imports a module not
        named here."""
        base, url_token = split_url(url)
        link = Mirror(base, token or token_from(url_token), Path("."))
        info = link.hello()
        link.folder, lock = hold_folder(
            None if folder is None else Path(folder), mirror_name(info["run"], base)
        )
        try:
            merged = merged_path(link.folder)
            link.wants = lambda path: wanted(path, -1, merged.exists())
            link.first_copy()
            cfg, settings = read_record(link.folder)
            check_record_task(cfg.task)
            run = cls(link.folder, cfg, settings, link)
            run._check_knob_history()
        except BaseException:
            lock.release()
            raise
        run.folder_lock = lock
        run.watching = info["read_only"]  # a watching token, or a read-only server
        link.wants = lambda path: wanted(path, run.showcase.settings()["source"], merged.exists())
        link.start(run._note)
        return run

    @property
    def wording(self) -> Wording:  # type: ignore[override]
        state = self.link.state() if hasattr(self, "link") else ""
        where = self.link.base if hasattr(self, "link") else "a run server"
        watching = "; watching only" if getattr(self, "watching", False) else ""
        label = f" (connected to {where}{watching}" + (
            f"; {state}: showing what arrived)" if state else ")"
        )
        return replace(
            ATTACHED,
            opened=f"connected to {where}: a copy in",
            asked=": asked of the served run",
            label=label,
            closing="closing the link: the run goes on where it is served",
        )

    def do(self, command: Command) -> Outcome:
        if isinstance(command, REMOTE_COMMANDS):
            return self.link.send(command)
        outcome = handle(self, command)
        if isinstance(command, ChooseShowcase):
            self.link.wake()  # the newly shown worker's weights come now
        return outcome

    def start(self, nice: int = 0) -> None:
        raise UserError("a connected window cannot start workers: they train where the run is")

    def stop(self, timeout: float = 120.0) -> None:
        super().stop(timeout)
        self.link.stop()
        if self.folder_lock is not None:
            self.folder_lock.release()
