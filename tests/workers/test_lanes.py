"""Races: lanes of workers with their own knob values and merge pools, promotion, the race
table, and a worker that joins a pool mid-run."""

import dataclasses
import json
import os
import signal
import time

import pytest
import torch
from conftest import events, wait_until
from conftest import tiny_run as tiny

from agent.errors import ConfigError
from workers.merging.files import FileMergeBackend, write_members
from workers.race.control import check_race
from workers.race.table import RaceTracker
from workers.run.checks import check_command
from workers.run.commands import StartRace
from workers.run.owner import Run, RunSettings
from workers.rundir.knob_record import KnobStore
from workers.rundir.lanes import (
    Lane,
    check_layout,
    deal_lanes,
    describe_lane,
    parse_lane,
    replicate,
)
from workers.rundir.records import KnobsApplied, KnobsRefused, Merge, StartedFromMerged
from workers.showcase.shown_weights import lane_source, weights_file


# layouts and values --------------------------------------------------------------------------
def test_lanes_take_their_sizes_the_rest_share_evenly_and_packs_never_span_lanes():
    assert deal_lanes([0, 1, 2, 3, 4], [Lane(), Lane()]) == ((0, 1, 2), (3, 4))
    control = Lane(size=1, merges=False)
    assert deal_lanes(range(5), [Lane(size=4), control]) == ((0, 1, 2, 3), (4,))
    assert deal_lanes(range(6), [Lane(size=1), Lane(), Lane()]) == ((0,), (1, 2, 3), (4, 5))
    with pytest.raises(ConfigError, match="3 lanes need at least 3"):
        deal_lanes([0, 1], [Lane()] * 3)
    with pytest.raises(ConfigError, match="add up to 5 workers and the run has 4"):
        deal_lanes(range(4), [Lane(size=4), control])
    with pytest.raises(ConfigError, match="add up to 5 workers and the run has 6"):
        deal_lanes(range(6), [Lane(size=4), control])  # all sized: they must add up
    with pytest.raises(ConfigError, match="need at least 6 workers"):
        deal_lanes(range(5), [Lane(size=4), Lane(), Lane()])
    settings = RunSettings(workers=4, pack=4, lanes=((0, 1), (2, 3)))
    assert settings.packs == [[0, 1], [2, 3]]
    assert RunSettings(workers=4, pack=4).packs == [[0, 1, 2, 3]]


