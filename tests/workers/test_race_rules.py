"""The race's rules without processes (workers/race/control.py): which workers each lane gets, the
runs that cannot race and why, the line that says how lanes share the machine, and the one rule
of lanes that fit the run, which the run and its workers both hold a knob record to."""

import dataclasses
from pathlib import Path

import pytest
from conftest import tiny_config
from helpers.process_fakes import make_run

from agent.config import Config
from agent.errors import ConfigError
from workers.race.control import RaceControl, check_race, sharing
from workers.run.spawn import worker_spec
from workers.rundir.directory import atomic_write_json
from workers.rundir.knob_record import KNOBS, KnobStore
from workers.rundir.lanes import CONTROL, Lane, check_layout, deal_lanes
from workers.rundir.records import KnobRecord
from workers.rundir.settings import RunSettings, read_record


def test_sized_lanes_get_their_size_and_the_rest_share_the_remaining_workers():
    layout = check_race(RunSettings(workers=5), [Lane(size=3), Lane(), Lane()])
    assert [len(lane) for lane in layout] == [3, 1, 1]
    assert sorted(w for lane in layout for w in lane) == [0, 1, 2, 3, 4], "each worker once"


def test_the_merging_experiment_is_four_merged_workers_and_a_control():
    layout = check_race(RunSettings(workers=5), [Lane(size=4), CONTROL])
    assert [len(lane) for lane in layout] == [4, 1]


def test_replicas_deal_each_lane_its_copies_in_a_row():
    """--lane workers=4 --lane workers=1,merge=off --replicas 3: 15 workers, lane l's replica r
    at l * 3 + r, neighbours together (a pack stays in one copy)."""
    layout = check_race(RunSettings(workers=15), [Lane(size=4), CONTROL], replicas=3)
    assert [len(lane) for lane in layout] == [4, 4, 4, 1, 1, 1]
    assert layout[0] == (0, 1, 2, 3) and layout[3:] == ((12,), (13,), (14,))
    shared = check_race(RunSettings(workers=6), [Lane(), Lane()], replicas=3)
    assert [len(lane) for lane in shared] == [1] * 6


def test_replicas_pair_each_copys_environment_seeds_across_lanes():
    """Replica r's k-th worker has the same environment seed in every lane (paired), another
    than any other replica's; outside a race of replicas each worker keeps its own."""
    layout = check_race(RunSettings(workers=10), [Lane(size=3), Lane(size=2)], replicas=2)
    settings = RunSettings(workers=10, lanes=layout, replicas=2)
    seeds = [[settings.env_seed_offset(w) for w in lane] for lane in layout]
    assert seeds[0][:2] == seeds[2] and seeds[1][:2] == seeds[3]  # lane 0 r vs lane 1 r
    assert len({s for lane in seeds[:2] for s in lane}) == 6  # replicas apart
    assert [RunSettings(workers=3).env_seed_offset(w) for w in range(3)] == [0, 1000, 2000]
    cfg = Config(device="cpu", seed=7)
    specs = [worker_spec(Path("run"), cfg, settings, w, 100) for w in range(10)]
    assert specs[0].env_seed == specs[6].env_seed != specs[3].env_seed  # lane 0 r0 / lane 1 r0
    assert len({Config(**spec.cfg).seed for spec in specs}) == 10  # agents' seeds all their own


@pytest.mark.parametrize(
    "settings, lanes, replicas, message",
    [
        (RunSettings(workers=4, ranks=2), [Lane(), Lane()], 1, "a torchrun job does not race"),
        (RunSettings(workers=4), [Lane()], 1, "at least 2 lanes"),
        (RunSettings(workers=4, pack=2), [Lane(size=1), Lane(size=3)], 1, "a pack"),
        (RunSettings(workers=5), [Lane(size=2), Lane(size=1)], 2, "times 2 replicas 6"),
        (RunSettings(workers=3), [Lane(), Lane()], 2, "need at least 4 workers"),
    ],
)
def test_runs_that_cannot_race_are_told_why(settings, lanes, replicas, message):
    with pytest.raises(ConfigError, match=message):
        check_race(settings, lanes, replicas)


def test_replicas_below_one_are_refused():
    with pytest.raises(ConfigError, match="replicas must be a whole number of at least 1"):
        check_race(RunSettings(workers=4), [Lane(), Lane()], replicas=0)


def test_sharing_says_the_lane_sizes_and_the_equal_share_on_a_cpu():
    record = KnobRecord(version=1, values={}, lanes=((0, 1, 2), (3,)))
    line = sharing(RunSettings(workers=4), Config(device="cpu"), record)
    assert line.startswith("lanes of 3/1 workers; every worker a process of its own")
    assert "equal compute per worker" in line
    copies = KnobRecord(version=1, values={}, lanes=((0, 1), (2, 3), (4,), (5,)), replicas=2)
    line = sharing(RunSettings(workers=6), Config(device="cpu"), copies)
    assert line.startswith("lanes of 2/1 workers (2 replicas of each); every worker a process")
    no_race = KnobRecord(version=1, values={})
    assert sharing(RunSettings(workers=4), Config(device="cpu"), no_race) == ""


@pytest.mark.parametrize(
    "lanes, fits",
    [
        (((0, 1), (2,)), True),
        (((1, 0), (2,)), True),
        (((0,), (2,)), False),  # worker 1 merges in no lane
        (((0, 1), (1, 2)), False),  # worker 1 in two lanes
        (((0, 1), (2, 5)), False),  # no worker 5
        (((0, 1, 2),), False),  # one lane: nothing to race (the table would have no second)
    ],
)
def test_the_run_refuses_a_knob_record_whose_lanes_its_workers_refuse(tmp_path, lanes, fits):
    """A record written over knobs.json (by hand, or damaged): the run takes it as its workers
    do (workers/training/hooks.py, with the same run.json), else the last good version."""
    cfg = tiny_config()
    settings = RunSettings(workers=3)
    race = (Lane(), Lane(size=1))
    layout = deal_lanes(settings.merging, race)
    make_run(tmp_path, cfg, dataclasses.replace(settings, lanes=layout), layout, race)
    written = dataclasses.replace(KnobStore(tmp_path).read_record(), version=7, lanes=lanes)
    atomic_write_json(tmp_path / KNOBS, written.to_json())
    control = RaceControl(KnobStore(tmp_path), cfg, lambda: settings, lambda: (0, {}))
    assert control.record().lanes == (lanes if fits else layout)
    workers_take = True
    try:
        check_layout(written.lanes, *worker_view(tmp_path))
    except ConfigError:
        workers_take = False
    assert workers_take == fits


def worker_view(path):
    """What a worker checks a record's lanes against: run.json as it reads it (hooks.py)."""
    settings = read_record(path)[1]
    return settings.workers, settings.merging
