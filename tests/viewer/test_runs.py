"""How the window gets its run (viewer/runs.py), in-process and without starting a worker:
launch.py's flags parsed by the real parser (workers/cli/flags.py build_parser) into the
Namespace viewer/main.py hands initial_run. Bad flags fail at once with one UserError line and
write nothing; good flags give a callable that writes the run directory only when called (the
run it returns is not started: no process is spawned); --attach of a missing or not-a-run
directory fails at once, and of a run reads it only; --resume goes on with the run it names,
and the picker's resume_run and attach_run give the run they name. A missing run (or, to resume,
a torchrun job's) is refused at once, before the window would stop the run it shows for it."""

from pathlib import Path

import pytest
from conftest import TINY_FLAGS, tiny_config
from helpers.process_fakes import make_run

from agent.errors import UserError
from viewer.runs import attach_run, initial_run, resume_run
from workers.door import NewRun, Run, build_parser
from workers.run.attached import AttachedRun
from workers.rundir.settings import RunSettings, read_record


def flags(*args):
    """The Namespace viewer/main.py makes of these command-line arguments."""
    return build_parser().parse_args(list(args))


def files(path):
    """Every file under `path` with its bytes (what a read-only step must leave as it was)."""
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def a_run(path, workers=2):
    """A stopped run's directory, as a new run leaves it."""
    return make_run(path, tiny_config(), RunSettings(workers=workers, max_restarts=3))


@pytest.mark.parametrize(
    "bad, words",
    [
        (["--horizon", "0"], ["horizon must be in [1, 16]", "got 0"]),
        (["--task", "walker-fly"], ["unknown task 'walker-fly'"]),
        (["--pack", "0"], ["--pack must be at least 1"]),
        (["--workers", "2", "--lane=iterations=1"], ["at least 2 lanes"]),
        (["--device", "cpu", "--fast-path", "graphs"], ["--fast-path graphs compiles for CUDA"]),
        (["--load", "{tmp}/none.pt"], ["none.pt"]),
        (["--resume", "{tmp}/old", "--pack", "2"], ["--pack is chosen when a run starts"]),
        (["--resume", "{tmp}/old", "--load", "w.pt"], ["--load starts a new run"]),
        (["--attach", "{tmp}/old"], ["{tmp}/old is not a multi-worker run directory"]),
    ],
    ids=[
        "range",
        "task",
        "pack",
        "lanes",
        "fast-path",
        "load",
        "resume-pack",
        "resume-load",
        "attach",
    ],
)
def test_bad_flags_fail_at_once_in_one_line_and_write_nothing(tmp_path, bad, words):
    args = [arg.format(tmp=tmp_path) for arg in bad]
    with pytest.raises(UserError) as refused:
        initial_run(flags(*TINY_FLAGS, "--run-dir", str(tmp_path / "run"), *args))
    message = str(refused.value)
    assert message and "\n" not in message
    for word in words:
        assert word.format(tmp=tmp_path) in message
    assert list(tmp_path.iterdir()) == []


def test_good_flags_write_the_run_directory_only_when_the_callable_is_called(tmp_path):
    path = tmp_path / "run"
    make = initial_run(
        flags(*TINY_FLAGS, "--workers", "3", "--max-restarts", "5", "--run-dir", str(path))
    )
    assert list(tmp_path.iterdir()) == []
    new = make.__self__  # NewRun.create: the run the flags ask for, checked
    assert isinstance(new, NewRun) and make == new.create
    assert new.path == path and new.cfg.task == "cartpole-balance" and new.cfg.mlp_dim == 32

    run = make()
    try:
        assert isinstance(run, Run) and run.path == path and not run.resumed
        assert not run.workers.started and run.workers.pids() == []  # the window starts it
        cfg, settings = read_record(path)
        assert cfg == run.cfg and cfg.mlp_dim == 32 and cfg.batch_size == 16
        assert (settings.workers, settings.max_restarts) == (3, 5)
        with pytest.raises(UserError, match="already holds a run"):
            make()  # a second call never writes over the first run
    finally:
        run.stop()


def test_attach_of_a_directory_that_is_not_a_run_fails_at_once_and_leaves_it_as_it_was(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="is not a multi-worker run directory"):
        initial_run(flags("--attach", str(tmp_path)))
    assert files(tmp_path) == {Path("notes.txt"): b"mine"}


def test_attach_of_a_damaged_run_fails_at_once_naming_the_file(tmp_path):
    path = a_run(tmp_path / "run")
    (path / "run.json").write_text("{not json")
    with pytest.raises(UserError, match="run.json is damaged"):
        initial_run(flags("--attach", str(path)))


def test_attach_of_a_run_reads_it_only(tmp_path):
    path = a_run(tmp_path / "run", workers=3)
    before = files(path)
    make = initial_run(flags("--attach", str(path)))
    assert files(path) == before
    run = make()
    assert isinstance(run, AttachedRun) and run.path == path
    assert run.settings.workers == 3
    assert files(path) == before


def test_resume_goes_on_with_the_run_it_names_and_the_flags_it_is_given(tmp_path):
    path = a_run(tmp_path / "run")
    before = files(path)
    make = initial_run(flags("--resume", str(path), "--max-restarts", "7", "--steps", "900"))
    assert files(path) == before
    run = make()
    try:
        assert isinstance(run, Run) and run.path == path and run.resumed
        assert not run.workers.started
        assert run.settings.max_restarts == 7 and run.cfg.steps == 900
        assert read_record(path)[0].steps == 900  # the new total is the run's from now on
    finally:
        run.stop()


def test_the_pickers_resume_and_attach_give_the_run_they_name(tmp_path):
    path = a_run(tmp_path / "run")
    resumed = resume_run(str(path))()
    try:
        assert isinstance(resumed, Run) and resumed.resumed and resumed.path == path
        assert not resumed.workers.started
    finally:
        resumed.stop()
    attached = attach_run(str(path))()
    assert isinstance(attached, AttachedRun) and attached.path == path


def make_missing(how, path):
    if how == "--resume":
        return initial_run(flags("--resume", str(path)))
    return {"resume_run": resume_run, "attach_run": attach_run}[how](str(path))


@pytest.mark.parametrize("how", ["--resume", "resume_run", "attach_run"])
def test_a_missing_run_is_refused_by_the_time_it_is_opened_and_nothing_is_made(tmp_path, how):
    missing = tmp_path / "gone"
    with pytest.raises(UserError) as refused:
        make_missing(how, missing)()  # (at once, as promised, or when opened)
    assert (
        str(refused.value)
        == f"{missing} is not a multi-worker run directory (no config.json or run.json)"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("how", ["--resume", "resume_run", "attach_run"])
def test_a_missing_run_is_refused_at_once(tmp_path, how):
    with pytest.raises(UserError, match="is not a multi-worker run directory"):
        make_missing(how, tmp_path / "gone")


@pytest.mark.parametrize("how", ["--resume", "resume_run"])
def test_a_torchrun_jobs_run_is_refused_at_once_and_left_as_it_was(tmp_path, how):
    """Only the same torchrun line resumes a job's run: the window refuses it before it would
    stop the run it shows, and writes nothing into it."""
    path = make_run(tmp_path / "job", tiny_config(), RunSettings(workers=2, ranks=2))
    before = files(path)
    with pytest.raises(UserError, match="torchrun job's run \\(2 ranks"):
        make_missing(how, path)
    assert files(path) == before
