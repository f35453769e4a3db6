"""Stops: SIGTERM ends a run cleanly with exit code 0, Ctrl+C leaves no traceback from any
process, and a stop reaches a worker that waits for the others in a merge."""

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from conftest import TINY_FLAGS, start_program, wait_until
from conftest import tiny_run as tiny

from workers.host.signals import child_signals, children_ignore_ctrl_c
from workers.merging.files import FileMergeBackend, MergeCancelled
from workers.run.owner import Run, RunSettings
from workers.rundir.paths import checkpoint_path

ROOT = Path(__file__).resolve().parents[2]
TINY = [*TINY_FLAGS, "--steps=100000", "--no-tensorboard"]


def launch(*args: str) -> subprocess.Popen:
    return start_program(sys.executable, str(ROOT / "launch.py"), *args)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def has_record(path: Path, kind: str) -> bool:
    return path.exists() and f'"kind": "{kind}"' in path.read_text()


def spawned_children(pid: int) -> list[int]:
    """Processes that `pid` started with multiprocessing's spawn (not its resource tracker)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"spawn_main" in command:
            found.append(int(entry))
    return found


def _note_sigint(ignored) -> None:
    """1 when a Ctrl+C cannot reach Python in this new process: SIGINT blocked from its start,
    and ignored (no longer blocked) once child_signals has run."""
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    child_signals()
    let_through = signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    ignored.value = int(
        blocked and let_through and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    )


@pytest.fixture
def python_ctrl_c():
    """Python's own Ctrl+C handler (a test runner in the background may ignore SIGINT)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("thread", ["main", "other"])
def test_children_start_with_ctrl_c_ignored(thread, python_ctrl_c):
    """A child spawned inside children_ignore_ctrl_c(), from the main thread or another (the
    window's), starts with SIGINT ignored and this process's handler is restored: only a real
    spawned child can report its disposition at its start."""
    ignored = mp.get_context("spawn").Value("i", -1)
    started = []

    def start() -> None:
        process = mp.get_context("spawn").Process(target=_note_sigint, args=(ignored,))
        with children_ignore_ctrl_c():
            process.start()
        started.append(process)

    if thread == "main":
        start()
    else:  # the window starts its runs from a thread of its own
        worker = threading.Thread(target=start)
        worker.start()
        worker.join()
    started[0].join(120)
    assert ignored.value == 1
    # This process's Ctrl+C is as it was.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)  # runs this process's handler before it returns


@pytest.mark.parametrize("taken_by", ["the starting thread", "another thread"])
def test_a_ctrl_c_while_children_start_is_acted_on_once_they_have(python_ctrl_c, taken_by):
    """A Ctrl+C in the moment a worker starts is held, not lost (the program would train on
    until pressed again): it waits in the starting thread's blocked mask, or another thread of
    this process takes it (then the main thread's handler runs in the middle of the start)."""
    go, done = threading.Event(), threading.Event()

    def ctrl_c_to_itself() -> None:  # a thread started before, which does not block SIGINT
        go.wait(60)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # its C handler runs now
        done.set()

    other = threading.Thread(target=ctrl_c_to_itself, daemon=True)
    if taken_by == "another thread":
        other.start()
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with children_ignore_ctrl_c():
            if taken_by == "another thread":
                go.set()
                assert done.wait(60)
            else:
                signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            reached.append(taken_by)  # a handler would have run by now, raising before this
    assert reached == [taken_by]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_merge_wait_ends_when_a_stop_is_asked_for(tmp_path):
    backend = FileMergeBackend(tmp_path, [0, 1], timeout_s=3600)  # worker 1 never comes
    polls = []

    def stop() -> bool:
        polls.append(1)
        return len(polls) >= 3  # asked for while the merge already waits

    outcome = {}

    def merge() -> None:
        try:
            backend.merge(0, 1, {"w": torch.ones(2)}, step=50)
        except MergeCancelled as err:
            outcome["stopped"] = str(err)

    backend.stop = stop
    thread = threading.Thread(target=merge, daemon=True)
    thread.start()
    thread.join(60)  # without the stop it would wait an hour
    assert not thread.is_alive()
    assert "waiting for workers [1]" in outcome["stopped"] and len(polls) == 3
    assert not (tmp_path / "merge" / "merged.pt").exists()  # a given-up merge publishes nothing


def test_a_worker_waiting_in_a_merge_checkpoints_and_exits_on_stop(tmp_path):
    """Worker 1 frozen by SIGSTOP, worker 0 waiting for it in a merge: a stop still reaches
    worker 0, which checkpoints and exits while worker 1 lives. Only real worker processes show
    the stop crossing into a blocked merge wait."""
    settings = RunSettings(workers=2, merge_every=50, merge_timeout_s=3600)
    run = Run.create(tmp_path / "run", tiny(100_000), settings)
    run.start()
    frozen = run.workers.pids()[1]
    os.kill(frozen, signal.SIGSTOP)  # worker 1 never reaches the merge: worker 0 waits for it
    stopper = None
    try:
        assert wait_until(lambda: run.workers.progress()[0]["state"] == "merging", 300)
        stopper = threading.Thread(target=run.stop, daemon=True)
        stopper.start()
        # Worker 0 ends while worker 1 is still frozen: the stop reached it in the merge.
        assert wait_until(lambda: not run.workers.progress()[0]["alive"], 60)
        assert run.workers.progress()[1]["alive"]
    finally:
        os.kill(frozen, signal.SIGCONT)
        if stopper is None:
            run.stop(timeout=60)
        else:
            stopper.join(180)
    kinds = [r["kind"] for r in records(run.path / "worker-0.jsonl")]
    assert "merge_stopped" in kinds and "merge" not in kinds
    assert kinds[-2:] == ["stop", "checkpoint"]
    assert checkpoint_path(run.path, 0).exists()
    assert run.workers.progress()[0]["state"] == "stopped"


