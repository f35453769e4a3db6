"""Which recorded episodes the viewport plays besides the newest: one album episode pinned from
the timeline, or several side by side in panes ("then and now" along the album, or one pane per
race lane). Choosing only; the player (player.py) draws them.

Panes tile the one frame the player already writes: two side by side (each the frame's height
and half its width, a narrower view rather than a squashed one), three or four in a 2x2 grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from agent.errors import UserError
from workers.rundir.album import AlbumEntry, album_dir, album_entries, entry_name, parse_entry
from workers.rundir.knob_record import KnobStore
from workers.rundir.replays import EpisodeReplay
from workers.showcase.replay import newest_episode, source_workers
from workers.showcase.shown_weights import lane_source

# The viewport's pane layouts: "single" is today's one view (live or replay); "agent-view" is
# that view with a pixel agent's frames beside it (agent_view.py).
LAYOUTS = ("single", "then-now-2", "then-now-4", "lanes", "agent-view")
MAX_PANES = 4


def source_album(run_path: str | Path, source: int) -> list[AlbumEntry]:
    """The album episodes of the source's workers (every worker's when the record cannot be
    read), by step; file names only, nothing is loaded."""
    return album_entries(run_path, source_workers(Path(run_path), source))


def find_entry(run_path: str | Path, worker: int, kind: str, step: int) -> AlbumEntry | None:
    """The album entry of that worker, kind and step, or None when the album has none (never
    kept, or thinned out since)."""
    path = album_dir(run_path, worker) / entry_name(kind, step)
    return parse_entry(path, worker) if path.is_file() else None


class Stepped(Protocol):
    @property
    def step(self) -> int: ...


S = TypeVar("S", bound=Stepped)


def nearest_entry(entries: Sequence[S], step: float, reach: float) -> S | None:
    """The entry (an AlbumEntry, or anything with a step) whose step is nearest `step`, if
    within `reach` steps (ties: the earlier)."""
    if not entries:
        return None
    best = min(entries, key=lambda e: (abs(e.step - step), e.step))
    return best if abs(best.step - step) <= reach else None


def spread_entries(entries: list[AlbumEntry], count: int) -> list[AlbumEntry]:
    """`count` entries evenly along the album, first and newest included (then and now); fewer
    when the album has fewer."""
    if len(entries) <= count:
        return list(entries)
    last = len(entries) - 1
    return [entries[round(i * last / (count - 1))] for i in range(count)]


def pane_count(layout: str, lanes: int) -> int:
    """Panes a layout shows (lanes: one per race lane, at most MAX_PANES)."""
    if layout == "then-now-2":
        return 2
    if layout == "then-now-4":
        return 4
    if layout == "lanes":
        return min(lanes, MAX_PANES)
    return 1


def pane_boxes(height: int, width: int, count: int) -> list[tuple[int, int, int, int]]:
    """(top, left, height, width) of each pane in a frame: 1 whole, 2 side by side, 3-4 in a
    2x2 grid (row by row)."""
    if count <= 1:
        return [(0, 0, height, width)]
    half_w = width // 2
    if count == 2:
        return [(0, 0, height, half_w), (0, half_w, height, width - half_w)]
    half_h = height // 2
    grid = [
        (0, 0, half_h, half_w),
        (0, half_w, half_h, width - half_w),
        (half_h, 0, height - half_h, half_w),
        (half_h, half_w, height - half_h, width - half_w),
    ]
    return grid[:count]


def race_lanes(run_path: str | Path) -> list[int]:
    """The merge pool that stands for each race lane now: its first replica's (none: no race,
    or a record that cannot be read)."""
    try:
        record = KnobStore(Path(run_path)).read_record()
    except UserError:  # a damaged record is the run's to report; here: no lanes
        return []
    return [record.copies(n)[0] for n in range(record.race_lanes)]


def pane_episodes(
    run_path: str | Path, layout: str, source: int
) -> list[tuple[EpisodeReplay | None, int]]:
    """(episode, lane or -1) per pane: then and now along the source's album (its newest
    replay when the album is empty), or each lane's newest episode. None: nothing to show
    there yet (a blank pane)."""
    if layout == "lanes":
        pools = race_lanes(run_path)
        count = pane_count(layout, len(pools))
        return [(newest_episode(Path(run_path), lane_source(pools[n])), n) for n in range(count)]
    count = pane_count(layout, 0)
    chosen = spread_entries(source_album(run_path, source), count)
    replays: list[EpisodeReplay | None] = [e.load() for e in chosen]
    newest = newest_episode(Path(run_path), source)
    if newest is not None and (not chosen or newest.step > chosen[-1].step):
        # "Now" is the newest finished episode, which the album's thinning may have passed over.
        replays = [*replays[:-1], newest] if len(chosen) == count else [*replays, newest]
    replays += [None] * (count - len(replays))
    return [(r, -1) for r in replays]
