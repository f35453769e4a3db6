"""A race's records as its workers write them, made up for the race table's tests: a knob
record with lanes (and replicas), each worker's applying it, episodes along a learning curve."""

import numpy as np

from workers.race.table import RaceTracker
from workers.rundir.records import Episode, KnobRecord, KnobsApplied

T0 = 1000.0  # when the race began (wall clock)


def record_of(lanes, solo=(), values=None, replicas=1):
    """A race's knob record: `lanes` the workers of each entry (replicas of a lane in a row)."""
    values = values or [{"iterations": 2} for _ in lanes]
    return KnobRecord(
        version=1,
        values={"iterations": 2},
        lanes=lanes,
        lane_values=tuple(values),
        pool=1,
        solo_lanes=solo,
        replicas=replicas,
    )


def tracker_of(record, published=None):
    """A tracker that saw every worker of `record` apply it at T0."""
    tracker = RaceTracker(published_final=published)
    tracker.ingest(
        KnobsApplied(step=0, time=T0, version=1, values={}, lane=n, worker=w)
        for n, lane in enumerate(record.lanes)
        for w in lane
    )
    return tracker


def episodes_of(worker, times, returns, steps=None):
    steps = steps if steps is not None else [100 * (i + 1) for i in range(len(times))]
    return [
        Episode(step=s, time=T0 + t, ret=float(r), length=100, worker=worker)
        for t, r, s in zip(times, returns, steps)
    ]


def progress_of(record, step=1000.0, rate=2.0):
    return [{"worker": w, "step": step, "steps_per_s": rate} for lane in record.lanes for w in lane]


def learning(start, end, n, noise, seed, t_first=10.0, every=10.0):
    """n returns climbing from `start` to `end` with Gaussian noise, an episode every `every`
    seconds from `t_first`."""
    rng = np.random.default_rng(seed)
    times = t_first + every * np.arange(n)
    returns = np.linspace(start, end, n) + noise * rng.standard_normal(n)
    return times, returns
