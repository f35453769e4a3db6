"""What a learning montage shows: which album episodes (album.py), in which tiles, with which
learning curve. One worker's N episodes chosen evenly over its album by step, or in a race a
tile per lane, each lane's episodes at steps close to the first lane's. Bad choices are refused
here with one line (UserError), before anything renders or is written."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from agent.config import Config
from agent.envs import check_record_task
from agent.errors import ConfigError, UserError
from workers.rundir.album import AlbumEntry, worker_entries
from workers.rundir.knob_record import KnobStore
from workers.rundir.paths import MEDIA, metrics_name
from workers.rundir.records import Episode, Eval, parse_records
from workers.rundir.replays import EpisodeReplay
from workers.rundir.settings import RunSettings, read_record

KIND_WORDS = {"train": "training", "eval": "evaluation"}


@dataclass(frozen=True)
class Tile:
    """One worker's part of the montage: its episodes by step and its learning curve."""

    label: str  # "worker 0", or "lane 1 (worker 2)" in a race
    worker: int
    episodes: tuple[EpisodeReplay, ...]
    curve: tuple[tuple[int, float], ...]  # (agent step, return) of each of its episodes


@dataclass(frozen=True)
class MontagePlan:
    run_path: Path
    cfg: Config
    kind: str  # "train" or "eval"
    tiles: tuple[Tile, ...]  # side by side; each has the same number of episodes

    @property
    def episodes(self) -> int:
        return len(self.tiles[0].episodes)


def montage_path(run_path: str | Path) -> Path:
    """A new file name in the run's media/ folder (where the window's clips go), stamped with
    the time; the folder is not created here."""
    folder = Path(run_path) / MEDIA
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, n = folder / f"montage-{stamp}.mp4", 1
    while path.exists():
        path, n = folder / f"montage-{stamp}-{n}.mp4", n + 1
    return path


def pick_evenly(entries: list[AlbumEntry], count: int) -> list[AlbumEntry]:
    """`count` entries spread evenly by position over `entries` (sorted by step), the first and
    the last included; all of them when there are no more than `count`; one: the newest."""
    if len(entries) <= count:
        return list(entries)
    if count == 1:
        return [entries[-1]]
    last = len(entries) - 1
    return [entries[round(i * last / (count - 1))] for i in range(count)]


def nearest(entries: list[AlbumEntry], steps: list[int]) -> list[AlbumEntry]:
    """For each step, the entry that ended closest to it (the earlier one on a tie)."""
    return [min(entries, key=lambda e: (abs(e.step - step), e.step)) for step in steps]


def learning_curve(run_path: Path, worker: int, kind: str) -> tuple[tuple[int, float], ...]:
    """The worker's returns by agent step from its metrics records: each training episode's
    return, or each evaluation's mean (none when the file is missing)."""
    try:
        data = (run_path / metrics_name(worker)).read_bytes()
    except OSError:
        return ()
    records, _ = parse_records(data, worker)
    wanted = Episode if kind == "train" else Eval
    return tuple(
        (r.step, float(r.ret)) for r in records if isinstance(r, wanted) and r.step is not None
    )


def race_lanes(run_path: Path) -> tuple[tuple[int, ...], ...]:
    """The race's lanes (each its workers), or none: no race, or no knob record to say."""
    try:
        return KnobStore(run_path).read_record().lanes
    except ConfigError:
        return ()


def _check_choice(settings: RunSettings, lanes: tuple, worker: int | None, lane: int | None):
    if worker is not None and lane is not None:
        raise UserError("choose --worker or --lane, not both")
    if worker is not None and not 0 <= worker < settings.workers:
        raise UserError(
            f"worker {worker} is not in the run (its workers: 0 to {settings.workers - 1})"
        )
    if lane is not None and not lanes:
        raise UserError(f"lane {lane}: the run has no race (leave out --lane)")
    if lane is not None and not 0 <= lane < len(lanes):
        raise UserError(f"lane {lane} is not in the run's race (its lanes: 0 to {len(lanes) - 1})")


def _groups(
    settings: RunSettings, lanes: tuple, worker: int | None, lane: int | None
) -> list[tuple[int | None, list[int]]]:
    """(lane number or None, its workers) for each tile: the race's lanes (or lane `lane`), or
    outside a race (or with `worker`) one tile of the run's workers (or `worker`)."""
    if worker is None and lanes:
        return [(n, list(lanes[n])) for n in ([lane] if lane is not None else range(len(lanes)))]
    return [(None, [worker] if worker is not None else list(range(settings.workers)))]


def _tile(run_path: Path, label: str, worker: int, chosen: list[AlbumEntry], kind: str) -> Tile:
    episodes = [e.load() for e in chosen]  # loaded now: a live run's album thins out later
    kept = tuple(ep for ep in episodes if ep is not None)
    return Tile(label, worker, kept, learning_curve(run_path, worker, kind))


def plan_montage(
    run_path: str | Path,
    episodes: int = 8,
    worker: int | None = None,
    lane: int | None = None,
    kind: str = "train",
) -> MontagePlan:
    """The montage of run `run_path`: `episodes` album episodes of `worker` (None: the first
    worker with some), or in a race a tile per lane (`lane`: that one only) showing its first
    worker with episodes (a lane with none yet is left out). UserError when the run, the
    choice or the album does not allow one."""
    path = Path(run_path)
    if episodes < 1:
        raise UserError(f"--episodes must be 1 or more, not {episodes}")
    cfg, settings = read_record(path)  # UserError: not a run directory, or a damaged one
    check_record_task(cfg.task)  # the montage makes the task's env: named here, or refused
    lanes = race_lanes(path)
    _check_choice(settings, lanes, worker, lane)
    tiles: list[Tile] = []
    steps: list[int] = []  # the first tile's episodes' steps: the others show the nearest
    for number, workers in _groups(settings, lanes, worker, lane):
        # A group shows its first worker that has episodes of this kind.
        found = [(w, [e for e in worker_entries(path, w) if e.kind == kind]) for w in workers]
        found = [(w, entries) for w, entries in found if entries]
        if not found:
            continue
        shown, entries = found[0]
        chosen = nearest(entries, steps) if steps else pick_evenly(entries, episodes)
        steps = steps or [e.step for e in chosen]
        label = f"worker {shown}" if number is None else f"lane {number} (worker {shown})"
        tile = _tile(path, label, shown, chosen, kind)
        if tile.episodes:
            tiles.append(tile)
    if not tiles:
        whose = f"worker {worker}" if worker is not None else "the run"
        whose = f"lane {lane}" if lane is not None else whose
        raise UserError(
            f"no {KIND_WORDS[kind]} episodes of {whose} in the album of {path} yet (each "
            "worker keeps them as it trains; runs from before the album have none)"
        )
    count = min(len(t.episodes) for t in tiles)  # a damaged file: the others show as many
    tiles = [Tile(t.label, t.worker, t.episodes[:count], t.curve) for t in tiles]
    return MontagePlan(path, cfg, kind, tuple(tiles))
