"""The command line end to end, in subprocesses, as a user would run it."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_FLAGS, launch, start_program

ROOT = Path(__file__).resolve().parents[2]
TINY = [*TINY_FLAGS, "--quiet"]


def batch(argvs: list[list[str]]) -> subprocess.CompletedProcess:
    """Every argv given to launch.py's program in one process (tests/helpers/cli_batch.py)."""
    env = {**os.environ, "TDMPC2_LIVE_NO_BOOTSTRAP": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "helpers" / "cli_batch.py")],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return result


def assert_clean_error(result, *words):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


BAD_INPUT = [
    (["--task", "walker-fly"], ["unknown task", "walker-walk"]),
    (["--task", "CartPole-v1"], ["needs continuous Box actions", "Discrete(2)"]),
    (["--task", "no_such_pkg:Arm-v0"], ["cannot import 'no_such_pkg'"]),
    (["--task", "Hopper-v5", "--env-kwargs", "[1]"], ["env_kwargs must be a JSON object"]),
    (["--task", "Hopper-v5", "--env-kwargs", '{"wings": 2}'], ["Hopper-v5", "wings"]),
    (["--model-size", "3"], ["model_size", "1, 5, 19, 48"]),
    (["--horizon", "0"], ["horizon", "[1, 16]"]),
    (["--updates-per-step", "0"], ["updates_per_step", "[1, 16]"]),
    (["--merge-pull", "0"], ["merge_pull", "[0.001, 1]"]),
    (["--outer-lr", "-1"], ["outer_lr", "[0.01, 2]"]),
    (["--outer-momentum", "1"], ["outer_momentum", "[0, 0.99]"]),
    (["--lane", "bf16=maybe", "--lane", ""], ["bf16 must be on or off", "'maybe'"]),
    (["--num-samples", "99999"], ["num_samples"]),
    (["--steps", "0"], ["steps"]),
    (["--steps", "-5"], ["steps"]),
    (["--fast-path", "bogus"], ["fast_path must be auto, graphs, compile or eager", "bogus"]),
    (["--device", "cpu", "--fast-path", "graphs"], ["--fast-path graphs", "auto", "eager"]),
    (["--replicas", "0", "--lane=iterations=1", "--lane="], ["--replicas must be at least 1"]),
    (["--replicas", "3"], ["--replicas copies a race's lanes", "--lane"]),
    (
        ["--workers", "5", "--lane=workers=2", "--lane=workers=1", "--replicas", "2"],
        ["times 2 replicas 6, and the run has 5", "--workers must be"],
    ),
    (
        ["--device", "cuda"] if not os.path.exists("/dev/nvidia0") else ["--device", "tpu"],
        ["device"],
    ),
]


@pytest.fixture(scope="module")
def bad_input(tmp_path_factory):
    """Each of BAD_INPUT's argv given to launch.py's program in one process (tests/helpers/
    cli_batch.py): one interpreter start for all of them, not one each."""
    base = tmp_path_factory.mktemp("bad")
    argvs = [
        ["--headless", *args, "--run-dir", str(base / f"r{i}")]
        for i, (args, _) in enumerate(BAD_INPUT)
    ]
    results = json.loads(batch(argvs).stdout)
    return [
        subprocess.CompletedProcess(argv, code, "", err)
        for argv, (code, err) in zip(argvs, results)
    ]


@pytest.mark.parametrize("case", range(len(BAD_INPUT)), ids=lambda i: " ".join(BAD_INPUT[i][0]))
def test_bad_input_gives_one_clear_error(bad_input, case):
    """Bad flags: exit code 2 and one `error:` line, no traceback. What a terminal gets at
    import is the real processes' of test_bad_input_in_a_process_prints_nothing_else."""
    assert_clean_error(bad_input[case], *BAD_INPUT[case][1])
    assert not Path(bad_input[case].args[-1]).exists()  # nothing written


def test_bad_input_in_a_process_prints_nothing_else(tmp_path):
    """Only launch.py run as a process shows what a user's terminal gets for bad input: exit code
    2 and one `error:` line on stderr, no traceback, nothing else printed at import."""
    args, words = BAD_INPUT[0]
    assert_clean_error(launch("--headless", *args, "--run-dir", str(tmp_path / "run")), *words)


