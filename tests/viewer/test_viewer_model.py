"""The viewer's logic without a display: chart data, downsampling, smoothing, knob and worker
state, start-up progress, hover read-out and the window's command line."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from agent.config import make_config
from agent.envs.published import PUBLISHED, PUBLISHED_PIXELS
from viewer.model import RunModel
from viewer.plots import axis_limits, nearest_point
from viewer.series import Series, downsample, published_curve, published_note, smooth
from workers.rundir.records import Episode, Error, Eval, KnobsApplied, Merge, SelfCheck, Train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_series_grows_past_its_initial_capacity():
    s = Series()
    for i in range(1000):
        s.append(i, 100.0 + i, i * 2.0)
    assert len(s) == 1000
    assert s.steps[-1] == 999 and s.walls[0] == 100.0 and s.values[10] == 20.0
    assert s.last() == 1998.0


def test_smoothing_is_debiased_and_zero_weight_is_identity():
    values = np.array([10.0, 10.0, 10.0, 20.0])
    assert np.array_equal(smooth(values, 0.0), values)
    out = smooth(values, 0.9)
    assert out[0] == pytest.approx(10.0)  # debiased: the first value is not pulled to 0
    assert 10.0 < out[-1] < 20.0
    with pytest.raises(ValueError):
        smooth(values, 1.0)


def test_downsample_bounds_points_and_keeps_extremes():
    x = np.arange(100_000, dtype=float)
    y = np.sin(x / 500.0)
    y[54_321] = 50.0  # a spike must survive
    y[7_777] = -50.0
    dx, dy = downsample(x, y, 1000)
    assert len(dx) <= 1000
    assert dy.max() == 50.0 and dy.min() == -50.0
    assert np.all(np.diff(dx) >= 0)  # still in x order
    small_x, small_y = downsample(x[:10], y[:10], 1000)
    assert np.array_equal(small_x, x[:10]) and np.array_equal(small_y, y[:10])


def test_published_curve_is_in_agent_steps():
    steps, returns = published_curve("walker-walk")
    assert steps[0] == 0 and steps[1] == 50_000  # 100k environment steps, action repeat 2
    assert returns[-1] > 800  # walker-walk is solved by the published runs
    assert published_curve("swimmer-swimmer6") is None  # not among the published tasks


def test_the_published_line_follows_the_runs_action_repeat_and_says_what_differs():
    steps, _ = published_curve("cartpole-balance", action_repeat=8)
    assert steps[1] == 100_000 / 8  # the same environment steps, fewer agent steps
    demo = make_config(
        1, task="cartpole-balance", action_repeat=8, episode_length=125, pretrain_updates=100
    )
    note = published_note(demo, published=True)
    for said in (
        "model 1M (paper 5M)",
        "action repeat 8 (paper 2)",
        "episode length 125 (paper 500)",
    ):
        assert said in note
    assert "pretraining updates 100 (paper 2500)" in note  # 5 x 500 seed steps in the paper
    assert "samples" not in note  # the paper's planning is kept
    assert "differs" not in published_note(make_config(5, task="walker-walk"), published=True)
    assert published_note(demo, published=False) == "no published curve for this task"


def test_every_published_task_has_its_reference_curve_shipped():
    # The reference line shows for each of the 28 tasks the authors report, the demo's
    # cartpole-balance included.
    tasks = sorted(p.stem for p in PUBLISHED.glob("*.csv"))
    assert len(tasks) == 28 and "cartpole-balance" in tasks
    for task in tasks:
        steps, returns = published_curve(task)
        assert steps[0] == 0 and steps[-1] >= 50_000, task
        assert np.isfinite(returns).all() and len(steps) >= 2, task


def test_a_pixel_run_is_drawn_beside_the_authors_pixel_curve():
    # Their 12 pixel tasks, 3 seeds each; walker-walk's mean is 464 at 100k environment steps,
    # 836 at 200k (their results/tdmpc2-pixels/walker-walk.csv), below the state curve's.
    tasks = sorted(p.stem for p in PUBLISHED_PIXELS.glob("*.csv"))
    assert len(tasks) == 12 and "walker-walk" in tasks and "cartpole-balance" not in tasks
    seeds = {
        line.split(",")[2]
        for line in (PUBLISHED_PIXELS / "walker-walk.csv").read_text().split()[1:]
    }
    assert seeds == {"1", "2", "3"}
    steps, pixels = published_curve("walker-walk", obs="rgb")
    _, states = published_curve("walker-walk")
    assert steps[1] == 50_000 and round(pixels[1]) == 464 and round(pixels[2]) == 836
    assert pixels[1] < states[1]
    assert published_curve("cartpole-balance", obs="rgb") is None  # not among their pixel runs
    rgb = make_config(5, task="walker-walk", obs="rgb")
    assert "from pixels" in published_note(rgb, published=True)
    assert "differs" not in published_note(rgb, published=True)
    small = make_config(5, task="walker-walk", obs="rgb", buffer_size=100_000)
    assert "replay buffer 100000 (paper 1000000)" in published_note(small, published=True)
    assert published_note(rgb, published=False) == "no published curve for this task from pixels"


def events_of_a_run():
    t = 1000.0
    out = []
    for step in range(50, 501, 50):
        for w in (0, 1):
            out.append(Episode(worker=w, step=step, time=t + step, ret=step + w, length=50))
    out += [
        KnobsApplied(worker=0, step=0, time=t, version=0, values={"horizon": 3}),
        KnobsApplied(worker=1, step=0, time=t, version=0, values={"horizon": 3}),
        Train(
            worker=0, step=200, time=t + 200, updates=1, steps_per_s=9.5, losses={"total_loss": 1.5}
        ),
        Train(
            worker=0,
            step=300,
            time=t + 300,
            updates=2,
            steps_per_s=9.0,
            losses={"total_loss": math.nan},
        ),
        Merge(
            worker=0,
            step=300,
            time=t + 301,
            round=3,
            participants=(0,),
            left_out={1: "weights not finite"},
            distances={0: 0.5},
        ),
        Merge(worker=1, step=300, time=t + 302, round=3, participants=(0, 1)),
        KnobsApplied(worker=0, step=320, time=t + 320, version=1, values={"horizon": 5}),
        Eval(worker=0, step=400, time=t + 400, ret=321.0),
        Error(worker="player", step=0, time=t + 5, message="could not load"),
    ]
    return out


def test_model_turns_events_into_chart_lines_and_marks():
    model = RunModel(workers=2, seed_steps=100)
    model.ingest(events_of_a_run())
    lines = model.return_lines(wall_axis=False, weight=0.0)
    xs, ys = lines["worker 1"]
    assert xs[:2] == [50.0, 100.0] and ys[:2] == [51.0, 101.0]
    assert lines["eval worker 0"] == ([400.0], [321.0])
    wall_xs, _ = model.return_lines(wall_axis=True, weight=0.0)["worker 0"]
    assert wall_xs[0] == 50.0  # seconds since the first event
    # one merge mark per round, however many workers report it; knob marks only for changes
    merges, knobs, labels = model.marks(wall_axis=False)
    assert merges == [300.0] and knobs == [320.0] and labels == ["knobs v1"]
    # a non-finite loss is not plotted
    assert model.loss_lines("total_loss", False, 0.0)["worker 0"] == ([200.0], [1.5])
    assert model.speed_lines(False)["worker 0"][1] == [9.5, 9.0]
    assert model.distance_lines(False)["worker 0"] == ([300.0], [0.5])
    assert model.errors[-1] == "showcase: could not load"


def test_each_processs_self_check_line_goes_to_the_log_once():
    """A pack's workers record the same line: the Log tab shows it once, and not as an error."""

    def check(worker, who, path="eager"):
        message = f"{who}: fast path: {path} ..."
        fields = dict(path=path, pack=2, bf16=False, asked="auto", sound=True, seconds=0.1)
        return SelfCheck(step=0, message=message, worker=worker, **fields)

    model = RunModel(workers=3)
    model.ingest([check(0, "workers 0, 1 (a pack)"), check(1, "workers 0, 1 (a pack)")])
    model.ingest([check(2, "worker 2", "compile")])
    assert list(model.notes) == [
        "workers 0, 1 (a pack): fast path: eager ...",
        "worker 2: fast path: compile ...",
    ]
    assert model.note_count == 2 and model.error_count == 0


