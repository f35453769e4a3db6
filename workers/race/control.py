"""A run's race, owned or attached alike: starting one (the merging workers split into lanes,
each with its own knob values and merge pool), promoting a lane (its values for every worker,
one pool again) and moving workers between lanes. The knob record is the channel: the workers
read their lane and values from it (workers/training/hooks.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from agent.config import Config
from agent.errors import ConfigError
from workers.host.threads import choose_threads
from workers.rundir.knob_record import KnobStore
from workers.rundir.lanes import Lane, Layout, check_layout, deal_lanes, replicate
from workers.rundir.records import RACE_MINUTES, KnobRecord
from workers.rundir.settings import RunSettings, gpu_count

MAX_LANES = 4  # what a window offers; the command line allows as many as there are workers


def check_race(
    settings: RunSettings, lanes: Sequence[Lane], replicas: int = 1, new_run: bool = False
) -> Layout:
    """The workers of each replica of each of `lanes` (lane l's copy r at l * replicas + r;
    sized lanes their size, the others an even share of the rest), or a ConfigError saying why
    the run cannot race so. `new_run`: a run created with this race packs each copy apart."""
    if settings.ranks:
        raise ConfigError(
            "a torchrun job does not race: its ranks merge in one all-reduce; race on one "
            "machine (launch.py --workers N --lane ...)",
            "lanes",
        )
    if len(lanes) < 2:
        raise ConfigError(
            f"a race needs at least 2 lanes (one --lane each), got {len(lanes)}; for one "
            "setting give the knob's own flag",
            "lanes",
        )
    copies = replicate(lanes, replicas)
    if replicas > 1 and None not in [lane.size for lane in lanes]:
        sizes = sum(lane.size or 0 for lane in lanes)
        if sizes * replicas != len(settings.merging):
            raise ConfigError(
                f"the lanes' sizes add up to {sizes} workers, times {replicas} replicas "
                f"{sizes * replicas}, and the run has {len(settings.merging)}: --workers must "
                "be the lanes' sizes times the replicas (or leave it out)",
                "lanes",
            )
    layout = deal_lanes(settings.merging, copies, replicas)
    if new_run:
        settings = dataclasses.replace(settings, lanes=layout)
    lane_of = {w: n for n, lane in enumerate(layout) for w in lane}
    for pack in settings.packs:
        if len({lane_of.get(w) for w in pack}) > 1:
            raise ConfigError(
                f"workers {pack} train in one process (a pack), and lanes with different "
                "planning shapes cannot share one: start the race when the run is created "
                "(--lane), which packs each lane apart",
                "lanes",
            )
    return layout


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
        self.run_path = knobs.path.parent
        self._joining: set[int] = set()  # in run.json, not yet in a lane (join)
        # A record whose lanes do not fit the run is damage: the workers' rule (lanes.py).
        knobs.layout = self._check_fits

    def _check_fits(self, record: KnobRecord) -> None:
        s = self.settings()
        merging = [w for w in s.merging if w not in self._joining]
        check_layout(record.lanes, s.workers, merging, record.replicas)

    def record(self) -> KnobRecord:
        """The knob record in force: the lanes (none outside a race) and their values."""
        good = self.knobs.last_good_record(self.cfg)
        if good is not None:
            return good
        version, values = self.in_force()
        return KnobRecord(version=version, values=dict(values))

    def start(self, lanes: Sequence[Lane], replicas: int = 1, minutes: float = RACE_MINUTES) -> int:
        """Split the merging workers into `lanes`, each `replicas` times (every replica a merge
        pool of its own), each running with the values in force changed by its own; each lane
        starts from the weights the run merged last; the verdict after `minutes` of training.
        Returns the knob version (ConfigError: nothing changed)."""
        if self.record().lanes:
            raise ConfigError("a race is on: promote a lane to end it first", "lanes")
        layout = check_race(self.settings(), lanes, replicas)
        copies = replicate(lanes, replicas)
        return self.knobs.start_race(self.cfg, layout, copies, self.in_force, replicas, minutes)

    def promote(self, lane: int, weights: bool = True, replica: int = 0) -> int:
        """End the race: race lane `lane`'s values for every worker, one merge pool again, and
        (`weights`) the weights of its replica `replica` as they are at the promotion for
        every worker: a last merge round of its workers, or for a lane that never merged its
        first worker's own (workers/training/merge_rounds.py). Without `weights` the next merge
        averages every worker's. Returns the version."""
        record = self.record()
        if not 0 <= lane < record.race_lanes:
            raise ConfigError(
                f"there is no lane {lane} to promote (lanes: {record.race_lanes})", "lanes"
            )
        if not 0 <= replica < record.replicas:
            raise ConfigError(
                f"lane {lane} has no replica {replica} (replicas: {record.replicas})", "lanes"
            )
        pool = record.copies(lane)[replica]
        from_worker = None
        if weights and not record.merges(pool):
            from_worker = record.lanes[pool][0]
        return self.knobs.promote(self.cfg, pool, self.in_force, weights, from_worker)

    def lane_for_new(self, lane: int | None) -> int | None:
        """The pool (an entry of the record's lanes) a new worker would join: the copy of race
        lane `lane` with the fewest workers, or (None) of every merging lane's; None when there
        is no race. ConfigError when it cannot join that lane."""
        record = self.record()
        if not record.lanes:
            if lane is not None:
                raise ConfigError("there is no race: a new worker joins the run's pool", "lanes")
            return None
        if lane is None:
            return self.smallest_lane(record)
        if not 0 <= lane < record.race_lanes:
            raise ConfigError(f"there is no lane {lane} (lanes: {record.race_lanes})", "lanes")
        if not record.merges(record.copies(lane)[0]):
            raise ConfigError(
                f"lane {lane} never merges: a worker added to it would have no weights to start "
                "from; add it to a lane that merges",
                "lanes",
            )
        return min(record.copies(lane), key=lambda n: len(record.lanes[n]))

    def join(self, worker: int, lane: int, enter_run: Callable[[], None]) -> None:
        """Put a new worker in pool `lane` (lane_for_new's). `enter_run()` records it in the
        run's settings first, so that no worker reads a lane naming a worker the run does not
        have; until its lane is written, the run's own check of the record leaves it out."""
        self._joining.add(worker)
        try:
            enter_run()
            record = self.record()
            lanes = [tuple(x) for x in record.lanes]
            lanes[lane] = (*lanes[lane], worker)
            self.knobs.move_workers(self.cfg, tuple(lanes), self.in_force)
        finally:
            self._joining.discard(worker)

    @staticmethod
    def smallest_lane(record: KnobRecord) -> int:
        """The merging lane with the fewest workers (where a new worker goes)."""
        merging = [n for n in range(len(record.lanes)) if record.merges(n)]
        if not merging:
            raise ConfigError("no lane of this race merges: a new worker has no weights", "lanes")
        return min(merging, key=lambda n: len(record.lanes[n]))

    def check_leave(self, worker: int) -> None:
        """ConfigError when a worker cannot leave its lane (the lane's last)."""
        record = self.record()
        lane = record.lane_of(worker)
        if lane is not None and len(record.lanes[lane]) == 1:
            raise ConfigError(
                f"worker {worker} is {record.pool_name(lane)}'s last worker: promote a lane "
                "first, or stop the run",
                "lanes",
            )

    def leave(self, worker: int) -> None:
        """Take a worker (already removed in the run's settings) out of its lane."""
        record = self.record()
        if record.lane_of(worker) is None:
            return
        lanes = tuple(tuple(w for w in x if w != worker) for x in record.lanes)
        self.knobs.move_workers(self.cfg, lanes, self.in_force)


def sharing(settings: RunSettings, cfg: Config, record: KnobRecord) -> str:
    """How the lanes of a race share the machine, in one line (the window says it)."""
    if not record.lanes:
        return ""
    sizes = "/".join(str(len(lane)) for lane in record.lanes[:: record.replicas])
    copies = f" ({record.replicas} replicas of each)" if record.replicas > 1 else ""
    if gpu_count(cfg):
        return (
            f"lanes of {sizes} workers{copies}; each lane its own pack (one process, one CUDA "
            "graph: different planning shapes cannot share one), the same GPU share"
        )
    threads = choose_threads(len(settings.packs), settings.threads_per_worker or None).threads
    return (
        f"lanes of {sizes} workers{copies}; every worker a process of its own with {threads} torch "
        f"thread{'s' * (threads != 1)} at the same CPU priority: equal compute per worker"
    )
