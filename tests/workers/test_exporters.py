"""The metrics mirrors: TensorBoard event files read back with TensorBoard's own reader,
the authors' eval.csv, a sink that fails, and --wandb refused without the package."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_run
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from workers.run.owner import Run, RunSettings
from workers.rundir.directory import RunDir
from workers.rundir.lanes import Lane
from workers.rundir.records import (
    Checkpoint,
    Episode,
    Eval,
    Merge,
    Record,
    Stop,
    Train,
    record_from_json,
)
from workers.rundir.sinks import attach_exporters, scalars
from workers.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def one_thread():
    """In-process runs on one torch thread: on a shared 2-core machine two threads can make an
    update tens of times slower (issue 12), and these tests check logs, not speed."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny(steps: int, **overrides):
    """tiny_run with an evaluation every 100 steps, so there are eval records to export."""
    return tiny_run(steps, **{"eval_every": 100, **overrides})


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar curve in a TensorBoard directory, as TensorBoard itself reads it."""
    reader = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0: keep all
    reader.Reload()
    return {
        tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]
    }


def records(path: Path, kind: type[Record]) -> list[Record]:
    return RunDir(path.parent, metrics=path.name).read_metrics(kind)


def read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def test_headless_run_mirrors_returns_into_tensorboard_and_eval_csv(tmp_path):
    cfg = tiny(200)
    run = RunDir.create(tmp_path / "run")
    attach_exporters(run, cfg)
    # log_every_s=0: a "train" record after every update burst, so losses are mirrored too.
    Trainer(cfg, run, progress=False, log_every_s=0).run()

    metrics = tmp_path / "run" / "metrics.jsonl"
    curves = tensorboard_scalars(tmp_path / "run" / "tb")
    repeat = cfg.action_repeat  # the x axis is env steps: agent steps x action repeat
    episodes, evals = records(metrics, Episode), records(metrics, Eval)
    assert len(episodes) == 4 and len(evals) == 2  # 200 steps of 50; evals at 100 and 200
    for tag, logged in (("episode/return", episodes), ("eval/return", evals)):
        assert [s for s, _ in curves[tag]] == [r.step * repeat for r in logged]
        # TensorBoard stores float32.
        assert [v for _, v in curves[tag]] == pytest.approx([r.ret for r in logged], rel=1e-6)
    train = records(metrics, Train)
    assert train and len(curves["train/value_loss"]) == len(train)
    assert [v for _, v in curves["train/pi_loss"]] == pytest.approx(
        [r.losses["pi_loss"] for r in train], rel=1e-5
    )
    assert "train/steps_per_s" in curves and "train/updates" in curves

    # eval.csv: the authors' columns, step in env steps, one row per evaluation.
    header, rows = read_csv(tmp_path / "run" / "eval.csv")
    assert header == ["step", "episode_reward"]
    assert [int(r["step"]) for r in rows] == [e.step * repeat for e in evals] == [200, 400]
    assert [float(r["episode_reward"]) for r in rows] == [e.ret for e in evals]


def test_unwritable_tensorboard_dir_warns_once_and_the_run_goes_on(tmp_path, capsys):
    cfg = tiny(100, eval_every=0)
    run = RunDir.create(tmp_path / "run")
    (tmp_path / "run" / "tb").write_text("a file where the TensorBoard folder would go")
    attach_exporters(run, cfg)
    summary = Trainer(cfg, run, progress=False).run()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: cannot write TensorBoard"), lines
    assert "the run goes on" in lines[0]
    assert summary["steps"] == 100 and not summary["interrupted"]
    assert records(tmp_path / "run" / "metrics.jsonl", Stop)[0].reason == "done"
    _, rows = read_csv(tmp_path / "run" / "eval.csv")  # the other exporters still work
    assert [int(r["step"]) for r in rows] == [200]


def test_a_failing_sink_is_dropped_with_one_warning_and_logging_goes_on(tmp_path, capsys):
    class DiskFull:
        writes = 0

        def write(self, record):
            self.writes += 1
            raise OSError(28, "No space left on device")

        def close(self):
            pass

    run = RunDir.create(tmp_path / "run")
    sink = DiskFull()
    run.sinks.append(sink)
    for step in range(3):
        run.log(Episode(step=step, ret=1.0, length=1))
    run.close()
    assert sink.writes == 1 and run.sinks == []
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "DiskFull stopped" in lines[0] and "No space" in lines[0]
    assert len(run.read_metrics(Episode)) == 3


def test_records_without_curves_export_nothing():
    assert scalars(Checkpoint(step=5, path="x")) == {}
    assert scalars(Stop(step=5, reason="done")) == {}
    # A non-finite loss is logged as null in the JSONL: no point, rather than a NaN spike.
    line = {"kind": "train", "step": 5, "updates": 3, "steps_per_s": 9.0}
    train = record_from_json({**line, "losses": {"value_loss": None, "pi_loss": 2}})
    assert scalars(train) == {"train/pi_loss": 2.0, "train/updates": 3.0, "train/steps_per_s": 9.0}
    # A train record written before losses had a field of their own reads the same.
    old = record_from_json({**line, "value_loss": None, "pi_loss": 2})
    assert old.losses.keys() == {"value_loss", "pi_loss"} and scalars(old) == scalars(train)


def test_workers_write_one_tensorboard_dir_and_eval_csv_each(tmp_path):
    """Two spawned workers of a real run each write their own TensorBoard folder and eval CSV,
    point for point with their JSONL records: only the worker processes show each exporter opened
    and flushed where its worker runs."""
    settings = RunSettings(workers=2, merge_every=100, checkpoint_every=10_000)
    run = Run.create(tmp_path / "run", tiny(200), settings)
    run.start()
    run.workers.wait()
    assert [w["state"] for w in run.workers.progress()] == ["done", "done"]
    for k in (0, 1):
        log = tmp_path / "run" / f"worker-{k}.jsonl"
        curves = tensorboard_scalars(tmp_path / "run" / "tb" / f"worker-{k}")
        episodes, evals = records(log, Episode), records(log, Eval)
        assert [s for s, _ in curves["episode/return"]] == [2 * e.step for e in episodes]
        assert [v for _, v in curves["eval/return"]] == pytest.approx([e.ret for e in evals])
        merges = records(log, Merge)
        assert merges and len(curves["merge/ms"]) == len(merges)
        assert len(curves["merge/distance"]) == len(merges)
        _, rows = read_csv(tmp_path / "run" / f"eval-worker-{k}.csv")
        assert [(int(r["step"]), float(r["episode_reward"])) for r in rows] == [
            (2 * e.step, e.ret) for e in evals
        ]
    # The choice is part of the run's settings, so a resumed run keeps it.
    assert json.loads((tmp_path / "run" / "run.json").read_text())["tensorboard"] is True


def test_no_tensorboard_is_kept_by_a_resumed_run(tmp_path):
    settings = RunSettings(workers=1, tensorboard=False)
    Run.create(tmp_path / "run", tiny(100), settings)
    assert Run.resume(tmp_path / "run").settings.tensorboard is False


def launch(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TDMPC2_LIVE_NO_BOOTSTRAP": "1", "OMP_NUM_THREADS": "1"}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]])
def test_wandb_without_the_package_is_refused_before_training(tmp_path, workers):
    # Whether or not wandb is installed here: a module of that name that fails to import.
    """--wandb where the wandb module fails to import (a stub on PYTHONPATH), one worker and two:
    one line, exit 2, nothing written. Only launch.py as a process with that PYTHONPATH shows the
    package checked before the run directory."""
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "wandb.py").write_text("raise ImportError('No module named wandb')\n")
    result = launch(
        "--headless",
        "--task",
        "cartpole-balance",
        "--model-size",
        "1",
        "--steps",
        "100",
        *workers,
        "--wandb",
        "--run-dir",
        str(tmp_path / "run"),
        env_extra={"PYTHONPATH": str(stub)},
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --wandb needs the wandb package"), lines
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_no_tensorboard_flag_of_the_headless_command(tmp_path):
    """--no-tensorboard through the headless command: no tb folder, the eval CSV still written.
    Only a real headless run shows the flag reaching the worker process."""
    small = ["--task", "cartpole-balance", "--model-size", "1", "--device", "cpu", "--quiet"]
    planning = ["--num-samples", "16", "--num-elites", "4", "--num-pi-trajs", "2"]
    short = ["--episode-length", "50", "--seed-steps", "100", "--eval-episodes", "1"]
    flags = [*small, *planning, *short, "--iterations", "1", "--steps", "60"]
    result = launch("--headless", *flags, "--no-tensorboard", "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "run" / "tb").exists()
    header, rows = read_csv(tmp_path / "run" / "eval-worker-0.csv")
    assert header == ["step", "episode_reward"] and [r["step"] for r in rows] == ["120"]


def test_a_race_keeps_its_lanes_apart_in_tensorboard_and_the_eval_csvs(tmp_path):
    """A race of two lanes: each spawned worker writes under its lane's TensorBoard folder and
    eval CSV with its lane's knob values. Only real worker processes show each one knowing its
    lane when it opens its exporters."""
    settings = RunSettings(workers=2, merge_every=100, checkpoint_every=10_000)
    lanes = [Lane({"iterations": 1}), Lane({"iterations": 2})]
    run = Run.create(tmp_path / "run", tiny(150), settings, lanes=lanes)
    run.start()
    run.workers.wait()
    for k in (0, 1):
        log = tmp_path / "run" / f"worker-{k}.jsonl"
        curves = tensorboard_scalars(tmp_path / "run" / "tb" / f"lane-{k}" / f"worker-{k}")
        assert [s for s, _ in curves["episode/return"]] == [
            2 * e.step for e in records(log, Episode)
        ]
        assert curves["knobs/iterations"][-1][1] == k + 1
        _, rows = read_csv(tmp_path / "run" / f"eval-lane-{k}-worker-{k}.csv")
        assert rows and [float(r["episode_reward"]) for r in rows] == [
            e.ret for e in records(log, Eval)
        ]
