"""Races: lanes of workers with their own knob values and merge pools, promotion, the race
table, and a worker that joins a pool mid-run."""

import json
import os
import signal

import pytest
import torch
from conftest import events, wait_until
from conftest import tiny_run as tiny

from agent.errors import ConfigError
from workers.merging.files import FileMergeBackend, write_members
from workers.run.owner import Run, RunSettings
from workers.run.race_table import RaceTracker
from workers.rundir.knob_record import KnobStore
from workers.rundir.lanes import deal_lanes, parse_lane
from workers.rundir.records import (
    Episode,
    KnobRecord,
    KnobsApplied,
    Merge,
    StartedFromMerged,
)
from workers.showcase.shown_weights import lane_source, weights_file


# layouts and values --------------------------------------------------------------------------
def test_workers_are_dealt_evenly_and_packs_never_span_lanes():
    assert deal_lanes([0, 1, 2, 3, 4], 2) == ((0, 1, 2), (3, 4))
    with pytest.raises(ConfigError, match="3 lanes need at least 3"):
        deal_lanes([0, 1], 3)
    settings = RunSettings(workers=4, pack=4, lanes=((0, 1), (2, 3)))
    assert settings.packs == [[0, 1], [2, 3]]
    assert RunSettings(workers=4, pack=4).packs == [[0, 1, 2, 3]]


