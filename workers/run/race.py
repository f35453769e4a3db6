"""A run's race, owned or attached alike: starting one (the merging workers split into lanes,
each with its own knob values and merge pool), promoting a lane (its values for every worker,
one pool again) and moving workers between lanes. The knob record is the channel: the workers
read their lane and values from it (workers/training/hooks.py).
"""

from __future__ import annotations

from collections.abc import Callable

from agent.config import Config
from agent.errors import ConfigError
from workers.host.threads import choose_threads
from workers.rundir.knob_record import KnobStore
from workers.rundir.lanes import deal_lanes
from workers.rundir.records import KnobRecord
from workers.rundir.settings import RunSettings, gpu_count

MAX_LANES = 4  # what a window offers; the command line allows as many as there are workers


def check_race(settings: RunSettings, count: int) -> tuple[tuple[int, ...], ...]:
    """The lanes `count` lanes would have (the merging workers dealt evenly), or a
    ConfigError saying why the run cannot race so."""
    if settings.ranks:
        raise ConfigError(
            "a torchrun job does not race: its ranks merge in one all-reduce; race on one "
            "machine (launch.py --workers N --lane ...)",
            "lanes",
        )
    if count < 2:
        raise ConfigError(
            f"a race needs at least 2 lanes (one --lane each), got {count}; for one setting "
            "give the knob's own flag",
            "lanes",
        )
    lanes = deal_lanes(settings.merging, count)
    lane_of = {w: n for n, lane in enumerate(lanes) for w in lane}
    for pack in settings.packs:
        if len({lane_of.get(w) for w in pack}) > 1:
            raise ConfigError(
                f"workers {pack} train in one process (a pack), and lanes with different "
                "planning shapes cannot share one: start the race when the run is created "
                "(--lane), which packs each lane apart",
                "lanes",
            )
    return lanes


class RaceControl:
    """The race of one run: what it is now, and the changes a person asks for."""

    def __init__(
        self,
        knobs: KnobStore,
        cfg: Config,
        settings: Callable[[], RunSettings],
        in_force: Callable[[], tuple[int, dict]],
    ):
        """`settings`: the run's settings now; `in_force`: the knob values the workers run
        with (for a knob record damaged beyond its history)."""
        self.knobs, self.cfg, self.settings, self.in_force = knobs, cfg, settings, in_force

    def record(self) -> KnobRecord:
        """The knob record in force: the lanes (none outside a race) and their values."""
        good = self.knobs.last_good_record(self.cfg)
        if good is not None:
            return good
        version, values = self.in_force()
        return KnobRecord(version=version, values=dict(values))

    def start(self, lane_changes: list[dict]) -> int:
        """Split the merging workers into len(lane_changes) lanes, lane n running with the
        values in force changed by lane_changes[n]; each lane starts from the weights the run
        merged last. Returns the knob version (ConfigError: nothing changed)."""
        if self.record().lanes:
            raise ConfigError("a race is on: promote a lane to end it first", "lanes")
        lanes = check_race(self.settings(), len(lane_changes))
        return self.knobs.start_race(self.cfg, lanes, tuple(lane_changes), self.in_force)

    def promote(self, lane: int) -> int:
        """End the race: lane `lane`'s values for every worker, one merge pool again."""
        return self.knobs.promote(self.cfg, lane, self.in_force)

    def join(self, worker: int, lane: int | None) -> int | None:
        """Put a new worker in lane `lane` (None: the lane with the fewest workers); returns the
        lane, or None when there is no race."""
        record = self.record()
        if not record.lanes:
            if lane is not None:
                raise ConfigError("there is no race: a new worker joins the run's pool", "lanes")
            return None
        if lane is None:
            lane = self.smallest_lane(record)
        if not 0 <= lane < len(record.lanes):
            raise ConfigError(f"there is no lane {lane} (lanes: {len(record.lanes)})", "lanes")
        lanes = [tuple(x) for x in record.lanes]
        lanes[lane] = (*lanes[lane], worker)
        self.knobs.move_workers(self.cfg, tuple(lanes), self.in_force)
        return lane

    @staticmethod
    def smallest_lane(record: KnobRecord) -> int:
        return min(range(len(record.lanes)), key=lambda n: len(record.lanes[n]))

    def leave(self, worker: int) -> None:
        """Take a worker out of its lane (refused when it is the lane's last)."""
        record = self.record()
        lane = record.lane_of(worker)
        if lane is None:
            return
        if len(record.lanes[lane]) == 1:
            raise ConfigError(
                f"worker {worker} is lane {lane}'s last worker: promote a lane first, or "
                "stop the run",
                "lanes",
            )
        lanes = tuple(tuple(w for w in x if w != worker) for x in record.lanes)
        self.knobs.move_workers(self.cfg, lanes, self.in_force)


def sharing(settings: RunSettings, cfg: Config, record: KnobRecord) -> str:
    """How the lanes of a race share the machine, in one line (the window says it)."""
    if not record.lanes:
        return ""
    sizes = "/".join(str(len(lane)) for lane in record.lanes)
    if gpu_count(cfg):
        return (
            f"lanes of {sizes} workers; each lane its own pack (one process, one CUDA graph: "
            "different planning shapes cannot share one), the same GPU share"
        )
    threads = choose_threads(len(settings.packs), settings.threads_per_worker or None).threads
    return (
        f"lanes of {sizes} workers; every worker a process of its own with {threads} torch "
        f"thread{'s' * (threads != 1)} at the same CPU priority: equal compute per worker"
    )
