"""The race verdict from replicas, on synthetic records: an A/A race does not lead, a real
difference leads once its replicas agree, the paired lead's and the merge gain's arithmetic
against each replica raced alone, the mean curve and its band, the top of the scale, and a
table that never raises on a record. No processes: records fed to the tracker."""

import dataclasses

import numpy as np
import pytest
from conftest import tiny_config
from helpers.race_records import T0, episodes_of, learning, progress_of, record_of, tracker_of

from agent.errors import ConfigError
from bench.race_looks import Model, a_a_race, scores, watched
from workers.race.replicas import mean_curve, t_975
from workers.race.table import RaceTracker
from workers.race.text import level_text, race_text, race_top, summary_lines
from workers.rundir.lanes import check_layout
from workers.rundir.records import KnobsApplied, Stop

T_2 = 4.3027  # Student's t, 97.5th percentile, 2 degrees of freedom (3 replicas)
T_1 = 12.7062  # and 1 (2 replicas)


def race(curves, replicas, solo=(), published=None, ended=True):
    """A race whose lane l's replica r (worker l * replicas + r, one each) ran curves[l][r]
    ((times, returns)); the table at the last episode, where every worker ended its steps
    (`ended`: else the race runs on)."""
    lanes = tuple((w,) for w in range(len(curves) * replicas))
    record = record_of(lanes, solo=solo, replicas=replicas)
    tracker = tracker_of(record, published)
    last = 0.0
    for lane, copies in enumerate(curves):
        for r, (times, returns) in enumerate(copies):
            tracker.ingest(episodes_of(lane * replicas + r, times, returns))
            last = max(last, float(times[-1]))
    if ended:
        tracker.ingest(
            Stop(step=0, time=T0 + last, reason="done", worker=w) for w in range(len(lanes))
        )
    return tracker.table(record, progress_of(record), now=T0 + last + 1)


def seeded_curves(rng, lanes, replicas, ends, seed_sd, noise, shared=0.0, n=30):
    """Each lane's replicas climbing from 0 to ends[l] plus a seed effect: its own (sd
    `seed_sd`) and one replica r shares with every lane (sd `shared`: its environments')."""
    common = shared * rng.standard_normal(replicas)
    return [
        [
            learning(
                0,
                ends[lane] + common[r] + seed_sd * rng.standard_normal(),
                n,
                noise,
                seed=int(rng.integers(1 << 30)),
            )
            for r in range(replicas)
        ]
        for lane in range(lanes)
    ]


def test_an_a_a_race_leads_about_as_often_as_its_5_percent():
    """Two lanes of one setting, whose seeds move the end level far more than episode noise
    moves a score: across 200 races of 3 replicas the table names a leader in at most 10 %
    (a 95 % paired t: 5 % expected, 7 % with these seeds, the replicas' differences being
    not quite normal), while one replica's episode bootstrap, the rule the race had, would
    have called over half of them."""
    rng = np.random.default_rng(7)
    leads, noise_calls = 0, 0
    for _ in range(200):
        curves = seeded_curves(rng, 2, 3, ends=(100, 100), seed_sd=30, noise=3)
        table = race(curves, 3)
        leads += any(row.leader for row in table.rows)
        alone = race([[curves[0][0]], [curves[1][0]]], 1)
        noise_calls += alone.lead[0] > alone.lead[1]
    assert leads <= 20, leads
    assert noise_calls >= 100, noise_calls


def test_a_real_difference_leads_once_the_replicas_agree():
    """Lane 1 ends at 200, lane 0 at 100, each replica's environments moving both alike: it
    leads, paired; before 10 episodes of each replica it is too early; with one replica of
    the three turned against it the lead includes 0 and nobody leads."""
    rng = np.random.default_rng(3)
    curves = seeded_curves(rng, 2, 3, ends=(100, 200), seed_sd=5, noise=5, shared=60)
    table = race(curves, 3)
    first, second = table.rows
    assert first.lane == 1 and first.leader and not second.leader
    assert (
        table.verdict.startswith("lane 1 leads: +") and "paired across 3 replicas" in table.verdict
    )
    early = race([[(t[:8], r[:8]) for t, r in copies] for copies in curves], 3)
    assert early.verdict.startswith("too early to call") and not any(r.leader for r in early.rows)
    # Replica 2 of lane 0 now learns to 400: two replicas for lane 1, one against.
    curves[0][2] = learning(0, 400, 30, 5, seed=11)
    split = race(curves, 3)
    assert not any(row.leader for row in split.rows)
    assert split.verdict.startswith("too close to call") and "includes 0" in split.verdict
    assert "leads" not in race_text(split)