@pytest.mark.parametrize(
    "text, message",
    [
        ("iterations", "not KEY=VALUE"),
        ("speed=2", "'speed' is not a live knob"),
        ("iterations=two", "must be a number"),
        ("iterations=99", r"iterations must be in \[1, 32\]"),
        ("iterations=2,iterations=3", "given twice"),
    ],
)
def test_a_bad_lane_is_one_clear_error(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_lane(text)


def test_lane_text_reads_knobs_of_either_spelling():
    assert parse_lane("iterations=2, merge-every=500,temperature=1") == {
        "iterations": 2,
        "merge_every": 500,
        "temperature": 1.0,
    }
    assert parse_lane("") == {}


def test_the_knob_record_races_changes_one_lane_promotes_and_survives_damage(tmp_path):
    cfg = tiny(100)
    store = KnobStore(tmp_path)
    store.initialise(cfg, 50)
    lanes = ((0, 1), (2, 3))
    version = store.start_race(cfg, lanes, ({"iterations": 1}, {"iterations": 3}))
    record = store.read_record()
    assert record.lanes == lanes and record.pool == version == 1
    assert [v["iterations"] for v in record.lane_values] == [1, 3]
    assert record.values_for(3)["iterations"] == 3 and record.lane_of(4) is None
    store.set(cfg, lane=0, horizon=2)
    record = store.read_record()
    assert [v["horizon"] for v in record.lane_values] == [2, cfg.horizon]
    assert record.values["horizon"] == cfg.horizon and record.pool == 1  # the same pools
    with pytest.raises(ConfigError, match="lane 1: num_elites"):
        store.set(cfg, lane=1, num_elites=cfg.num_samples + 1)
    # knobs.json damaged: the history alone rebuilds the race.
    store.path.write_text("{torn")
    assert store.last_good_record(cfg).lanes == lanes
    version = store.promote(cfg, 1)
    record = store.read_record()
    assert record.lanes == () and record.pool == version
    assert record.values["iterations"] == 3 and record.values["horizon"] == cfg.horizon
    history = [json.loads(line) for line in store.history.read_text().splitlines()]
    assert [h["event"] for h in history] == ["", "race", "", "promote"]
    assert history[2]["lane"] == 0 and history[3]["lane"] == 1


def test_a_race_needs_two_lanes_and_workers_for_them(tmp_path):
    with pytest.raises(ConfigError, match="at least 2 lanes"):
        Run.create(tmp_path / "a", tiny(100), RunSettings(workers=2), lanes=[{}])
    with pytest.raises(ConfigError, match="3 lanes need at least 3 merging workers"):
        Run.create(tmp_path / "b", tiny(100), RunSettings(workers=2), lanes=[{}, {}, {}])
    with pytest.raises(ConfigError, match="lane 1: iterations must be in"):
        Run.create(tmp_path / "c", tiny(100), RunSettings(workers=2), lanes=[{}, {"iterations": 0}])
    assert not any((tmp_path / name).exists() for name in "abc")  # nothing written
    settings = RunSettings(workers=4, pack=2)
    run = Run.create(tmp_path / "d", tiny(100), settings)
    with pytest.raises(ConfigError, match="a pack"):
        run.race.start([{}, {}, {}])  # lanes (0, 1), (2,), (3,) would split the pack [2, 3]


# the merge pools -------------------------------------------------------------------------------
def _weights(value: float) -> dict:
    return {"w": torch.full((3,), value)}


def test_a_pool_takes_neither_another_lane_nor_an_older_pool(tmp_path):
    write_members(tmp_path, [0, 1, 2])
    lane0 = FileMergeBackend(tmp_path, [0, 1], timeout_s=0.2, lane=0, pool=4)
    assert lane0.members() == [0, 1]
    old = FileMergeBackend(tmp_path, [0, 1], timeout_s=0.2, lane=0, pool=2)
    old.publish(1, 9, _weights(100.0))  # an old race's file in the same folder
    result = lane0.merge(0, 1, _weights(1.0))
    assert result.participants == [0] and "no weights yet in this pool" in result.left_out[1]
    assert torch.equal(result.merged["w"], torch.ones(3))


def test_a_joining_worker_stays_out_of_the_mean_and_takes_the_others(tmp_path):
    write_members(tmp_path, [0, 1])
    first = FileMergeBackend(tmp_path, [0, 1], timeout_s=5)
    joiner = FileMergeBackend(tmp_path, [0, 1], timeout_s=5)
    first.publish(0, 3, _weights(2.0))
    result = joiner.merge(1, 3, _weights(8.0), joining="no update of its own yet")
    assert result.participants == [0] and result.left_out == {1: "no update of its own yet"}
    assert torch.equal(result.merged["w"], torch.full((3,), 2.0))
    # The other side finds it joining: left out, not waited for.
    result = first.merge(0, 3, _weights(2.0))
    assert result.participants == [0] and "no update of its own" in result.left_out[1]


# the race table --------------------------------------------------------------------------------
def test_the_race_table_ranks_lanes_by_the_return_they_gathered_over_wall_time():
    record = KnobRecord(
        version=0,
        values={"iterations": 2, "horizon": 3},
        lanes=((0,), (1,)),
        lane_values=({"iterations": 1, "horizon": 3}, {"iterations": 4, "horizon": 3}),
    )
    tracker = RaceTracker(published_final=100.0)

    def applied(worker, lane):
        return KnobsApplied(step=0, time=1000.0, version=0, values={}, lane=lane, worker=worker)

    def episode(worker, t, ret):
        return Episode(step=0, time=1000.0 + t, ret=ret, length=10, worker=worker)

    tracker.ingest([applied(0, 0), applied(1, 1)])
    tracker.ingest([episode(0, 10, 50.0), episode(0, 20, 80.0), episode(1, 30, 95.0)])
    progress = [
        {"worker": 0, "step": 400, "steps_per_s": 4.0},
        {"worker": 1, "step": 200, "steps_per_s": 2.0},
    ]
    rows = tracker.rows(record, progress, now=1040.0)
    assert [row.lane for row in rows] == [0, 1] and rows[0].leader and not rows[1].leader
    lane0, lane1 = rows
    assert lane0.knobs == {"iterations": 1}  # only the knobs that differ
    assert lane0.ret == pytest.approx(65.0)  # the mean of its last episodes
    assert lane0.area == pytest.approx(50.0 * 10 + 65.0 * 20)
    assert lane1.area == pytest.approx(95.0 * 10)
    assert tracker.thresholds(rows) == [50.0, 75.0, 90.0]
    assert lane0.reached == {50.0: 10.0, 75.0: None, 90.0: None}
    assert lane1.reached[90.0] == 30.0
    assert (lane0.steps, lane1.steps_per_s) == (400, 2.0)
    assert tracker.rows(KnobRecord(version=0, values={}), progress, 1040.0) == []


# end to end ------------------------------------------------------------------------------------
def test_two_lanes_of_two_merge_apart_run_their_own_knobs_and_promote(tmp_path):
    settings = RunSettings(workers=4, merge_every=30, merge_timeout_s=30)
    lanes = [{"iterations": 1}, {"iterations": 2}]
    run = Run.create(tmp_path / "run", tiny(420), settings, lanes=lanes)
    run.start()
    assert wait_until(lambda: min(w["step"] for w in run.progress()) >= 110, timeout=300)
    one_lane = run.set_knobs(lane=0, horizon=2)
    assert wait_until(lambda: min(w["knob_version"] for w in run.progress()) >= one_lane)
    promoted = run.race.promote(1)
    run.wait()
    assert [w["state"] for w in run.progress()] == ["done"] * 4
    joined = []  # after the promotion: the workers of each merge
    for worker, lane, mates in ((0, 0, (0, 1)), (1, 0, (0, 1)), (2, 1, (2, 3)), (3, 1, (2, 3))):
        applied = {a.version: a for a in events(run, KnobsApplied, worker)}
        assert applied[0].lane == lane and applied[0].values["iterations"] == lane + 1
        assert applied[one_lane].values["horizon"] == (2 if lane == 0 else tiny(1).horizon)
        assert applied[promoted].lane is None and applied[promoted].values["iterations"] == 2
        promoted_at = applied[promoted].step
        merges = events(run, Merge, worker)
        before = [m for m in merges if m.step <= promoted_at]
        after = [m for m in merges if m.step > promoted_at]
        # A lane merges only its own workers: each round holds its mates, less any left out
        # as behind (on a loaded machine a mate can miss a round's timeout), and never others.
        assert before and any(m.participants == mates for m in before)
        assert all({*m.participants, *m.left_out} == set(mates) for m in before)
        assert after and {*after[0].participants, *after[0].left_out} == {0, 1, 2, 3}
        joined += [set(m.participants) for m in after]
    assert any(p & {0, 1} and p & {2, 3} for p in joined)  # one pool: the lanes merge together


def test_lanes_survive_resume_and_attach_and_a_killed_worker_restarts_into_its_lane(tmp_path):
    settings = RunSettings(workers=2, merge_every=30, checkpoint_every=60, max_restarts=1)
    run = Run.create(
        tmp_path / "run", tiny(400), settings, lanes=[{"iterations": 1}, {"iterations": 2}]
    )
    run.monitor.restart_backoff_s = 0.1
    run.start()
    assert wait_until(lambda: run.progress()[1]["step"] >= 130, timeout=300)
    assert Run.attach(run.path).race.record().lanes == ((0,), (1,))
    os.kill(run._procs[1].process.pid, signal.SIGKILL)
    assert wait_until(lambda: events(run, StartedFromMerged, 1), timeout=120)
    started = events(run, StartedFromMerged, 1)[0]
    assert started.lane == 1 and started.buffer > 0  # its own checkpointed buffer
    run.wait()
    applied = events(run, KnobsApplied, 1)
    assert applied[-1].lane == 1 and applied[-1].values["iterations"] == 2
    resumed = Run.resume(run.path, steps=450)
    assert resumed.race.record().lanes == ((0,), (1,))
    resumed.start()
    resumed.wait()
    for worker in (0, 1):
        assert events(resumed, KnobsApplied, worker)[-1].lane == worker


def test_an_added_worker_stays_out_of_the_mean_until_it_has_updated(tmp_path):
    settings = RunSettings(workers=1, merge_every=15, merge_timeout_s=20)
    run = Run.create(tmp_path / "run", tiny(500, episode_length=60), settings)
    run.start()
    assert wait_until(lambda: (run.path / "merge" / "merged.pt").exists(), timeout=120)
    added = run.add_worker()
    run.wait()
    merges = events(run, Merge, added)
    assert merges, "the added worker merged"
    waiting = [m for m in merges if added in m.left_out]
    assert waiting and "no update of its own" in waiting[0].left_out[added]
    joined = [m for m in merges if added in m.participants]
    assert joined and joined[0].step > waiting[0].step


def test_the_showcase_finds_a_lanes_merged_weights_and_a_racing_workers_own(tmp_path):
    lane = tmp_path / "merge" / "lane-1"
    lane.mkdir(parents=True)
    assert weights_file(tmp_path, lane_source(1)) is None  # no merge yet: untrained
    (lane / "merged.pt").write_bytes(b"x")
    (lane / "worker-3.pt").write_bytes(b"x")
    assert weights_file(tmp_path, lane_source(1))[0] == lane / "merged.pt"
    assert weights_file(tmp_path, 3)[0] == lane / "worker-3.pt"
    assert weights_file(tmp_path, lane_source(0)) is None


def test_a_running_run_splits_into_lanes_from_its_merged_weights(tmp_path):
    settings = RunSettings(workers=2, merge_every=30, merge_timeout_s=30)
    run = Run.create(tmp_path / "run", tiny(360), settings)
    run.start()
    assert wait_until(lambda: len(events(run, Merge, 0)) >= 2, timeout=300)
    merged = torch.load(run.path / "merge" / "merged.pt", weights_only=False)["round"]
    with pytest.raises(ConfigError, match="at least 2 lanes"):
        run.race.start([{}])
    version = run.race.start([{"iterations": 1}, {"iterations": 2}])
    with pytest.raises(ConfigError, match="a race is on"):
        run.race.start([{}, {}])
    run.wait()
    for worker in (0, 1):
        applied = {a.version: a for a in events(run, KnobsApplied, worker)}
        assert applied[version].lane == worker
        assert applied[version].values["iterations"] == worker + 1
        assert (run.path / "merge" / f"lane-{worker}" / "merged.pt").exists()
        # Before the split both merge (a round may leave one out as behind on a loaded
        # machine); after it, no merge with the other worker: each lane is alone.
        split = applied[version].step
        before = [m for m in events(run, Merge, worker) if m.step < split]
        assert any(m.participants == (0, 1) for m in before)
        assert all({*m.participants, *m.left_out} == {0, 1} for m in before)
        assert not [m for m in events(run, Merge, worker) if m.step > split]
    assert merged >= 2
