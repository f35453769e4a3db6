"""A window's run on another machine (`launch.py --connect URL`): a view attached to a local
mirror of the served run directory (mirror.py), whose commands travel back over the link.

Everything the window reads (records, knobs, the race, the album, weights for its own
showcase: of the workers' own, only the shown worker's) comes from the mirror exactly as from
an attached run's directory; the commands that change the run go to the server
(wire.REMOTE_COMMANDS), which carries them out with the run's own checks. The viewport,
montages and screenshots are this machine's.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

from agent.config import Config
from agent.errors import UserError
from workers.remote.mirror import Mirror
from workers.remote.wire import REMOTE_COMMANDS, split_url
from workers.run.attached import AttachedRun
from workers.run.commands import ChooseShowcase, Command, Outcome
from workers.run.handle import handle
from workers.run.wording import ATTACHED, Wording
from workers.rundir.paths import MEDIA, OUTER, PLAYER_LOG, merged_path
from workers.rundir.settings import RunSettings, read_record

CONNECTED = Path("runs") / "connected"  # mirrors go here unless told (--mirror)
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


class ConnectedRun(AttachedRun):
    def __init__(self, path: Path, cfg: Config, settings: RunSettings, link: Mirror) -> None:
        super().__init__(path, cfg, settings)
        self.link = link

    @staticmethod
    def check(url: str) -> None:
        """UserError unless a run server answers at `url` and takes its token (reads only)."""
        base, token = split_url(url)
        Mirror(base, token, Path(".")).hello()

    @classmethod
    def connect(cls, url: str, folder: str | Path | None = None) -> ConnectedRun:
        """Copy the served run at `url` into `folder` (default runs/connected/RUN@HOST-PORT)
        and keep it up to date: UserError when the address answers nothing, is not a run
        server, or refuses the token."""
        base, token = split_url(url)
        link = Mirror(base, token, Path("."))
        info = link.hello()
        if folder is None:
            where = urlsplit(base)
            folder = CONNECTED / f"{info['run']}@{where.hostname}-{where.port}"
        link.folder = Path(folder)
        merged = merged_path(link.folder)
        link.wants = lambda path: wanted(path, -1, merged.exists())
        link.first_copy()
        cfg, settings = read_record(link.folder)
        run = cls(link.folder, cfg, settings, link)
        run._check_knob_history()
        link.wants = lambda path: wanted(path, run.showcase.settings()["source"], merged.exists())
        link.start(run._note)
        return run

    @property
    def wording(self) -> Wording:  # type: ignore[override]
        state = self.link.state() if hasattr(self, "link") else ""
        where = self.link.base if hasattr(self, "link") else "a run server"
        label = f" (connected to {where}" + (f"; {state}: showing what arrived)" if state else ")")
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