def test_the_paired_lead_is_each_replicas_own_race_averaged_with_a_t_interval():
    """Each replica's score in the race of three is its score raced alone (a one-replica race
    of the same episodes, on the same scale: a published top, first returns of 0); the lead is
    the mean of the replica-by-replica differences +- t(2) x their standard deviation /
    sqrt(3); each lane's score the mean of its replicas' with that interval."""
    rng = np.random.default_rng(5)
    curves = seeded_curves(rng, 2, 3, ends=(100, 150), seed_sd=20, noise=10)
    for copies in curves:
        for _, returns in copies:
            returns[0] = 0.0  # the start level of every race below
    table = race(curves, 3, published=200.0)
    rows = {row.lane: row for row in table.rows}
    alone = [race([[curves[0][r]], [curves[1][r]]], 1, published=200.0) for r in range(3)]
    assert table.start_level == 0 and all(a.start_level == 0 for a in alone)
    for lane in (0, 1):
        own = [next(x.score for x in a.rows if x.lane == lane) for a in alone]
        assert rows[lane].replica_scores == pytest.approx(own)
        sd = np.std(own, ddof=1)
        assert rows[lane].score == pytest.approx(np.mean(own))
        assert rows[lane].spread == pytest.approx(T_2 * sd / np.sqrt(3))
    first, second = table.rows
    diffs = np.subtract(first.replica_scores, second.replica_scores)
    expected = (diffs.mean(), T_2 * diffs.std(ddof=1) / np.sqrt(3))
    assert table.lead == pytest.approx(expected)
    assert first.leader == (expected[0] - expected[1] > 0)


def test_the_merge_gain_is_the_mean_of_each_replicas_gain_with_its_spread():
    """A merging lane against the control, 2 replicas, the control's replicas slower by 2x and
    3x: at each threshold the gain is the mean over replicas of the control's agent steps to
    it over the merging lane's (replica r against replica r), +- t(1) x sd / sqrt(2)."""
    fast = [learning(0, 100, 30, 1, seed=s) for s in (1, 2)]
    slow = [learning(0, 100, 30, 1, seed=s, every=w) for s, w in ((3, 20.0), (4, 30.0))]
    table = race([fast, slow], 2, solo=(2, 3))
    merging, control = sorted(table.rows, key=lambda row: row.merges)[::-1]
    assert table.control == control.lane == 1 and merging.merges
    called = 0
    for level in table.thresholds:
        mine = [reached[level] for reached in merging.replica_reached]
        theirs = [reached[level] for reached in control.replica_reached]
        if None in mine or None in theirs:
            continue
        steps = [c[1] / m[1] for m, c in zip(mine, theirs)]
        times = [c[0] / m[0] for m, c in zip(mine, theirs)]
        gain = merging.gain[level]
        assert gain.steps == pytest.approx(np.mean(steps))
        assert gain.steps_spread == pytest.approx(T_1 * np.std(steps, ddof=1) / np.sqrt(2))
        assert gain.time == pytest.approx(np.mean(times)) and not gain.at_least
        assert 1.5 < min(times) and max(times) < 3.5  # the control's 2x and 3x slower pace
        called += 1
    assert called >= 1
    line = summary_lines(table)[-1]
    assert line.startswith("merge gain of lane 0 over lane 1") and "+-" in line
    # The figures behind each mean, replica by replica (a threshold's first, merging lane's).
    level = table.thresholds[0]
    each = [r[level] for r in merging.replica_reached]
    shown = [f"{int(t // 60)}:{int(t % 60):02d} ({n:.0f} steps)" for t, n in each]
    expected = f"lane 0, replica by replica: to {level_text(level)}: {', '.join(shown)}"
    assert expected in race_text(table)


