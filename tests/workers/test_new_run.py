"""A run from the flags, the window's start-up or its new-run dialog: one builder, so the same
choices give the same run, checked before anything is written."""

import pytest
from conftest import TINY_FLAGS
from conftest import tiny_run as tiny

from agent.config import Config
from agent.errors import ConfigError, UserError
from workers.cli.new_run import lanes_from_args, new_run_from_args, workers_from_args
from workers.cli.presets import PIXEL_BUFFER
from workers.door import (
    CPU_PLANNING,
    Lane,
    Run,
    RunSettings,
    build_parser,
    demo_preset,
    new_run_from_dialog,
    resume_from_args,
    window_run_from_args,
)
from workers.rundir.lanes import CONTROL

DIALOG = dict(
    task="cartpole-balance",
    model_size=1,
    workers=3,
    merge_every=500,
    control_worker=False,
    device="cpu",
    cpu_planning=True,
)


def test_the_dialog_starts_the_run_its_fields_ask_for_training_until_stopped(tmp_path):
    new = new_run_from_dialog(**DIALOG, run_dir=str(tmp_path / "r"))
    assert new.path == tmp_path / "r" and not new.path.exists()  # nothing written yet
    assert (new.cfg.task, new.cfg.device, new.cfg.steps) == ("cartpole-balance", "cpu", 10**7)
    assert all(getattr(new.cfg, k) == v for k, v in CPU_PLANNING.items())
    assert (new.settings.workers, new.settings.merge_every, new.lanes) == (3, 500, None)
    # what the dialog does not ask: as a run from flags, the run's own defaults
    assert new.settings.max_restarts == RunSettings.max_restarts
    assert new.settings.checkpoint_every == RunSettings.checkpoint_every
    planned = new_run_from_dialog(**{**DIALOG, "cpu_planning": False}, run_dir=None)
    assert planned.cfg.num_samples == Config.num_samples
    assert planned.path.parts[0] == "runs"


def test_the_dialogs_pixel_run_learns_from_rgb_with_a_buffer_that_fits(tmp_path):
    new = new_run_from_dialog(**DIALOG, run_dir=str(tmp_path / "r"), obs="rgb")
    assert new.cfg.obs == "rgb" and new.cfg.buffer_size == PIXEL_BUFFER
    assert not new.path.exists()
    # From the flags a run's --steps bounds its buffer as for states; --buffer-size wins.
    args = build_parser().parse_args(["--obs", "rgb", "--steps", "5000", "--buffer-size", "3000"])
    assert new_run_from_args(args).cfg.buffer_size == 3000
    assert new_run_from_dialog(**DIALOG, run_dir=None).cfg.buffer_size == Config.buffer_size


def test_the_dialogs_control_worker_and_lanes_count_as_the_flags_do():
    control = new_run_from_dialog(**{**DIALOG, "control_worker": True}, run_dir=None)
    assert control.settings.workers == 4 and control.lanes == [Lane(), CONTROL]
    # every lane sized: their sum is the run's workers, whatever the workers field says
    sized = new_run_from_dialog(**DIALOG, run_dir=None, lanes="workers=2; workers=1,merge=off")
    assert sized.settings.workers == 3 and [lane.size for lane in sized.lanes] == [2, 1]
    shared = new_run_from_dialog(**{**DIALOG, "workers": 4}, run_dir=None, lanes="horizon=3;")
    assert shared.settings.workers == 4 and shared.lanes == [Lane({"horizon": 3}), Lane()]
    sized = new_run_from_dialog(**DIALOG, run_dir=None, lanes="workers=2;workers=1", replicas=3)
    assert sized.settings.workers == 9 and sized.settings.replicas == 3  # 3 x (2 + 1)
    copies = new_run_from_dialog(
        **{**DIALOG, "workers": 9}, run_dir=None, lanes="workers=2;", replicas=3
    )
    assert copies.settings.workers == 9  # the unsized lane's 3 copies share the 3 left
    controls = new_run_from_dialog(
        **{**DIALOG, "workers": 4, "control_worker": True}, replicas=2, run_dir=None
    )
    assert controls.settings.workers == 6 and controls.lanes == [Lane(), CONTROL]  # 4 + 2
    with pytest.raises(ConfigError, match="do not split into 2 equal replicas"):  # 3 + 2
        new_run_from_dialog(**{**DIALOG, "control_worker": True}, replicas=2, run_dir=None)


def test_the_dialog_refuses_replicas_below_one_or_without_a_race():
    with pytest.raises(UserError, match="--replicas must be at least 1"):
        new_run_from_dialog(**DIALOG, run_dir=None, lanes="workers=1;workers=1", replicas=0)
    with pytest.raises(UserError, match="copies a race's lanes"):
        new_run_from_dialog(**DIALOG, run_dir=None, replicas=2)