def test_worker_rows_show_left_out_and_crashed_workers():
    model = RunModel(workers=3, control_worker=2)
    model.ingest(
        [
            Merge(
                worker=0,
                step=10,
                time=1.0,
                round=1,
                participants=(0,),
                left_out={1: "timed out"},
                distances={},
            )
        ]
    )
    progress = [
        dict(worker=0, state="training", step=10, steps_per_s=5.0, last_return=12.5, merges=1),
        dict(worker=1, state="training", step=9, steps_per_s=4.0, last_return=math.nan, merges=0),
        dict(worker=2, state="crashed", step=3, steps_per_s=0.0, last_return=1.0, merges=0),
    ]
    rows = model.worker_rows(progress)
    assert rows[0]["state"] == "training" and not rows[0]["problem"]
    assert rows[0]["return"] == "12.5" and rows[0]["speed"] == "5.0/s"
    assert rows[1]["state"] == "training, left out of merge" and rows[1]["problem"]
    assert rows[1]["return"] == "-"
    assert rows[2]["worker"] == "worker 2 (control)" and rows[2]["problem"]


def test_knob_rows_are_pending_until_every_worker_applied_the_request():
    model = RunModel(workers=2)
    progress = [dict(worker=0), dict(worker=1)]
    model.ingest(
        [
            KnobsApplied(
                worker=w,
                step=1,
                time=1.0,
                version=0,
                values={"horizon": 3, "iterations": 6},
            )
            for w in (0, 1)
        ]
    )
    rows = {r.name: r for r in model.knob_rows({"horizon": 5, "iterations": 6}, progress)}
    assert rows["horizon"].pending and rows["horizon"].applied_text == "now 3 (applying...)"
    assert not rows["iterations"].pending and rows["iterations"].applied_text == "now 6"
    model.ingest(
        [
            KnobsApplied(
                worker=0,
                step=2,
                time=2.0,
                version=1,
                values={"horizon": 5, "iterations": 6},
            )
        ]
    )
    row = model.knob_rows({"horizon": 5}, progress)[0]
    assert row.pending and row.applied_text == "now 3/5 (applying...)"
    model.ingest(
        [
            KnobsApplied(
                worker=1,
                step=2,
                time=2.0,
                version=1,
                values={"horizon": 5, "iterations": 6},
            )
        ]
    )
    assert not model.knob_rows({"horizon": 5}, progress)[0].pending


