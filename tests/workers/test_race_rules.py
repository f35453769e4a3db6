"""The race's rules without processes (workers/race/control.py): which workers each lane gets, the
runs that cannot race and why, and the line that says how lanes share the machine."""

import pytest

from agent.config import Config
from agent.errors import ConfigError
from workers.race.control import check_race, sharing
from workers.rundir.lanes import CONTROL, Lane
from workers.rundir.records import KnobRecord
from workers.rundir.settings import RunSettings


def test_sized_lanes_get_their_size_and_the_rest_share_the_remaining_workers():
    layout = check_race(RunSettings(workers=5), [Lane(size=3), Lane(), Lane()])
    assert [len(lane) for lane in layout] == [3, 1, 1]
    assert sorted(w for lane in layout for w in lane) == [0, 1, 2, 3, 4], "each worker once"


def test_the_merging_experiment_is_four_merged_workers_and_a_control():
    layout = check_race(RunSettings(workers=5), [Lane(size=4), CONTROL])
    assert [len(lane) for lane in layout] == [4, 1]


@pytest.mark.parametrize(
    "settings, lanes, message",
    [
        (RunSettings(workers=4, ranks=2), [Lane(), Lane()], "a torchrun job does not race"),
        (RunSettings(workers=4), [Lane()], "at least 2 lanes"),
        (RunSettings(workers=4, pack=2), [Lane(size=1), Lane(size=3)], "a pack"),
    ],
)
def test_runs_that_cannot_race_are_told_why(settings, lanes, message):
    with pytest.raises(ConfigError, match=message):
        check_race(settings, lanes)


def test_sharing_says_the_lane_sizes_and_the_equal_share_on_a_cpu():
    record = KnobRecord(version=1, values={}, lanes=((0, 1, 2), (3,)))
    line = sharing(RunSettings(workers=4), Config(device="cpu"), record)
    assert line.startswith("lanes of 3/1 workers; every worker a process of its own")
    assert "equal compute per worker" in line
    no_race = KnobRecord(version=1, values={})
    assert sharing(RunSettings(workers=4), Config(device="cpu"), no_race) == ""
