"""The album: finished episodes kept across the whole run, so the viewport can replay the policy
as it was at any point of training (the timeline, then and now, the montage).

Each worker keeps, per kind (training, evaluation), its first EARLY episodes (the start, where
the policy changes fastest) and then at most SPREAD more spread evenly over its agent steps: one
per stretch of `spacing` steps, the earliest episode ending in it. When the run outgrows SPREAD
stretches, the spacing doubles and the kept ones are thinned to the new stretches. So a worker
holds at most 2 x (EARLY + SPREAD) = 128 episodes, whatever the run's length, and the
schedule is read again from the file names alone: it survives a resume unchanged.

Files: `album/worker-K/{kind}-{step:09d}.npz`, poses as float32 (replays.py's format), each
written atomically; an entry is never rewritten, only added or removed. Per episode the disk is
about (agent steps + 1) x (pose size) x 4 bytes plus 1 KB: 2 KB for the CPU demo's cartpole (125
agent steps, 2 numbers a pose), 59 KB for humanoid-walk (500 agent steps, 28 numbers), so at most
7.6 MB per humanoid-walk worker, however long it trains.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workers.rundir.directory import atomic_write_bytes
from workers.rundir.paths import ALBUM
from workers.rundir.replays import KINDS, EpisodeReplay, read_replay, replay_bytes

EARLY = 8  # a worker's first episodes of each kind, all kept
SPREAD = 56  # at most this many more of each kind, spread evenly over the run's steps
FIRST_SPACING = 64  # agent steps per stretch at first; doubles as the run grows


@dataclass(frozen=True)
class AlbumEntry:
    """One kept episode, known from its file name; `load()` reads its poses."""

    worker: int
    kind: str  # "train" or "eval"
    step: int  # the worker's agent step when it ended
    path: Path

    def load(self) -> EpisodeReplay | None:
        """The episode, or None when it was removed or damaged meanwhile (best effort)."""
        return _load(self.path, self.path.stat().st_mtime_ns if self.path.exists() else 0)


@functools.lru_cache(maxsize=512)
def _load(path: Path, _mtime: int) -> EpisodeReplay | None:
    return read_replay(path)  # an entry is never rewritten: (path, mtime) names its content


def album_dir(run_path: str | Path, worker: int) -> Path:
    return Path(run_path) / ALBUM / f"worker-{worker}"


def entry_name(kind: str, step: int) -> str:
    return f"{kind}-{step:09d}.npz"


def parse_entry(path: Path, worker: int) -> AlbumEntry | None:
    kind, _, step = path.stem.partition("-")
    if kind not in KINDS or not (step.isascii() and step.isdigit()) or path.suffix != ".npz":
        return None
    return AlbumEntry(worker, kind, int(step), path)


def worker_entries(run_path: str | Path, worker: int) -> list[AlbumEntry]:
    """One worker's kept episodes, by step."""
    try:
        paths = list(album_dir(run_path, worker).glob("*.npz"))
    except OSError:
        return []
    found = (parse_entry(p, worker) for p in paths)
    return sorted((e for e in found if e is not None), key=lambda e: (e.step, e.kind))


def album_workers(run_path: str | Path) -> list[int]:
    """The workers with an album folder (a run from before the album has none)."""
    try:
        names = [p.name for p in (Path(run_path) / ALBUM).iterdir()]
    except OSError:
        return []
    return sorted(
        int(n[7:]) for n in names if n.startswith("worker-") and n[7:].isascii() and n[7:].isdigit()
    )


def album_entries(
    run_path: str | Path, workers: Iterable[int] | None = None, kinds: tuple[str, ...] = KINDS
) -> list[AlbumEntry]:
    """The kept episodes of these workers (None: all) and kinds, by step then worker."""
    chosen = album_workers(run_path) if workers is None else list(workers)
    entries = [e for w in chosen for e in worker_entries(run_path, w) if e.kind in kinds]
    return sorted(entries, key=lambda e: (e.step, e.worker, e.kind))


# the schedule --------------------------------------------------------------------------------
def spacing_at(step: int) -> int:
    """The stretch's length once a worker has reached `step`: the run so far fits in SPREAD
    stretches (doubling keeps earlier stretches whole: two become one)."""
    spacing = FIRST_SPACING
    while step // spacing >= SPREAD:
        spacing *= 2
    return spacing


def thin(steps: list[int], spacing: int) -> tuple[list[int], list[int]]:
    """(kept, dropped): the earliest step in each stretch of `spacing` is kept."""
    kept: dict[int, int] = {}
    dropped = []
    for s in sorted(steps):
        if s // spacing in kept:
            dropped.append(s)
        else:
            kept[s // spacing] = s
    return list(kept.values()), dropped


def plan(kept: list[int], step: int) -> tuple[bool, list[int]]:
    """Given the steps kept of one worker and kind and a new episode ending at `step`: whether
    to keep it, and which kept ones to remove."""
    kept = sorted(kept)
    if step in kept:
        return False, []  # two envs of a pack ended together: one is enough
    if len(kept) < EARLY or step < kept[EARLY - 1]:
        return True, []  # still the start (or a resumed run's redone start)
    spacing = spacing_at(max(step, kept[-1]))
    spread, dropped = thin([*kept[EARLY:], step], spacing)
    return step not in dropped, dropped


# writing --------------------------------------------------------------------------------------
def keep_in_album(run_path: str | Path, replay: EpisodeReplay) -> bool:
    """Add a finished episode if the schedule keeps it (and remove those it thins out);
    returns whether it was kept. Raises OSError when the disk refuses."""
    mine = [e for e in worker_entries(run_path, replay.worker) if e.kind == replay.kind]
    keep, dropped = plan([e.step for e in mine], replay.step)
    if keep:
        path = album_dir(run_path, replay.worker) / entry_name(replay.kind, replay.step)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, replay_bytes(replay, np.float32))
    for entry in mine:
        if entry.step in dropped:
            entry.path.unlink(missing_ok=True)
    return keep


def forget_after(run_path: str | Path, worker: int, step: int) -> int:
    """Remove the worker's episodes that ended after `step` (a run resumed from an earlier
    checkpoint trains those steps again); returns how many."""
    gone = [e for e in worker_entries(run_path, worker) if e.step > step]
    for entry in gone:
        entry.path.unlink(missing_ok=True)
    return len(gone)