def test_startup_progress_through_seeding_and_pretraining():
    model = RunModel(workers=2, seed_steps=1000)
    assert model.startup([], 1000)[0] == 0.0
    starting = [dict(worker=0, state="starting", step=0), dict(worker=1, state="seeding", step=5)]
    assert "starting workers" in model.startup(starting, 1000)[1]
    seeding = [dict(worker=0, state="seeding", step=250), dict(worker=1, state="seeding", step=300)]
    fraction, text = model.startup(seeding, 1000)
    assert fraction == 0.25 and "250 / 1000" in text
    pretraining = [
        dict(worker=0, state="pretraining", step=999, updates=400),
        dict(worker=1, state="pretraining", step=999, updates=300),
    ]
    fraction, text = model.startup(pretraining, 1000)
    assert fraction == 0.3 and "pretraining" in text and "300 / 1000 updates" in text
    # while one worker still collects seed steps the bar shows those
    mixed = [pretraining[0], dict(worker=1, state="seeding", step=900)]
    assert "seed steps" in model.startup(mixed, 1000)[1]
    assert [r["state"] for r in model.worker_rows(pretraining)] == ["pretraining"] * 2
    assert model.startup([dict(worker=0, state="training", step=1200)], 1000) is None


def test_nearest_point_scales_by_visible_axes():
    lines = {"a": ([0.0, 1000.0], [0.0, 1.0]), "b": ([500.0], [0.9])}
    # with x spanning 1000 and y spanning 1, (480, 0.85) is nearest to b's point
    assert nearest_point(lines, 480.0, 0.85, 1000.0, 1.0) == ("b", 500.0, 0.9)
    assert nearest_point({"a": ([], [])}, 0.0, 0.0, 1.0, 1.0) is None


def test_axis_limits_fit_the_run_not_the_long_published_curve():
    run = {"worker 0": ([0.0, 5000.0], [300.0, 600.0])}
    published = {"published": ([0.0, 50_000.0, 100_000.0], [2.0, 800.0, 900.0])}
    (x_low, x_high), (y_low, y_high) = axis_limits(run, published)
    assert x_low == 0.0 and 5000.0 <= x_high < 6000.0
    assert y_low < 2.0  # the published start is within the x range
    assert y_high < 800.0  # its 50k-step value is not
    assert axis_limits({}, published) is None


def test_window_without_a_display_is_one_clear_error(tmp_path):
    """The window's entry with neither DISPLAY nor WAYLAND_DISPLAY: exit 2, `no display`, no
    traceback, nothing written. Only launch.py as a process without a display shows what Dear
    PyGui's start leaves on stderr."""
    env = {**os.environ, "TDMPC2_LIVE_NO_BOOTSTRAP": "1"}
    env.pop("DISPLAY", None)
    env.pop("WAYLAND_DISPLAY", None)
    out = subprocess.run(
        [sys.executable, "launch.py", "--run-dir", str(tmp_path / "run")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "no display" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()