def test_the_mean_curve_follows_each_replicas_latest_episode_and_the_band_spans_them():
    a = [(10.0, 100.0, 1.0), (30.0, 300.0, 3.0)]
    b = [(20.0, 200.0, 5.0), (40.0, 400.0, 7.0)]
    curve, band = mean_curve([a, b])
    # From 20 s on (both have an episode): at 20 (1, 5), 30 (3, 5), 40 (3, 7).
    assert curve == [(20.0, 150.0, 3.0), (30.0, 250.0, 4.0), (40.0, 350.0, 5.0)]
    assert band == [(20.0, 1.0, 5.0), (30.0, 3.0, 5.0), (40.0, 3.0, 7.0)]
    assert mean_curve([a, []]) == ([], [])


def test_the_published_final_is_the_top_only_for_episodes_as_long_as_the_published():
    """cartpole-balance has a published curve: the top with episodes of 1000 control steps
    (500 agent steps at action repeat 2, or the CPU demo's 125 at 8: rewards add up across a
    repeat); with shorter episodes the best lane's level is the top, and the table says why."""
    published, note = race_top(tiny_config(episode_length=500, action_repeat=2))
    assert published is not None and published > 700 and note == ""
    assert race_top(tiny_config(episode_length=125, action_repeat=8)) == (published, "")
    short = tiny_config(episode_length=50, action_repeat=2)  # 1000 is out of reach
    top, note = race_top(short)
    assert top is None and "1000 control steps" in note and "are 100 (50 agent steps" in note
    record = record_of(((0,), (1,)))
    tracker = RaceTracker(None, None, note)
    tracker.ingest(
        KnobsApplied(step=0, time=T0, version=1, values={}, lane=w, worker=w) for w in (0, 1)
    )
    tracker.ingest(episodes_of(0, [10, 20], [5, 30]) + episodes_of(1, [15, 25], [5, 10]))
    table = tracker.table(record, progress_of(record), now=T0 + 30)
    assert table.top_from == "best" and table.top_note == note
    assert note in summary_lines(table)[1]


def test_the_table_never_raises_on_a_record_and_refuses_only_what_check_layout_refuses():
    """Random layouts (1-4 lanes, 1-3 replicas, workers with and without episodes): the table
    is made for every record, a one-lane record included ("nothing to race against"), and
    check_layout refuses exactly the records with fewer than two lanes or a count that is not a
    multiple of the replicas."""
    rng = np.random.default_rng(11)
    for _ in range(150):
        replicas = int(rng.integers(1, 4))
        entries = int(rng.integers(1, 9))
        lanes = tuple((w,) for w in range(entries))
        record = record_of(lanes, solo=tuple(n for n in range(entries) if rng.random() < 0.3))
        record = dataclasses.replace(record, replicas=replicas)
        tracker = tracker_of(record)
        for w in range(entries):
            if rng.random() < 0.8:
                count = int(rng.integers(1, 25))
                tracker.ingest(episodes_of(w, *learning(0, 50, count, 5, seed=w)))
        table = tracker.table(record, progress_of(record), now=T0 + 400)
        race_text(table)
        assert len(table.rows) == record.race_lanes
        fits = entries % replicas == 0 and entries // replicas >= 2
        try:
            check_layout(lanes, entries, list(range(entries)), replicas)
            assert fits
        except ConfigError as err:
            assert not fits and "at least 2 lanes" in str(err)
        if record.race_lanes < 2:
            assert table.verdict == "one lane: nothing to race against"


def test_students_t_is_right_at_every_degree_of_freedom_and_never_the_normals_too_soon():
    """The 97.5th percentile against published values (to 1e-4): the table below 10 degrees of
    freedom, the expansion above, never 1.96 at 60 (where the old table said so: 2.0003)."""
    published = {1: 12.7062, 2: 4.3027, 9: 2.2622, 10: 2.2281, 15: 2.1314, 30: 2.0423}
    published.update({40: 2.0211, 60: 2.0003, 120: 1.9799, 1000: 1.9623})
    for df, value in published.items():
        assert t_975(df) == pytest.approx(value, abs=1e-4), df
    values = [t_975(df) for df in range(1, 2000)]
    assert all(a > b > 1.96 for a, b in zip(values, values[1:]))
    with pytest.raises(ValueError):
        t_975(0)