def test_a_users_env_module_that_raises_at_import_is_one_line(tmp_path):
    """A user's env module is found from the folder the program starts in, and its error at
    import (a RuntimeError, not an ImportError) is named in one line: only a process started in
    that folder shows the import path and stderr."""
    result = launch(
        "--headless",
        "--task",
        "helpers.broken_env:Rail-v0",
        "--run-dir",
        str(tmp_path / "r"),
        cwd=ROOT / "tests",
    )
    assert_clean_error(result, "'helpers.broken_env'", "RuntimeError: the rail's length is not")
    assert not (tmp_path / "r").exists()


BAD_LANES = [
    (["speed=2", "iterations=2"], ["'speed' is not a live knob"]),
    (["iterations=99", "iterations=2"], ["lane 0", "iterations must be in [1, 32]"]),
    (["iterations=", "iterations=2"], ["iterations must be a number"]),
    (["iterations", "iterations=2"], ["not KEY=VALUE"]),
    (["iterations=1", "iterations=2", "iterations=3"], ["3 lanes need at least 3"]),
    (["iterations=1"], ["at least 2 lanes"]),
    (["num_elites=64", "iterations=2"], ["num_elites"]),
    (["workers=2", "workers=1,merge=off"], ["add up to 3 workers and the run has 2"]),
    (["workers=0", "iterations=2"], ["workers must be a whole number of at least 1"]),
    (["merge=maybe", "iterations=2"], ["merge must be on or off, got 'maybe'"]),
]


def test_bad_lanes_are_one_clear_error_each_and_write_nothing(tmp_path):
    """Bad --lane values: exit 2 and one line, and no run directory left behind: its start-up
    checks come before its first write (one process for all of them, tests/helpers/cli_batch.py;
    the first also as a process of its own)."""
    argvs = [
        ["--headless", *TINY, "--workers", "2", *(f"--lane={lane}" for lane in lanes)]
        for lanes, _ in BAD_LANES
    ]
    runs = [tmp_path / f"r{i}" for i in range(len(argvs))]
    results = json.loads(batch([[*a, "--run-dir", str(r)] for a, r in zip(argvs, runs)]).stdout)
    for (code, err), (_, words) in zip(results, BAD_LANES):
        assert_clean_error(subprocess.CompletedProcess([], code, "", err), *words)
    assert_clean_error(launch(*argvs[0], "--run-dir", str(runs[0])), *BAD_LANES[0][1])
    assert not list(tmp_path.iterdir())


def test_the_merging_experiment_is_one_command_whose_lanes_give_the_workers(tmp_path):
    """--lane workers=2 --lane workers=1,merge=off without --workers: 3 workers in lanes of 2 and
    1, the second never merging (--control-worker in short). Only a whole headless run shows the
    workers spawned and the race printed at its end."""
    lanes = ["--lane=workers=2", "--lane=workers=1,merge=off"]
    run = tmp_path / "r"
    result = launch("--headless", *TINY, *lanes, "--steps", "60", "--run-dir", str(run))
    assert result.returncode == 0, result.stderr
    assert "3 workers" in result.stderr and "race, best first" in result.stderr
    assert "merge=off" in result.stderr.split("race, best first")[1]
    record = json.loads((run / "knobs.json").read_text())
    assert record["lanes"] == [[0, 1], [2]] and record["solo_lanes"] == [1]
    short = tmp_path / "c"
    flags = ["--workers", "2", "--control-worker", "--steps", "60", "--run-dir", str(short)]
    result = launch("--headless", *TINY, *flags)
    assert result.returncode == 0, result.stderr
    record = json.loads((short / "knobs.json").read_text())
    assert record["lanes"] == [[0, 1], [2]] and record["solo_lanes"] == [1]


@pytest.mark.parametrize("lane", ["iterations=1", "workers=1,merge=off"])
def test_a_torchrun_job_refuses_lanes(lane, tmp_path):
    """A torchrun rank (RANK and WORLD_SIZE in its environment) refuses --lane in one line and
    writes nothing: only a process started with torchrun's environment takes that path of
    launch.py."""
    env = {**os.environ, "TDMPC2_LIVE_NO_BOOTSTRAP": "1", "RANK": "0", "WORLD_SIZE": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), "--headless", *TINY, f"--lane={lane}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert_clean_error(result, "a torchrun job does not race")
    assert not list(tmp_path.iterdir())  # nothing written


