"""The race table on synthetic records: the ranking whatever the reward's sign, lanes of
different sizes, a pause, a lane without an episode yet, a lead within the noise, and the merge
gain's arithmetic. No processes: records as the workers write them, fed to the tracker."""

import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import tiny_config
from helpers.process_fakes import make_run
from helpers.race_records import (
    T0,
    episodes_of,
    learning,
    progress_of,
    record_of,
    tracker_of,
)

from agent.errors import UserError
from bench.race import race_history
from workers.race.rows import Gain
from workers.race.table import RaceTracker
from workers.race.text import race_of, race_text
from workers.rundir.lanes import Lane, deal_lanes
from workers.rundir.records import (
    Checkpoint,
    Eval,
    KnobsApplied,
    Pause,
    Resume,
    Stop,
)
from workers.rundir.settings import RunSettings


def test_negative_returns_rank_the_lane_that_learned_sooner_first():
    """Pendulum-like returns (-1200 up to -200). The lane that learns fast ranks first;
    counting a lane as 0 before its first episode (as the area of raw returns did) would have
    put the slow lane, whose episodes began later, ahead. One replica: however clear the lead
    over one run's episode noise, the verdict names no leader and says that seeds decide."""
    record = record_of(((0,), (1,)))
    tracker = tracker_of(record)
    fast = learning(-1200, -200, 30, 20, seed=1)
    slow = learning(-1200, -900, 25, 20, seed=2, t_first=60)
    tracker.ingest(episodes_of(0, *fast) + episodes_of(1, *slow))
    table = tracker.table(record, progress_of(record), now=T0 + 310)
    first, second = table.rows
    assert (first.lane, second.lane) == (0, 1)
    gap, noise = first.score - second.score, np.hypot(first.spread, second.spread)
    assert gap > 3 * noise and table.lead == pytest.approx((gap, noise))
    assert not first.leader and table.verdict.startswith(f"lane 0 ahead by {gap:.2f} +- ")
    assert "seeds decide" in table.verdict and "--replicas" in table.verdict
    assert table.start_level == pytest.approx(np.mean([fast[1][0], slow[1][0]]))
    assert table.top_from == "best" and table.top == pytest.approx(max(v for *_, v in first.curve))
    assert first.score > 0.3 and abs(second.score) < 0.2
    # Thresholds are fractions of the way from the start to the top, whatever the sign.
    span = table.top - table.start_level
    assert table.thresholds == [round(table.start_level + f * span, 1) for f in (0.5, 0.75, 0.9)]
    assert all(first.reached[level] is not None for level in table.thresholds)
    assert all(second.reached[level] is None for level in table.thresholds)


def test_the_published_final_return_is_the_top_and_a_lane_below_the_start_scores_below_zero():
    record = record_of(((0,), (1,)))
    tracker = tracker_of(record, published=1000.0)
    tracker.ingest(episodes_of(0, [10, 20, 30, 40], [200, 400, 600, 800]))
    tracker.ingest(episodes_of(1, [15, 25, 35, 45], [200, 150, 100, 50]))
    table = tracker.table(record, progress_of(record), now=T0 + 50)
    assert table.top == 1000.0 and table.top_from == "published" and table.start_level == 200
    assert table.thresholds == [600.0, 800.0, 920.0]
    rows = {row.lane: row for row in table.rows}
    assert rows[1].score < 0 < rows[0].score
    # Lane 0: smoothed 200, 300, 400, 500 over the race's 50 s, normalised by 800 from 200.
    expected = ((0 * 10 + 100 * 10 + 200 * 10 + 300 * 10) / 800) / 50
    assert rows[0].score == pytest.approx(expected)
    assert rows[0].reached[600.0] is None  # the smoothed return reached 500 only


def test_a_lane_without_an_episode_is_at_the_start_level_and_nobody_leads_yet():
    record = record_of(((0,), (1,)))
    tracker = tracker_of(record)
    tracker.ingest(episodes_of(0, *learning(10, 50, 8, 1, seed=3)))
    table = tracker.table(record, progress_of(record), now=T0 + 100)
    rows = {row.lane: row for row in table.rows}
    assert rows[1].score is None and rows[1].ret is None and rows[1].episodes == 0
    assert table.rows[-1].lane == 1  # unranked lanes last
    assert not any(row.leader for row in table.rows)
    assert table.verdict.startswith("too early to call")
    last = race_text(table).splitlines()[2].split()
    assert last[0] == "1" and last[5:] == ["-"] * 6  # no return, eval, score or thresholds