@pytest.mark.parametrize(
    "text, message",
    [
        ("iterations", "not KEY=VALUE"),
        ("speed=2", "'speed' is not a live knob, workers=N or merge=off"),
        ("iterations=two", "must be a number"),
        ("iterations=99", r"iterations must be in \[1, 32\]"),
        ("iterations=2,iterations=3", "given twice"),
        ("workers=0", "workers must be a whole number of at least 1, got '0'"),
        ("workers=1.5", "workers must be a whole number"),
        ("merge=maybe", "merge must be on or off, got 'maybe'"),
        ("bf16=1", "bf16 must be on or off, got '1'"),
        ("merge_pull=0", r"merge_pull must be in \[0.001, 1\]"),
    ],
)
def test_a_bad_lane_is_one_clear_error(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_lane(text)


def test_a_lane_differing_in_obs_is_refused_as_text_and_as_a_command():
    with pytest.raises(ConfigError, match="lanes cannot differ in obs"):
        parse_lane("obs=rgb")
    race = StartRace((Lane(), Lane({"obs": "rgb"})))  # as a window or a link could send it
    with pytest.raises(ConfigError, match="lane 1: lanes cannot differ in obs"):
        check_command(RunSettings(workers=2), race)


def test_lane_text_reads_knobs_sizes_and_merging_of_either_spelling():
    assert parse_lane("iterations=2, merge-every=500,temperature=1") == Lane(
        {"iterations": 2, "merge_every": 500, "temperature": 1.0}
    )
    assert parse_lane("") == Lane()
    lane = parse_lane("workers=1, merge=off, iterations=2")
    assert lane == Lane({"iterations": 2}, size=1, merges=False)
    assert parse_lane(describe_lane(lane)) == lane
    assert describe_lane(lane) == "workers=1,iterations=2,merge=off"
    lane = parse_lane("merge-policy=off,bf16=on,outer-lr=0.7")
    assert lane.changes == {"merge_policy": False, "bf16": True, "outer_lr": 0.7}
    assert describe_lane(lane) == "merge_policy=off,bf16=on,outer_lr=0.7"
    assert parse_lane(describe_lane(lane)) == lane


def test_a_layout_that_does_not_fit_the_run_is_refused():
    check_layout(((0, 1), (2,)), 3, [0, 1, 2])
    check_layout(((0, 1), (3,)), 4, [0, 1, 3])  # worker 2 was removed
    for lanes, merging, message in [
        (((0, 1), (5,)), [0, 1, 2], "names worker 5, and the run has workers 0-2"),
        (((0, 1), (1, 2)), [0, 1, 2], "worker 1 is in two lanes"),
        (((0,), (2,)), [0, 1, 2], "worker 1 of the run is in no lane"),
        (((0, 1), ()), [0, 1], "lane 1 has no worker"),
        (((0, 1, 2),), [0, 1, 2], "a race needs at least 2 lanes, and the record has 1 lane"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_layout(lanes, 3, merging)
    check_layout(((0,), (1,), (2,), (3,)), 4, [0, 1, 2, 3], replicas=2)
    with pytest.raises(ConfigError, match="at least 2 lanes in 2 replicas each"):
        check_layout(((0,), (1,), (2,)), 3, [0, 1, 2], replicas=2)


def test_the_knob_record_races_changes_one_lane_promotes_and_survives_damage(tmp_path):
    cfg = tiny(100)
    store = KnobStore(tmp_path)
    store.initialise(cfg, 50)
    lanes = ((0, 1), (2, 3))
    version = store.start_race(cfg, lanes, (Lane({"iterations": 1}), Lane({"iterations": 3})))
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
    assert (record.promoted_lane, record.promoted_worker) == (1, None)
    history = [json.loads(line) for line in store.history.read_text().splitlines()]
    assert [h["event"] for h in history] == ["", "race", "", "promote"]
    assert history[2]["lane"] == 0 and history[3]["lane"] == 1
    # Damaged after the promotion: the history rebuilds the promoted values, not the
    # pre-race ones, so that the next knob change does not revert every worker.
    store.path.write_text("{torn")
    rebuilt = store.last_good_record(cfg)
    assert rebuilt.values == record.values and rebuilt.version == version
    assert (rebuilt.pool, rebuilt.promoted_lane) == (version, 1)
    store.set(cfg, horizon=2)
    assert store.read_record().values == {**record.values, "horizon": 2}


def test_a_lane_that_never_merges_is_in_the_record_and_promotes_its_first_workers_weights(
    tmp_path,
):
    cfg = tiny(100)
    store = KnobStore(tmp_path)
    lanes = (Lane(size=2), Lane({"iterations": 3}, size=1, merges=False))
    store.initialise(cfg, 50, ((0, 1), (2,)), lanes)
    record = store.read_record()
    assert record.solo_lanes == (1,) and record.merges(0) and not record.merges(1)
    assert record.merges(None)  # outside a race every worker merges
    version = store.promote(cfg, 1, from_worker=2)
    promoted = store.read_record()
    assert (promoted.promoted_lane, promoted.promoted_worker) == (1, 2)
    assert promoted.solo_lanes == () and promoted.values["iterations"] == 3
    assert version == promoted.pool
    with pytest.raises(ConfigError, match="no lane 0 to promote"):
        store.promote(cfg, 0, weights=False)  # no race left


def test_a_race_needs_two_lanes_and_workers_for_them(tmp_path):
    two = RunSettings(workers=2)
    with pytest.raises(ConfigError, match="at least 2 lanes"):
        Run.create(tmp_path / "a", tiny(100), two, lanes=[Lane()])
    with pytest.raises(ConfigError, match="3 lanes need at least 3 workers"):
        Run.create(tmp_path / "b", tiny(100), two, lanes=[Lane()] * 3)
    with pytest.raises(ConfigError, match="lane 1: iterations must be in"):
        Run.create(tmp_path / "c", tiny(100), two, lanes=[Lane(), Lane({"iterations": 0})])
    with pytest.raises(ConfigError, match="add up to 3 workers and the run has 2"):
        Run.create(tmp_path / "e", tiny(100), two, lanes=[Lane(size=2), Lane(size=1)])
    assert not any((tmp_path / name).exists() for name in "abce")  # nothing written
    settings = RunSettings(workers=4, pack=2)
    run = Run.create(tmp_path / "d", tiny(100), settings)
    with pytest.raises(ConfigError, match="a pack"):
        run.race.start([Lane()] * 3)  # lanes (0, 1), (2,), (3,) would split the pack [2, 3]


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


# end to end ------------------------------------------------------------------------------------
def test_two_lanes_of_two_merge_apart_run_their_own_knobs_and_promote(tmp_path):
    """Four spawned workers in two lanes merge only within their lane, take a knob set for one
    lane, and after a promotion merge as one pool. Only real workers show the lanes kept apart
    through merge rounds under real timing (the rounds are unit-tested above)."""
    settings = RunSettings(workers=4, merge_every=30, merge_timeout_s=30)
    lanes = [Lane({"iterations": 1}), Lane({"iterations": 2})]
    run = Run.create(tmp_path / "run", tiny(420), settings, lanes=lanes)
    run.start()
    assert wait_until(lambda: min(w["step"] for w in run.workers.progress()) >= 110, timeout=300)
    one_lane = run.knobs.set(lane=0, horizon=2)
    assert wait_until(lambda: min(w["knob_version"] for w in run.workers.progress()) >= one_lane)
    promoted = run.race.promote(1, weights=False)
    run.workers.wait()
    assert [w["state"] for w in run.workers.progress()] == ["done"] * 4
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


def test_replicas_survive_resume_and_attach_and_a_killed_pack_restarts_into_its_replica(tmp_path):
    """--lane workers=2,iterations=1 --lane workers=1,iterations=2,merge=off --replicas 2, in
    packs of 2: each replica merges only within itself; a SIGKILL of replica 1's pack restarts
    it into that replica (from its own checkpointed buffer and that replica's merged weights);
    an attach and a resume keep the replicas. Only real processes show the monitor's restart
    finding its replica again."""
    settings = RunSettings(
        workers=6, pack=2, replicas=2, merge_every=30, checkpoint_every=60, max_restarts=1
    )
    lanes = [Lane({"iterations": 1}, size=2), Lane({"iterations": 2}, size=1, merges=False)]
    run = Run.create(tmp_path / "run", tiny(260), settings, lanes=lanes)
    pools = ((0, 1), (2, 3), (4,), (5,))  # lane 0 replicas 0 and 1, lane 1 replicas 0 and 1
    assert run.race.record().lanes == pools and run.race.record().replicas == 2
    run.monitor.restart_backoff_s = 0.1
    run.start()
    assert wait_until(lambda: run.workers.progress()[2]["step"] >= 130, timeout=300)
    attached = Run.attach(run.path).race.record()
    assert (attached.lanes, attached.replicas) == (pools, 2)
    os.kill(run.workers.procs[2].process.pid, signal.SIGKILL)  # the pack of workers 2 and 3
    assert wait_until(lambda: all(events(run, StartedFromMerged, w) for w in (2, 3)), timeout=120)
    for worker in (2, 3):
        started = events(run, StartedFromMerged, worker)[0]
        assert started.lane == 1 and started.buffer > 0  # replica 1 of lane 0, its own buffer
    run.workers.wait()
    for worker, mates in ((0, (0, 1)), (1, (0, 1)), (2, (2, 3)), (3, (2, 3))):
        merges = events(run, Merge, worker)
        assert merges and all(m.participants == mates for m in merges), (worker, merges)
    assert not events(run, Merge, 4) and not events(run, Merge, 5)  # merge=off
    resumed = Run.resume(run.path, steps=300)
    assert (resumed.race.record().lanes, resumed.race.record().replicas) == (pools, 2)
    resumed.start()
    resumed.workers.wait()
    for pool, workers in enumerate(pools):
        for worker in workers:
            applied = events(resumed, KnobsApplied, worker)[-1]
            assert applied.lane == pool and applied.values["iterations"] == 1 + (pool >= 2)


def test_an_added_worker_stays_out_of_the_mean_until_it_has_updated(tmp_path):
    """A worker process added to a running run is left out of the mean until it has updated, then
    joins: only a worker started mid-run shows it catching up with the others' rounds."""
    settings = RunSettings(workers=1, merge_every=15, merge_timeout_s=20)
    run = Run.create(tmp_path / "run", tiny(500, episode_length=60), settings)
    run.start()
    assert wait_until(lambda: (run.path / "merge" / "merged.pt").exists(), timeout=120)
    added = run.workers.add()
    run.workers.wait()
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
    """A running 2-worker run splits into two lanes from its merged weights, and neither merges
    with the other after: only real workers show the split reaching both between rounds."""
    settings = RunSettings(workers=2, merge_every=30, merge_timeout_s=30)
    run = Run.create(tmp_path / "run", tiny(360), settings)
    run.start()
    assert wait_until(lambda: len(events(run, Merge, 0)) >= 2, timeout=300)
    merged = torch.load(run.path / "merge" / "merged.pt", weights_only=False)["round"]
    with pytest.raises(ConfigError, match="at least 2 lanes"):
        run.race.start([Lane()])
    version = run.race.start([Lane({"iterations": 1}), Lane({"iterations": 2})])
    with pytest.raises(ConfigError, match="a race is on"):
        run.race.start([Lane(), Lane()])
    run.workers.wait()
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


def test_a_merging_lane_races_a_lane_that_never_merges_and_promotes_its_weights(tmp_path):
    """What only processes show: the never-merging lane writes no merge record (it publishes
    its weights only), the merging lane merges only within itself, the table ranks both, and a
    promotion with weights leaves every worker with the winner's merged weights."""
    settings = RunSettings(workers=3, merge_every=30, merge_timeout_s=120)
    lanes = [Lane(size=2), Lane({"iterations": 2}, size=1, merges=False)]
    run = Run.create(tmp_path / "run", tiny(100_000), settings, lanes=lanes)
    assert run.race.record().lanes == ((0, 1), (2,)) and run.race.record().solo_lanes == (1,)
    run.start()
    lane0 = run.path / "merge" / "lane-0"
    assert wait_until(
        lambda: (
            len(events(run, Merge, 0)) >= 2
            and min(w["step"] for w in run.workers.progress()) >= 130
        ),
        timeout=400,
    )
    tracker = RaceTracker()
    tracker.ingest(run.new_events())
    table = tracker.table(run.race.record(), run.workers.progress(), time.time())
    assert sorted(row.lane for row in table.rows) == [0, 1]
    assert all(row.score is not None and row.episodes >= 1 for row in table.rows)
    run.pause()
    assert wait_until(
        lambda: all(w["state"] == "paused" for w in run.workers.progress()), timeout=120
    )
    version = run.race.promote(0)  # with its weights
    assert wait_until(lambda: min(w["knob_version"] for w in run.workers.progress()) >= version)
    run.stop()  # paused since the promotion: the weights each saves are the ones it took
    merged = torch.load(lane0 / "merged.pt", weights_only=True)["model"]
    for worker in range(3):
        saved = torch.load(run.path / f"worker-{worker}.pt", weights_only=True)["model"]
        assert all(torch.equal(saved[name], merged[name]) for name in merged), worker
    assert not events(run, Merge, 2), "the lane that never merges merged"
    assert (run.path / "merge" / "lane-1" / "worker-2.pt").exists()  # published, for the showcase
    for worker in (0, 1):
        rounds = events(run, Merge, worker)
        assert rounds and all({*m.participants, *m.left_out} <= {0, 1} for m in rounds)
    applied = events(run, KnobsApplied, 2)[-1]
    assert applied.version == version and applied.lane is None


def test_a_knob_record_whose_lanes_do_not_fit_the_run_is_refused_by_every_worker(tmp_path):
    """A hand-edited knob record that would mix two lanes' workers (and names a worker the run
    lacks): every worker refuses it and the lanes go on merging apart. Only worker processes
    reading the file themselves show each one refusing it."""
    settings = RunSettings(workers=4, merge_every=30, merge_timeout_s=120)
    run = Run.create(tmp_path / "run", tiny(100_000), settings, lanes=[Lane(), Lane()])
    run.start()
    assert wait_until(lambda: min(w["step"] for w in run.workers.progress()) >= 40, timeout=300)
    good = run.race.record()
    bad = dataclasses.replace(good, version=good.version + 1, lanes=((0, 2), (1, 3, 5)))
    (run.path / "knobs.json").write_text(json.dumps(bad.to_json()))
    assert wait_until(lambda: len(events(run, KnobsRefused)) >= 4, timeout=120)
    refused = events(run, KnobsRefused)
    assert {r.worker for r in refused} == {0, 1, 2, 3}
    assert all("names worker 5" in r.reason and r.version == bad.version for r in refused)
    assert run.race.record().lanes == good.lanes  # the run's view keeps the good lanes
    at = max(r.step for r in refused)
    assert wait_until(
        lambda: all(any(m.step > at + 30 for m in events(run, Merge, w)) for w in range(4)),
        timeout=300,
    )
    run.stop()
    for worker, mates in ((0, {0, 1}), (1, {0, 1}), (2, {2, 3}), (3, {2, 3})):
        merges = events(run, Merge, worker)
        assert merges and all({*m.participants, *m.left_out} <= mates for m in merges)


def test_a_killed_worker_of_a_lane_that_never_merges_restarts_from_its_own_weights(tmp_path):
    """Killed by SIGKILL, a worker of a lane that never merges goes on from the weights it
    published at its last round (not from scratch, not another lane's): only a real kill and the
    monitor's restart show it."""
    settings = RunSettings(workers=2, merge_every=30, max_restarts=1)
    lanes = [Lane(size=1), Lane(size=1, merges=False)]
    run = Run.create(tmp_path / "run", tiny(100_000), settings, lanes=lanes)
    run.monitor.restart_backoff_s = 0.1
    run.start()
    own = run.path / "merge" / "lane-1" / "worker-1.pt"
    assert wait_until(
        lambda: own.exists() and run.workers.progress()[1]["step"] >= 100, timeout=300
    )
    os.kill(run.workers.procs[1].process.pid, signal.SIGKILL)
    assert wait_until(lambda: events(run, StartedFromMerged, 1), timeout=120)
    run.stop()
    started = events(run, StartedFromMerged, 1)[0]
    published = torch.load(own, weights_only=True)["step"]
    assert started.lane == 1 and started.step >= 90 and started.step <= published
    assert not events(run, Merge, 1)


def test_replicas_of_lanes_without_a_size_are_equal_or_refused():
    """--workers 5 --lane A --lane B --replicas 2 gave lane 0 replicas of 2 and 1 workers
    silently; the rest is now split alike in every replica, or refused in one line."""
    copies = replicate([Lane(), Lane()], 2)
    assert deal_lanes(range(6), copies, 2) == ((0, 1), (2, 3), (4,), (5,))
    assert deal_lanes(range(8), copies, 2) == ((0, 1), (2, 3), (4, 5), (6, 7))
    with pytest.raises(ConfigError, match="5 workers left .* do not split into 2 equal"):
        deal_lanes(range(5), copies, 2)
    sized = replicate([Lane(size=1), Lane()], 3)
    assert deal_lanes(range(9), sized, 3) == ((0,), (1,), (2,), (3, 4), (5, 6), (7, 8))
    with pytest.raises(ConfigError, match="do not split into 2 equal replicas"):
        check_race(RunSettings(workers=5), [Lane(), Lane()], 2)


def test_a_races_length_is_kept_in_its_record_and_its_history(tmp_path):
    """The race's length (its verdict's time) travels with its lanes: knobs.json, and the
    history that rebuilds a damaged one; a length of 0 is refused with nothing written."""
    cfg = tiny(100)
    store = KnobStore(tmp_path)
    store.initialise(cfg, 10)
    with pytest.raises(ConfigError, match="race_minutes must be a number of minutes above 0"):
        store.start_race(cfg, ((0,), (1,)), (Lane(), Lane()), race_minutes=0)
    assert store.read_record().version == 0
    store.start_race(cfg, ((0,), (1,)), (Lane(), Lane()), race_minutes=30)
    assert store.read_record().race_minutes == 30
    (tmp_path / "knobs.json").write_text("{damaged")
    assert store.last_good_record(cfg).race_minutes == 30