def test_the_dialog_refuses_a_bad_lane_or_lanes_that_do_not_fit_naming_the_lane():
    with pytest.raises(ConfigError, match="lane 1"):
        new_run_from_dialog(**DIALOG, run_dir=None, lanes="horizon=3; horizon=99")
    with pytest.raises(UserError, match="workers"):
        new_run_from_dialog(**DIALOG, run_dir=None, lanes="workers=3; horizon=2")


def test_the_window_opens_on_the_demo_with_the_demos_workers_unless_the_flags_say():
    demo = demo_preset("cpu")
    bare = window_run_from_args(build_parser().parse_args(["--device", "cpu"]))
    assert (bare.cfg.task, bare.settings.workers) == (demo.task, demo.workers)
    assert bare.settings.merge_every == demo.merge_every
    flags = window_run_from_args(build_parser().parse_args(TINY_FLAGS))
    assert flags.cfg.task == "cartpole-balance" and flags.settings.workers == demo.workers
    told = window_run_from_args(build_parser().parse_args([*TINY_FLAGS, "--workers", "1"]))
    assert told.settings.workers == 1


def test_a_resumed_run_takes_threads_and_restarts_from_the_flags_else_keeps_its_own(tmp_path):
    Run.create(tmp_path / "r", tiny(100), RunSettings(workers=1, max_restarts=5))
    kept = resume_from_args(build_parser().parse_args(["--resume", str(tmp_path / "r")]))
    assert (kept.settings.threads_per_worker, kept.settings.max_restarts) == (0, 5)
    args = ["--resume", str(tmp_path / "r"), "--threads", "1", "--max-restarts", "0"]
    given = resume_from_args(build_parser().parse_args(args))
    assert (given.settings.threads_per_worker, given.settings.max_restarts) == (1, 0)


def test_the_merge_timeout_is_a_flag_in_range_and_a_resumed_run_keeps_its_own(tmp_path):
    """--merge-timeout sets how long a merge round waits for the others (run.json's
    merge_timeout_s, 30 s without it); above 0 and at most an hour, else refused in one line;
    a resumed run keeps its own unless given."""
    parse = build_parser().parse_args
    flags = [*TINY_FLAGS, "--run-dir", str(tmp_path / "r")]
    assert window_run_from_args(parse(flags)).settings.merge_timeout_s == 30.0
    new = window_run_from_args(parse([*flags, "--merge-timeout", "600"]))
    assert new.settings.merge_timeout_s == 600.0
    for bad in ("0", "-5", "3601", "nan", "inf"):
        with pytest.raises(UserError, match="--merge-timeout must be above 0 and at most 3600"):
            window_run_from_args(parse([*flags, "--merge-timeout", bad]))
    with pytest.raises(ConfigError, match="merge_timeout_s must be in"):
        RunSettings(merge_timeout_s=0)
    new.create()
    kept = resume_from_args(parse(["--resume", str(tmp_path / "r")]))
    assert kept.settings.merge_timeout_s == 600.0
    given = resume_from_args(parse(["--resume", str(tmp_path / "r"), "--merge-timeout", "45"]))
    assert given.settings.merge_timeout_s == 45.0


def test_a_torchrun_rank_refuses_to_serve_the_outer_step_and_a_merge_timeout(monkeypatch):
    """A rank's process never serves (it would serve only its own part of the job)."""
    from workers.cli.new_run import check_run_flags

    args = build_parser().parse_args(["--headless", "--serve", "0"])
    check_run_flags(args)  # one machine: served
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match="launch.py serve RUN_DIR on rank 0's machine"):
        check_run_flags(args)
    # Nor takes the outer step, whose state is the run directory's merge pool's.
    check_run_flags(build_parser().parse_args(["--headless", "--merge-pull", "0.1"]))
    with pytest.raises(UserError, match="outer step is not for a torchrun job yet"):
        check_run_flags(build_parser().parse_args(["--headless", "--outer-momentum", "0.9"]))
    # Nor a merge timeout: its ranks wait in the collective, whose timeout is the job's.
    with pytest.raises(UserError, match="--merge-timeout is for workers that merge through"):
        check_run_flags(build_parser().parse_args(["--headless", "--merge-timeout", "60"]))


def test_lanes_without_workers_give_each_lane_without_a_size_one_worker():
    """`--lane A --lane B` without --workers is a race of one worker a lane (as a person
    means it; it was "2 lanes need at least 2 workers"), times the replicas; a sized lane
    takes its size; --workers, when given, counts them all as before."""

    def workers(*flags):
        args = build_parser().parse_args(["--headless", *flags])
        return workers_from_args(args, lanes_from_args(args), 1)

    assert workers("--lane", "iterations=1", "--lane", "iterations=2") == 2
    assert workers("--lane", "iterations=1", "--lane", "iterations=2", "--replicas", "3") == 6
    assert workers("--lane", "workers=2", "--lane", "iterations=2") == 3
    assert workers("--lane", "iterations=1", "--lane", "iterations=2", "--workers", "4") == 4
    assert workers("--control-worker", "--workers", "2") == 3  # the run's lane keeps its 2