def test_one_replica_shows_its_lead_within_the_noise_and_names_no_leader():
    record = record_of(((0,), (1,)))
    tracker = tracker_of(record)
    same = learning(0, 100, 40, 40, seed=4)
    other = (same[0] + 3, learning(0, 100, 40, 40, seed=5)[1])
    tracker.ingest(episodes_of(0, *same) + episodes_of(1, *other))
    table = tracker.table(record, progress_of(record), now=T0 + 420)
    first, second = table.rows
    assert first.score != second.score and first.spread > 0 and second.spread > 0
    assert first.score - second.score < np.hypot(first.spread, second.spread)
    assert not first.leader and table.verdict.startswith(f"lane {first.lane} ahead by")


def test_lanes_of_different_sizes_are_compared_per_worker_and_say_so():
    record = record_of(((0, 1, 2), (3, 4)))
    tracker = tracker_of(record)
    for w in range(5):
        tracker.ingest(episodes_of(w, [10, 20, 30], [10 + w, 20 + w, 30 + w], [100, 200, 300]))
    progress = [{"worker": w, "step": 100.0 * (w + 1), "steps_per_s": 1.0 + w} for w in range(5)]
    table = tracker.table(record, progress, now=T0 + 40)
    rows = {row.lane: row for row in table.rows}
    assert table.note == "lanes differ in size (3/2 workers): every figure is per worker"
    assert rows[0].steps == pytest.approx(200.0) and rows[1].steps == pytest.approx(450.0)
    assert rows[0].steps_per_s == pytest.approx(2.0) and rows[1].steps_per_s == pytest.approx(4.5)
    assert rows[0].ret == pytest.approx(np.mean([20 + w for w in (0, 1, 2)]))  # per worker
    assert rows[0].episodes == 9 and rows[1].episodes == 6
    assert tracker_of(record_of(((0,), (1,)))).table(record_of(((0,), (1,))), [], T0 + 1).note == ""


def test_a_pause_is_not_race_time():
    record = record_of(((0,), (1,)))
    tracker = tracker_of(record)
    tracker.ingest(episodes_of(0, [10, 20], [1, 2]) + episodes_of(1, [10, 20], [1, 1]))
    tracker.ingest(
        [Pause(step=200, time=T0 + 30, worker=w) for w in (0, 1)]
        + [Resume(step=200, time=T0 + 130, worker=w) for w in (0, 1)]
    )
    tracker.ingest(episodes_of(0, [140], [3], [300]) + episodes_of(1, [140], [1], [300]))
    table = tracker.table(record, progress_of(record), now=T0 + 150)
    assert table.clock == pytest.approx(50.0)  # 150 s, less the 100 s paused
    rows = {row.lane: row for row in table.rows}
    # Lane 0 reached 2.0 (smoothed 2.0 at its third episode) after 40 s of training, not 140.
    level = next(level for level in table.thresholds if level > 1.5)
    assert rows[0].reached[level][0] == pytest.approx(40.0)
    # One worker paused alone (the other trained on) is still race time.
    tracker.ingest([Pause(step=300, time=T0 + 150, worker=0)])
    assert tracker.table(record, progress_of(record), now=T0 + 170).clock == pytest.approx(70.0)


def test_the_merge_gain_is_the_control_lanes_steps_and_time_over_the_merging_lanes():
    record = record_of(((0, 1), (2,)), solo=(1,))
    tracker = tracker_of(record, published=100.0)
    # From 0 to the top 100: thresholds 50, 75, 90 (the smoothed returns cross them).
    for w in (0, 1):
        tracker.ingest(episodes_of(w, [10, 20, 30, 40], [0, 100, 100, 100], [0, 1000, 1100, 1200]))
    tracker.ingest(episodes_of(2, [10, 50, 60, 70], [0, 100, 100, 100], [0, 2100, 2200, 2300]))
    tracker.ingest([Eval(step=1000, time=T0 + 45, ret=90.0, returns=(80.0, 100.0), worker=0)])
    progress = [
        {"worker": 0, "step": 1200.0, "steps_per_s": 3.0},
        {"worker": 1, "step": 1200.0, "steps_per_s": 3.0},
        {"worker": 2, "step": 2300.0, "steps_per_s": 3.0},
    ]
    table = tracker.table(record, progress, now=T0 + 80)
    rows = {row.lane: row for row in table.rows}
    assert table.control == 1 and not rows[1].merges and rows[1].gain == {}
    # Smoothed: 0, 50 (at 20 s, 1000 steps), 66.7, 75 (at 40 s, 1200 steps) for lane 0.
    assert rows[0].reached[50.0] == (20.0, 1000.0) and rows[0].reached[75.0] == (40.0, 1200.0)
    assert rows[1].reached[50.0] == (50.0, 2100.0) and rows[1].reached[75.0] == (70.0, 2300.0)
    assert rows[0].gain[50.0] == Gain(steps=2.1, time=2.5)
    assert rows[0].gain[75.0] == Gain(steps=2300 / 1200, time=70 / 40)
    assert rows[0].gain[90.0] is None  # not reached by the merging lane: not yet
    assert rows[0].eval_ret == 90.0 and rows[0].eval_episodes == 2
    text = race_text(table)
    assert "merge gain of lane 0 over lane 1: to 50: 2.1x steps, 2.5x time" in text
    assert "to 90: not yet" in text and "merge=off" in text