def test_unwritable_run_dir(tmp_path):
    """A run directory under a file: one line, exit 2. Only a real process shows the OS error of
    the first write reaching the user as that line, not a traceback."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = launch("--headless", *TINY, "--steps", "10", "--run-dir", str(blocker / "run"))
    assert_clean_error(result, "cannot write to run directory")


def test_headless_run_is_a_run_of_one_worker(tmp_path):
    """Without --workers a headless run is a run of one worker: records, checkpoints, resume
    (self-check again), no overwrite, its weights start a new run, bad weights refused before a
    write. Only real starts of the program show what a user sees across them."""
    run = tmp_path / "run"
    result = launch("--headless", *TINY, "--steps", "150", "--run-dir", str(run))
    assert result.returncode == 0, result.stderr
    assert "finished at step 150, mean last eval return" in result.stderr
    # The start-up self-check's line: the fast path it trains on (bf16 where the CPU has a
    # bf16 unit: checked; float32: the plain path itself), and its record.
    assert "\nworker 0: fast path: eager, " in result.stderr
    assert "(the self-check's choice): eager " in result.stderr
    config = json.loads((run / "config.json").read_text())
    assert config["config"]["task"] == "cartpole-balance" and config["config"]["mlp_dim"] == 32
    assert json.loads((run / "run.json").read_text())["workers"] == 1
    first = records(run / "worker-0.jsonl")
    kinds = [r["kind"] for r in first]
    assert kinds.count("episode") == 3 and "eval" in kinds and "train" in kinds
    check = next(r for r in first if r["kind"] == "self_check")
    assert (check["path"], check["asked"], check["sound"], check["step"]) == (
        "eager",
        "auto",
        True,
        0,
    )
    assert check["message"] in result.stderr
    assert kinds[-2:] == ["stop", "checkpoint"] and first[-2]["reason"] == "done"
    assert all(r["step"] <= 150 for r in first)
    assert (run / "checkpoints" / "worker-0.pt").stat().st_size > 0
    weights = run / "worker-0.pt"
    assert weights.stat().st_size > 0
    before = (run / "worker-0.jsonl").read_bytes()

    again = launch("--headless", *TINY, "--steps", "150", "--run-dir", str(run))
    assert_clean_error(again, "already holds a run")
    assert (run / "worker-0.jsonl").read_bytes() == before

    resumed = launch("--headless", "--quiet", "--resume", str(run), "--steps", "200")
    assert resumed.returncode == 0, resumed.stderr
    after = records(run / "worker-0.jsonl")
    assert after[: len(first)] == first  # nothing already written lost
    assert [r["step"] for r in after if r["kind"] == "resumed"] == [150]
    assert [r["step"] for r in after if r["kind"] == "self_check"] == [0, 150]  # checked again
    assert after[-2] == {**after[-2], "kind": "stop", "step": 200, "reason": "done"}

    # The saved weights start a new run; damaged or mismatched ones are refused.
    ok = launch(
        "--headless",
        *TINY,
        "--steps",
        "60",
        "--load",
        str(weights),
        "--run-dir",
        str(tmp_path / "w"),
        "--fast-path",
        "eager",
    )
    assert ok.returncode == 0, ok.stderr
    started = records(tmp_path / "w" / "worker-0.jsonl")
    assert [r["step"] for r in started if r["kind"] == "started_from_weights"] == [0]
    # A path chosen by hand: recorded as asked, and said so.
    assert [r["asked"] for r in started if r["kind"] == "self_check"] == ["eager"]
    assert "(chosen by hand)" in ok.stderr
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(weights.read_bytes()[:1000])
    refused = [
        (["--load", str(corrupt)], "corrupt"),
        (["--task", "walker-walk", "--load", str(weights)], "obs/action dims"),
        (["--load", str(tmp_path / "nope.pt")], "cannot read"),
        (["--mlp-dim", "64", "--load", str(weights)], "model size"),
    ]
    for i, (flags, words) in enumerate(refused):
        target = tmp_path / f"r{i}"
        bad = launch("--headless", *TINY, "--steps", "60", *flags, "--run-dir", str(target))
        assert_clean_error(bad, words)
        assert not target.exists()
    assert_clean_error(launch("--headless", "--resume", str(run), "--load", str(weights)), "--load")


def test_bench_json_has_the_promised_fields():
    """`bench --json` prints one JSON object with every promised field on a clean stdout: only
    the command run as a process shows no log line mixed into it and --threads reaching the timed
    process."""
    result = launch(
        "bench", "--json", *TINY[:-1], "--repeats", "2", "--warmup", "1", "--threads", "1"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["threads"] == 1  # --threads sets the timed process's torch threads
    for key in (
        "update_ms",
        "plan_ms",
        "env_step_ms",
        "agent_steps_per_s",
        "update_gflop",
        "matmul_gflop_per_s",
        "fraction_of_matmul_rate",
    ):
        assert data[key] > 0, key
    assert data["compiled"] is False and data["cudagraph_skips"] == []  # nothing compiled on CPU


def test_window_refuses_bad_input_before_it_opens(tmp_path, monkeypatch):
    # A display that does not exist: bad input must be reported before anything touches it.
    """The window's entry with a display that does not exist: bad input is one line, exit 2,
    before the display is touched. Only a process with that DISPLAY shows the order of the checks
    at start-up."""
    monkeypatch.setenv("DISPLAY", ":987")
    assert_clean_error(launch("--task", "walker-sprint"), "walker-walk")
    assert_clean_error(launch("--attach", str(tmp_path / "nothing")), "run directory")
    assert_clean_error(launch("--workers", "0", "--run-dir", str(tmp_path / "r")), "workers")
    assert_clean_error(launch("--headless", "--attach", str(tmp_path)), "leave out --headless")
    assert not (tmp_path / "r").exists()


TWO_WORKERS = [*TINY, "--workers", "2", "--merge-every", "50", "--steps", "100000"]


def start(*args):
    """launch.py in its own process group, as a terminal would run it."""
    return start_program(sys.executable, str(ROOT / "launch.py"), *args, stdout=None)


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def resume_and_stop(run, sig):
    """Resume a run until worker 1 reports it resumed, stop it; the step it resumed at."""
    proc = start("--headless", "--resume", str(run), "--quiet")
    assert wait_for(lambda: '"resumed"' in (run / "worker-1.jsonl").read_text(), 180)
    os.killpg(proc.pid, sig)
    proc.communicate(timeout=180)
    return [r for r in records(run / "worker-1.jsonl") if r["kind"] == "resumed"][0]["step"]


def test_headless_workers_stop_on_ctrl_c_and_resume(tmp_path):
    """SIGINT to the whole process group, as Ctrl+C in a terminal: exit 130, no traceback from
    the program or its 2 spawned workers, both checkpoints, a resume within a merge interval.
    Only real signals to real processes show this."""
    run = tmp_path / "run"
    proc = start("--headless", *TWO_WORKERS, "--run-dir", str(run))
    assert wait_for(lambda: (run / "merge" / "merged.pt").exists(), 180)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl+C in a terminal does: the whole group
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "--resume" in stderr
    for w in (0, 1):
        assert (run / "checkpoints" / f"worker-{w}.pt").exists()
    stopped_at = max(r["step"] for r in records(run / "worker-1.jsonl") if "step" in r)
    assert resume_and_stop(run, signal.SIGTERM) >= stopped_at - 50


def test_attached_window_pauses_and_stops_a_headless_run(tmp_path):
    """A second process (as --attach does) pauses, resumes and stops a headless run through its
    run directory: only two separate processes show the requests crossing over and the owner
    exiting 0 with both checkpoints."""
    from workers.run.owner import Run

    run = tmp_path / "run"
    proc = start("--headless", *TWO_WORKERS, "--run-dir", str(run))
    assert wait_for(lambda: (run / "merge" / "merged.pt").exists(), 180)
    attached = Run.attach(run)  # what --attach RUN_DIR opens the window on
    attached.pause()
    states = lambda: [w["state"] for w in attached.workers.progress()]  # noqa: E731
    assert wait_for(lambda: states() == ["paused", "paused"], 60), states()
    attached.resume_training()
    running = ("seeding", "pretraining", "training")
    assert wait_for(lambda: all(state in running for state in states()), 60), states()
    attached.request_stop()
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    assert "attached window asked: stop: done" in stderr and "Traceback" not in stderr
    assert "attached window asked: pause: done" in stderr
    assert states() == ["stopped", "stopped"]
    for w in (0, 1):
        assert (run / "checkpoints" / f"worker-{w}.pt").exists()


def test_kill_9_of_the_whole_program_then_resume(tmp_path):
    """SIGKILL to the whole process group (no handler runs): every record line left is whole JSON
    and a resume starts from the last checkpoint. Only a real kill -9 shows what a crash leaves
    on disk."""
    run = tmp_path / "run"
    proc = start("--headless", *TWO_WORKERS, "--checkpoint-every", "150", "--run-dir", str(run))
    checkpoints = [run / "checkpoints" / f"worker-{w}.pt" for w in (0, 1)]
    logs = [run / f"worker-{w}.jsonl" for w in (0, 1)]
    # Killed while it trains on past its first checkpoints, once both are saved and recorded.
    saved = lambda: all('"kind": "checkpoint"' in log.read_text() for log in logs)  # noqa: E731
    assert wait_for(lambda: all(c.exists() for c in checkpoints) and saved(), 180)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    for w in (0, 1):
        records(run / f"worker-{w}.jsonl")  # every line that was written is whole JSON
    saved = records(run / "worker-1.jsonl")
    last_checkpoint = max(r["step"] for r in saved if r["kind"] == "checkpoint")
    assert resume_and_stop(run, signal.SIGINT) == last_checkpoint


def test_bad_worker_count_and_resume_dir(tmp_path):
    """--workers 0 and --resume of a directory without a run, headless: exit 2 and one line. The
    checks are unit-tested (tests/workers/test_run.py); only the process shows the exit code and
    stderr of the headless entry."""
    bad = launch("--headless", *TINY, "--workers", "0", "--run-dir", str(tmp_path / "a"))
    assert_clean_error(bad, "workers must be in [1, 256]")
    assert_clean_error(launch("--headless", "--resume", str(tmp_path / "x")), "not a multi-worker")


def test_bench_merge_json():
    """`bench --merge 3 --json`: only the command run as a process shows the merge benchmark's
    JSON alone on stdout with the fields it promises."""
    result = launch("bench", "--json", *TINY[:-1], "--merge", "3", "--repeats", "2")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["workers"] == 3 and data["merge_ms"] > 0 and data["floats_merged"] > 1000


# --- the command line's manners: --help, typos, key=value, the console script, the bootstrap ---


def test_help_shows_defaults_examples_and_bench():
    """--help of the headless entry, the window's (the same text) and bench's: only the processes
    show each entry routed to its parser, exit 0, the help alone on stdout."""
    result = launch("--headless", "--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    flat = " ".join(text.split())  # whatever width argparse wrapped to
    assert "(default: None)" not in flat and "(default: False)" not in flat
    for shown in (
        "--model-size M 1, 5, 19, 48 or 317 million parameters (default: 5)",
        "--install-desktop add the program to the desktop's menu",
        "(default: walker-walk)",
        "(default: 512; live knob in [2, 8192])",  # --num-samples: 5M preset, knob table
        "(default: 0.0003)",  # --lr
        "(default: on)",  # --compile
    ):
        assert shown in flat, shown
    examples = text.split("examples:", 1)[1]
    assert examples.count("python3 launch.py") >= 3
    assert "task=walker-walk model_size=5" in examples and "launch.py bench" in examples
    assert "launch.py bench" in text.split("options:", 1)[0]  # in the usage lines
    window = launch("--help")  # without --headless the window's entry answers: the same help
    assert window.returncode == 0 and window.stdout == text, window.stderr
    bench = launch("bench", "--help")
    assert bench.returncode == 0, bench.stderr
    assert "--repeats" in bench.stdout and "(default: 10)" in bench.stdout
    assert "--viewer" in bench.stdout and "examples:" in bench.stdout


@pytest.mark.parametrize(
    "args, words",
    [
        (["--headless", "--stepz", "5"], ["unknown flag --stepz", "did you mean --steps?"]),
        (["--stepz=5"], ["unknown flag --stepz", "did you mean --steps?"]),  # the window's entry
        (["bench", "--repeatz", "3"], ["unknown flag --repeatz", "did you mean --repeats?"]),
        (["--headless", "model_sise=5"], ["unknown key model_sise", "did you mean model_size?"]),
    ],
)
def test_mistyped_flags_and_keys_get_one_line(args, words):
    """Typos reaching each entry (headless, window, bench): only launch.py as a process shows
    each entry hands its argv to a parser that answers in one line with exit 2
    (test_parser_refuses_in_one_line tests the parser in-process)."""
    assert_clean_error(launch(*args), *words)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--step", "5"], ["unknown flag --step", "did you mean --steps?"]),  # no prefix guessing
        (["--steps", "x"], ["--steps", "invalid int value: 'x'"]),
        (["--horizon"], ["--horizon", "expected one argument"]),
        (["walker"], ["unexpected argument 'walker'"]),
        (["bench"], ["bench is a command of its own"]),
        (["modelsize=5"], ["unknown key modelsize", "did you mean model_size?"]),
        (["model-sise=5"], ["did you mean model-size?"]),
        (["compile=maybe"], ["compile=true or compile=false"]),
    ],
)
def test_parser_refuses_in_one_line(args, words, capsys):
    from workers.cli.flags import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    for word in words:
        assert word in err, err


def _parse(*argv):
    from workers.cli.flags import build_parser

    return build_parser().parse_args(list(argv))


def test_key_value_arguments_are_the_same_flags():
    from workers.cli.new_run import config_from_args

    flags = _parse(
        "--headless",
        "--task",
        "walker-walk",
        "--model-size",
        "5",
        "--steps",
        "1000",
        "--no-compile",
        "--seed-steps",
        "700",
        "--vmin",
        "-5",
    )
    keys = _parse(
        "headless=true",
        "task=walker-walk",
        "model_size=5",
        "steps=1000",
        "compile=false",
        "seed-steps=700",
        "vmin=-5",
    )
    assert vars(keys) == vars(flags)
    assert config_from_args(keys) == config_from_args(flags)
    assert flags.compile is False and flags.steps == 1000 and flags.vmin == -5.0
    # Switches both ways; a flag's value that holds '=' stays a value.
    assert _parse("no_compile=true").compile is False and _parse("mpc=1").mpc is True
    assert _parse("quiet=false").quiet is False and _parse("quiet=yes").quiet is True
    assert _parse("--run-dir", "runs/a=b").run_dir == "runs/a=b"


def test_console_script_runs_the_same_program():
    """The installed `tdmpc2-live` script (where .venv has it): only running it shows the entry
    point wired to launch:console_main, with the same help and one-line errors."""
    from importlib.metadata import entry_points

    (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "tdmpc2-live"]
    assert script.value == "launch:console_main"
    installed = Path(sys.executable).parent / "tdmpc2-live"
    if installed.exists():  # run it as a user would: the same --help, the same one-line errors
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        ran = subprocess.run([str(installed), "--help"], capture_output=True, text=True, env=env)
        assert ran.returncode == 0 and "examples:" in ran.stdout, ran.stderr
        typo = subprocess.run(
            [str(installed), "--headless", "--stepz", "1"], capture_output=True, text=True, env=env
        )
        assert_clean_error(typo, "did you mean --steps?")


def test_bootstrap_uses_this_python_when_the_dependencies_import():
    import launch

    choose = launch.choose_environment
    base = dict(no_bootstrap=False, setup_only=False, in_venv=False, venv_ready=False)
    assert choose(**base, deps_here=True) == "current"
    assert choose(**base, deps_here=False) == "build"
    assert choose(**{**base, "venv_ready": True}, deps_here=False) == "venv"
    # Our own .venv is kept in step with pyproject.toml whatever it has installed.
    assert choose(**{**base, "in_venv": True}, deps_here=True) == "build"
    assert choose(**{**base, "in_venv": True, "venv_ready": True}, deps_here=True) == "here"
    # --setup-only always prepares .venv (tests/run.sh runs from it), even when this Python
    # has everything; TDMPC2_LIVE_NO_BOOTSTRAP runs here, no questions asked.
    assert choose(**{**base, "setup_only": True}, deps_here=True) == "build"
    assert choose(**{**base, "setup_only": True, "venv_ready": True}, deps_here=False) == "here"
    assert choose(**{**base, "no_bootstrap": True}, deps_here=False) == "here"

    pyproject = (ROOT / "pyproject.toml").read_text()
    modules = launch.dependency_modules(pyproject)
    assert {"torch", "dm_control", "mujoco", "dearpygui", "imageio_ffmpeg"} <= set(modules)
    assert "pytest" not in modules  # dev extras are not needed to run
    assert launch.dependencies_here(modules, find_spec=lambda name: object())
    assert not launch.dependencies_here(
        modules, find_spec=lambda name: None if name == "mujoco" else object()
    )


def test_bootstrap_says_when_it_uses_this_python(monkeypatch, tmp_path, capsys):
    import launch

    # This Python has the dependencies but is not the project's .venv (that is elsewhere).
    monkeypatch.delenv("TDMPC2_LIVE_NO_BOOTSTRAP", raising=False)
    monkeypatch.setattr(launch, "VENV", tmp_path / "venv")
    monkeypatch.setattr(launch.os, "execv", lambda *a: pytest.fail(f"re-ran itself: {a}"))
    launch.ensure_environment(["--headless"])
    assert capsys.readouterr().err == f"using this Python's packages: {sys.executable}\n"
    launch.ensure_environment(["--help"])  # --help stays quiet
    assert capsys.readouterr().err == ""
    assert not (tmp_path / "venv").exists()


def test_launch_routes_key_value_switches():
    import launch

    assert launch._given(["task=x", "headless=true"], "headless")
    assert not launch._given(["headless=false"], "headless")
    assert launch._given(["bench", "viewer=0"], "viewer", switch=False)
    assert not launch._given(["--headlessly"], "headless")


def test_remote_viewing_refuses_bad_input_in_one_line(tmp_path, monkeypatch):
    """--connect to an address that answers nothing, to something that is not a run server, with
    a refused token; --serve on a port in use (before the run directory is written); serve of a
    directory that is no run; the remote flags without what they go with."""
    import http.server
    import socket
    import threading

    from conftest import tiny_run

    from workers.remote.server import RunServer
    from workers.run.owner import Run, RunSettings

    run = Run.create(tmp_path / "run", tiny_run(100), RunSettings(workers=1))
    server = RunServer("127.0.0.1", 0)
    server.start(run.path)
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    monkeypatch.setenv("DISPLAY", ":987")  # refused before the display is touched
    cases = [
        (["--connect", f"http://127.0.0.1:{dead}/?token=x"], ["answers nothing"]),
        (["--connect", f"http://127.0.0.1:{other.server_port}/?token=x"], ["not a run server"]),
        (["--connect", f"http://127.0.0.1:{server.port}/?token=wrong"], ["refused the token"]),
        (["--connect", f"http://127.0.0.1:{server.port}/"], ["no token"]),
        (
            ["--headless", *TINY, "--serve", str(server.port), "--run-dir", str(tmp_path / "r")],
            [f"port {server.port}", "in use"],
        ),
        (["serve", str(tmp_path)], ["not a multi-worker run directory"]),
        (["serve", str(run.path), "--port", str(server.port)], ["in use"]),
        (["--mirror", str(tmp_path / "m")], ["--mirror and --token-file go with --connect"]),
        (["--serve", "9000"], ["--serve serves a headless run"]),
        (["--headless", "--read-only"], ["go with --serve"]),
    ]
    try:
        results = json.loads(batch([argv for argv, _ in cases]).stdout)
    finally:
        server.stop()
        other.shutdown()
    for (argv, words), (code, stderr) in zip(cases, results):
        assert_clean_error(subprocess.CompletedProcess(argv, code, "", stderr), *words)
    assert not (tmp_path / "r").exists() and not (tmp_path / "m").exists()