def test_a_watched_race_calls_an_a_a_race_no_more_often_than_one_looked_at_once():
    """Synthetic A/A races of 90 minutes, 3 replicas (bench/race_looks.py): with the verdict
    re-evaluated at every look, as the window looks (every 0.25 s) or the printer (every 5
    minutes), far more than 5 % of them show "leads" at some look; with the verdict given once,
    at the race's end, about 5 %, however often the table is looked at."""
    found = watched(300, seed=1)
    assert found["looks"]["window"] > 20_000 and found["looks"]["headless printer"] == 18
    assert found["at_the_end"] <= 0.08
    for rate in found["every_look"].values():
        assert rate >= 2.5 * found["at_the_end"] and rate >= 0.12


def tracker_until(record, race, seconds):
    """A tracker that has seen every worker's episodes (race[w]: times, returns) up to
    `seconds` after the race began, as one looking then has."""
    tracker = tracker_of(record)
    for w, (times, returns) in enumerate(race):
        kept = times <= seconds
        tracker.ingest(episodes_of(w, times[kept], returns[kept]))
    return tracker


def test_the_synthetic_races_scores_are_the_tables():
    """bench/race_looks.py's score of each replica at a look is the race table's (on the
    table's scale: its span divides it)."""
    race = a_a_race(np.random.default_rng(2), Model())
    record = record_of(tuple((w,) for w in range(len(race))), replicas=3)
    start = float(np.mean([returns[0] for _, returns in race]))
    for minute in (20, 45, 80):
        tracker = tracker_until(record, race, 60 * minute)
        table = tracker.table(record, progress_of(record), now=T0 + 60 * minute)
        span = table.top - table.start_level
        assert table.start_level == pytest.approx(start) and not table.ended
        for row in table.rows:
            for r, score in enumerate(row.replica_scores):
                times, returns = race[row.lane * 3 + r]
                ours = scores(times, returns, start, np.array([60.0 * minute]))[0][0]
                assert score == pytest.approx(ours / span, abs=1e-9), (minute, row.lane, r)


def test_before_its_end_a_race_is_only_ahead_so_far_and_its_verdict_then_stays():
    """Lane 1 far ahead in every replica: until 90 minutes of race training the table says
    "ahead so far" at every look (no row leads); from the end on, at every later look, it is
    the table as it stood then, with its verdict, episodes after it left out."""
    rng = np.random.default_rng(4)
    curves = seeded_curves(rng, 2, 3, ends=(100, 300), seed_sd=5, noise=5, n=60)
    race = [(times * 10, returns) for copies in curves for times, returns in copies]
    record = record_of(tuple((w,) for w in range(6)), replicas=3)
    for minute in range(20, 90, 5):
        tracker = tracker_until(record, race, 60 * minute)
        table = tracker.table(record, progress_of(record), now=T0 + 60 * minute)
        assert not table.ended and not any(row.leader for row in table.rows), minute
        assert table.verdict.startswith("lane 1 ahead so far: +"), minute
        assert "the verdict at 90 minutes of race training" in table.verdict
    ended = []
    for minute in (90, 95, 120):
        tracker = tracker_until(record, race, 60 * minute)
        ended.append(tracker.table(record, progress_of(record), now=T0 + 60 * minute))
    assert all(t.ended and t.clock == pytest.approx(5400) for t in ended)
    assert [t.verdict for t in ended] == [ended[0].verdict] * 3
    assert [t.rows[0].replica_scores for t in ended] == [ended[0].rows[0].replica_scores] * 3
    assert ended[0].verdict.startswith("lane 1 leads: +") and ended[0].rows[0].leader
    assert "the race ended at 90:00 of training" in race_text(ended[0])