def test_a_gain_while_the_control_lane_has_not_got_there_is_a_lower_bound():
    record = record_of(((0,), (1,)), solo=(1,))
    tracker = tracker_of(record, published=100.0)
    tracker.ingest(episodes_of(0, [10, 20], [100, 100], [500, 600]))
    tracker.ingest(episodes_of(1, [10, 20], [0, 0], [500, 600]))
    progress = [
        {"worker": 0, "step": 700.0, "steps_per_s": 1.0},
        {"worker": 1, "step": 1500.0, "steps_per_s": 1.0},
    ]
    table = tracker.table(record, progress, now=T0 + 30)
    lane0 = next(row for row in table.rows if row.lane == 0)
    # The start level is the first episodes' mean (50): lane 0 is at the top from 10 s on.
    assert lane0.gain[table.thresholds[0]] == Gain(steps=1500 / 500, time=30 / 10, at_least=True)
    assert ">3.0x steps, >3.0x time" in race_text(table)


def test_seeding_and_pretraining_are_shown_and_the_same_for_every_lane():
    record = record_of(((0,), (1,)))
    tracker = tracker_of(record)
    tracker.seed_steps = 100
    tracker.ingest(
        episodes_of(0, [10, 30], [1, 2], [50, 150]) + episodes_of(1, [12, 25], [1, 3], [50, 150])
    )
    table = tracker.table(record, progress_of(record), now=T0 + 40)
    assert table.warmup == pytest.approx(30.0)  # the last worker's first record past step 100
    assert "of which seeding and pretraining: 0:30, every lane" in race_text(table)
    late = tracker_of(record)
    late.seed_steps = 100
    late.ingest(episodes_of(0, [10], [1], [50]) + episodes_of(1, [12], [1], [150]))
    assert late.table(record, progress_of(record), now=T0 + 40).warmup is None  # 0 still seeds


def test_a_stopped_race_keeps_its_clock_and_reads_back_as_it_stood_at_a_minute(tmp_path):
    """The checkpoint a worker writes as it stops does not start its clock again; a finished
    run's table can be read as it stood at a minute of the race (bench --race-table)."""
    record = record_of(((0,), (1,)))
    lines = {w: [] for w in (0, 1)}
    for w in (0, 1):
        applied = KnobsApplied(step=0, time=T0, version=1, values={}, lane=w)
        rets = [10, 20, 30, 40, 50] if w == 0 else [10, 10, 10, 10, 10]
        episodes = episodes_of(w, [60, 120, 180, 240, 300], rets)
        stop = [Stop(step=500, time=T0 + 310, reason="done")]
        stop.append(Checkpoint(step=500, time=T0 + 311, path="checkpoints/worker.pt"))
        lines[w] = [applied, *episodes, *stop]
        (tmp_path / f"worker-{w}.jsonl").write_text(
            "".join(json.dumps(r.to_json()) + "\n" for r in lines[w])
        )
    tracker = RaceTracker()
    tracker.ingest(replace(r, worker=w) for w in (0, 1) for r in lines[w])
    assert tracker.table(record, [], now=T0 + 5000).clock == pytest.approx(310.0)
    cfg = tiny_config(episode_length=50)  # not the published protocol: the best lane is the top
    early = race_of(tmp_path, record, None, cfg, at_minutes=2.5)
    assert "steps/worker" in early and "averaged over 2:30 of training" in early
    rows = [line.split() for line in early.splitlines()[1:3]]
    assert {row[0]: row[3] for row in rows} == {"0": "200", "1": "200"}  # steps by then
    assert "averaged over 5:10 of training" in race_of(tmp_path, record, None, cfg)


def test_bench_reads_a_finished_races_table_through_the_run_api(tmp_path):
    """`bench --race-table DIR`: a run attached, read only; a run that never raced is refused."""
    cfg = tiny_config()
    make_run(tmp_path / "plain", cfg, RunSettings(workers=2))
    with pytest.raises(UserError, match="holds no race"):
        race_history(str(tmp_path / "plain"), [5])
    lanes = (Lane(), Lane(size=1, merges=False))
    layout = deal_lanes(RunSettings(workers=3).merging, lanes)
    make_run(tmp_path / "race", cfg, RunSettings(workers=3, lanes=layout), layout, lanes)
    text = race_history(str(tmp_path / "race"), [5])
    assert text.splitlines()[0] == "5 minutes into the race:" and "at the end:" in text