@pytest.mark.parametrize(
    "how, exit_code",
    [("sigterm", 0), ("ctrl_c", 130)],
)
def test_a_stopped_headless_run_keeps_what_it_wrote(tmp_path, how, exit_code):
    """SIGTERM (a service manager) ends the program with 0, Ctrl+C to the whole group with 130,
    as shells expect; either way the worker writes its stop record, a checkpoint and its weights.
    Only real signals to launch.py and its worker show this."""
    run = tmp_path / "run"
    proc = launch("--headless", *TINY, "--quiet", "--run-dir", str(run))
    assert wait_for(lambda: has_record(run / "worker-0.jsonl", "train"), 180)
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)  # kill PID
    else:
        os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == exit_code, stderr
    assert "Traceback" not in stderr and "stopped at step" in stderr
    saved = records(run / "worker-0.jsonl")
    assert saved[-2] == {**saved[-2], "kind": "stop", "reason": "interrupted"}
    assert saved[-1]["kind"] == "checkpoint"
    assert (run / "worker-0.pt").stat().st_size > 0


def wait_for(predicate, timeout: float) -> bool:
    def safe() -> bool:
        try:
            return predicate()
        except OSError:
            return False

    return wait_until(safe, timeout, poll=0.1)


def test_ctrl_c_as_workers_start_then_sigterm_leave_no_traceback(tmp_path):
    """Ctrl+C while the 2 spawned workers still import torch, then SIGTERM to the resumed run:
    only real children interrupted mid-start show whether any prints a traceback or a
    KeyboardInterrupt."""
    run = tmp_path / "run"
    proc = launch(
        "--headless", *TINY, "--workers", "2", "--merge-every", "50", "--run-dir", str(run)
    )
    # Ctrl+C while the workers still import torch: a child that is interrupted there prints a
    # traceback unless it ignores SIGINT from its very start.
    assert wait_for(lambda: len(spawned_children(proc.pid)) == 2, 120)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    for w in (0, 1):
        assert checkpoint_path(run, w).exists()

    resumed = launch("--headless", "--resume", str(run))
    assert wait_for(lambda: has_record(run / "worker-1.jsonl", "resumed"), 180)
    resumed.send_signal(signal.SIGTERM)
    _, stderr = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, stderr
    assert "Traceback" not in stderr and "--resume" in stderr, stderr


PLAYER_SCRIPT = """
import sys, time
sys.path.insert(0, {root!r})
from agent.config import make_config
from workers.run.owner import Run, RunSettings

cfg = make_config(1, task="cartpole-balance", device="cpu", mlp_dim=32, enc_dim=16,
    latent_dim=16, batch_size=16, num_samples=16, num_elites=4, num_pi_trajs=2, iterations=1,
    episode_length=50, seed_steps=100, steps=100000)
run = Run.create({path!r}, cfg, RunSettings(workers=1, merge_every=50))
try:
    run.start()
    # No CPU budget: the player steps on at once (with one it may sleep through the test).
    run.showcase.start(height=48, width=64, realtime=False, cpu_share=0.0)
    deadline = time.monotonic() + 240
    while (frame := run.showcase.read_frame()) is None or frame[1]["step"] < 5:
        if not run.showcase.pids() or time.monotonic() > deadline:
            print("the player ended or got stuck", flush=True)
            raise SystemExit(1)
        time.sleep(0.05)
    print("playing", flush=True)
    while True:
        time.sleep(0.1)
except KeyboardInterrupt:
    run.stop(timeout=120)
    print("stopped", flush=True)
"""


def test_ctrl_c_leaves_no_traceback_from_the_showcase_player(tmp_path):
    # The window's process does what this script does: Ctrl+C reaches its whole group.
    """Only a real SIGINT to the process group shows whether the showcase player process prints a
    traceback while its owner stops the run."""
    script = PLAYER_SCRIPT.format(root=str(ROOT), path=str(tmp_path / "run"))
    proc = start_program(sys.executable, "-c", textwrap.dedent(script), stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "playing"
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=180)
    assert "stopped" in stdout, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr


@pytest.mark.parametrize("window", [False, True])
def test_bad_threads_get_one_line(tmp_path, window, monkeypatch):
    # The window checks its flags before it looks for a display (this one does not exist).
    """--threads 0 and cores+1, headless and the window's entry (no display): one line naming the
    cores this process may use (its affinity), exit 2, nothing written; only launch.py as a
    process shows the check comes before the display."""
    monkeypatch.setenv("DISPLAY", ":987")
    cores = len(os.sched_getaffinity(0))
    mode = [] if window else ["--headless"]
    for bad in ("0", str(cores + 1)):
        proc = launch(*mode, *TINY, "--threads", bad, "--run-dir", str(tmp_path / "r"))
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 2
        assert stderr.strip().splitlines() == [
            f"error: --threads must be between 1 and {cores} (the cores this process may use), "
            f"got {bad}"
        ]
        assert not (tmp_path / "r").exists()
