"""A run directory is data, never code: a `module:Id` task read from one (resumed, attached,
made into a montage, connected) imports nothing unless the person names it again, and even
then never a module that lies in a run directory (as `runs.X.evil` would, the folder runs/
beside launch.py being on Python's path); the working directory is put on the path only for
a task a person named."""

import json
import subprocess
import sys

import pytest
from conftest import launch, tiny_run

from agent.envs.gym import gym_spec
from agent.envs.named import NAMED_MODULES, name_task
from agent.errors import UserError
from workers.run.owner import Run, RunSettings, resumable

EVIL = "import pathlib, os; pathlib.Path(os.environ['MARKER']).write_text('ran')\n"


def planted_run(folder, task: str):
    """A run made here, then its task changed to `task` and an evil.py put beside its records:
    what someone else's run directory may hold."""
    run = Run.create(folder, tiny_run(100), RunSettings(workers=2, pack=1))
    config = json.loads((run.path / "config.json").read_text())
    config["config"]["task"] = task
    (run.path / "config.json").write_text(json.dumps(config))
    (run.path / "evil.py").write_text(EVIL)
    return run.path


def launch_unnamed(*args: str, cwd, marker) -> subprocess.CompletedProcess:
    """launch.py in a process where no module was named before."""
    return launch(*args, cwd=cwd, env={"MARKER": str(marker)}, drop=(NAMED_MODULES,))


@pytest.fixture
def nothing_named(monkeypatch):
    monkeypatch.delenv(NAMED_MODULES, raising=False)


def test_resume_and_montage_of_a_run_naming_a_module_refuse_in_one_line(tmp_path):
    marker = tmp_path / "marker"
    path = planted_run(tmp_path / "runs" / "r1", "runs.r1.evil:Evil-v0")
    for args in (["--headless", "--resume", str(path)], ["montage", str(path)]):
        result = launch_unnamed(*args, cwd=tmp_path, marker=marker)
        assert result.returncode == 2, (args, result.stderr)
        assert "a run directory is data" in result.stderr and "--task" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert not marker.exists()
    # Named again, the module is still refused: it lies in a run directory.
    named = ["--headless", "--resume", str(path), "--task", "runs.r1.evil:Evil-v0"]
    result = launch_unnamed(*named, cwd=tmp_path, marker=marker)
    assert result.returncode == 2 and "lies in a run directory" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not marker.exists()


def test_attaching_refuses_an_unnamed_module_and_imports_nothing(
    tmp_path, monkeypatch, nothing_named
):
    marker = tmp_path / "marker"
    monkeypatch.setenv("MARKER", str(marker))
    path = planted_run(tmp_path / "r1", "evil:Evil-v0")
    monkeypatch.chdir(path)  # the working directory holds evil.py
    with pytest.raises(UserError, match="a run directory is data"):
        Run.attach(path)
    with pytest.raises(UserError, match="a run directory is data"):
        gym_spec("evil:Evil-v0")  # the backstop in every process that makes an env
    assert str(path) not in sys.path and not marker.exists()


def test_ones_own_run_with_a_named_module_resumes(tmp_path, monkeypatch, nothing_named):
    """Resuming one's own run with a custom env stays one line: the task named again (or
    TDMPC2_LIVE_MODULES), and its module, outside any run directory, imports."""
    run = Run.create(
        tmp_path / "mine",
        tiny_run(100, task="helpers.slide_env:Slide-v0"),
        RunSettings(workers=2, pack=1),
    )
    monkeypatch.delenv(NAMED_MODULES)  # a later session: Run.create named it in this one
    with pytest.raises(UserError, match="--task helpers.slide_env:Slide-v0"):
        resumable(run.path)
    name_task("helpers.slide_env:Slide-v0")
    cfg, _ = resumable(run.path)
    assert cfg.task == "helpers.slide_env:Slide-v0" and gym_spec(cfg.task).id == "Slide-v0"


def test_a_crafted_task_prints_no_escape_sequence(tmp_path):
    marker = tmp_path / "marker"
    # A DMControl task too: a name with control characters is no task (the review's variant)
    path = planted_run(tmp_path / "r1", "\x1b]0;PWNED\x07\x1b[2J\x1b[31mcartpole-balance")
    for args in (["--headless", "--resume", str(path)], ["montage", str(path)]):
        result = launch_unnamed(*args, cwd=tmp_path, marker=marker)
        assert result.returncode == 2 and "printable" in result.stderr, result.stderr
        assert "\x1b" not in result.stderr and "\x07" not in result.stderr


def test_a_crafted_record_is_refused_in_one_line_not_obeyed(tmp_path):
    """A run directory someone else made cannot make this machine build a model of billions of
    weights, scan millions of removed workers at every look, or recurse without end."""
    from workers.rundir.knob_record import KnobStore
    from workers.rundir.settings import read_record

    path = planted_run(tmp_path / "r1", "cartpole-balance")
    config = json.loads((path / "config.json").read_text())
    good = dict(config["config"])
    config["config"].update(mlp_dim=16384, enc_dim=16384, latent_dim=16384, num_q=64)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="billion weights"):
        read_record(path)
    (path / "config.json").write_text(json.dumps({"config": good}))
    settings = json.loads((path / "run.json").read_text())
    (path / "run.json").write_text(json.dumps({**settings, "removed": list(range(100_000))}))
    with pytest.raises(UserError, match="removed must name each"):
        read_record(path)
    (path / "run.json").write_text(json.dumps(settings))
    (path / "knobs.json").write_text("[" * 100_000)
    with pytest.raises(UserError, match="nested too deep"):
        KnobStore(path).read_record()
    (path / "config.json").write_text("[" * 100_000)
    with pytest.raises(UserError, match="nested too deep"):
        read_record(path)
    config["config"] = {**good, "task": "\x1b[31mcartpole-balance"}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="printable"):
        read_record(path)
