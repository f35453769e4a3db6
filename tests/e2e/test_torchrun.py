"""A torchrun job end to end: ranks on loopback (gloo), merging over torch.distributed into one
run directory that a window can attach to."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_FLAGS, events, free_port, wait_until

from agent.errors import UserError
from workers.run.owner import Run
from workers.rundir.directory import RunDir, load_state
from workers.rundir.records import Checkpoint, KnobsApplied, Merge, Resumed, Stop

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "TDMPC2_LIVE_NO_BOOTSTRAP": "1", "OMP_NUM_THREADS": "1"}
FLAGS = [*TINY_FLAGS, "--seed-steps=50", "--quiet", "--no-tensorboard", "--merge-every=50"]


def torchrun(ranks: int, *args: str, restarts: int = 0) -> list[str]:
    """The torchrun command line of a job of `ranks` processes on this machine."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        f"--max-restarts={restarts}",
        str(ROOT / "launch.py"),
        "--headless",
        *FLAGS,
        *args,
    ]


def finished_job(ranks: int, run: Path, *args: str) -> str:
    """Run a torchrun job into `run` to its end; its exit code 0 is asserted, its stderr
    returned."""
    command = torchrun(ranks, *args, f"--run-dir={run}")
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_three_ranks_merge_into_one_run_directory_a_window_can_attach_to(tmp_path):
    """3 ranks started by torchrun merge over gloo on loopback; rank 0's directory gets every
    worker's records whole and a watcher attaches to it. Only real ranks show the merge rounds
    across processes and the records copied between folders."""
    run = tmp_path / "run"
    err = finished_job(3, run, "--workers=3", "--steps=200")
    assert "finished at step 200, mean last eval return" in err
    # Rank 0's directory has every worker's records, copied whole from the ranks' own folders.
    for k in (1, 2):
        own = (run / f"rank-{k}" / f"worker-{k}.jsonl").read_bytes()
        assert (run / f"worker-{k}.jsonl").read_bytes() == own
    watcher = Run.attach(run)
    assert [(w["worker"], w["state"], w["step"]) for w in watcher.workers.progress()] == [
        (0, "done", 200),
        (1, "done", 200),
        (2, "done", 200),
    ]
    for k in (0, 1, 2):
        merges = events(watcher, Merge, k)
        assert [m.step for m in merges] == [50, 100, 150, 200]
        assert all(m.participants == (0, 1, 2) and m.left_out == {} for m in merges)
        assert set(merges[-1].distances) == {0, 1, 2}
    # The last round was at the last step: every worker ended on the merged weights.
    merged = load_state(run / "merge" / "merged.pt")
    assert merged["participants"] == [0, 1, 2] and merged["step"] == 200
    finals = [run / "worker-0.pt", run / "rank-1" / "worker-1.pt", run / "rank-2" / "worker-2.pt"]
    for final in finals:
        weights = load_state(final)["model"]
        assert all(torch.equal(weights[name], v) for name, v in merged["model"].items())


def test_each_rank_trains_its_share_as_a_pack(tmp_path):
    """--workers=4 on 2 torchrun ranks: each rank a pack of 2 that weighs as 2 workers in the
    all-reduce. Only real ranks show the split of workers and the rounds taken together."""
    run = tmp_path / "run"
    assert "4 workers on 2 ranks (2 each)" in finished_job(2, run, "--workers=4", "--steps=100")
    watcher = Run.attach(run)
    for k in range(4):  # each pack weighs as many workers as it holds
        merges = events(watcher, Merge, k)
        assert [m.participants for m in merges] == [(0, 1, 2, 3)] * 2
    assert sorted(p.name for p in (run / "rank-1").glob("worker-*.jsonl")) == [
        "worker-2.jsonl",
        "worker-3.jsonl",
    ]


def test_a_knob_set_in_rank_0s_directory_reaches_every_rank_at_one_merge_round(tmp_path):
    """A knob set in rank 0's directory is applied by every rank at the same merge round, and
    SIGTERM to the launcher stops every rank with a checkpoint. Only real ranks show the knob
    travelling with the all-reduce."""
    run = tmp_path / "run"
    command = torchrun(2, "--workers=2", "--steps=100000", f"--run-dir={run}")
    job = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert wait_until(
            lambda: (run / "run.json").exists() and events(Run.attach(run), Merge, 1), timeout=300
        )
        watcher = Run.attach(run)
        asked_at = max(w["step"] for w in watcher.workers.progress())
        version = watcher.knobs.set(horizon=2)

        def applied() -> list:
            return [e for e in events(watcher, KnobsApplied) if e.version == version]

        assert wait_until(lambda: len(applied()) == 2, timeout=120)
        steps = {e.step for e in applied()}
        assert len(steps) == 1, "every rank applies it at the same step"
        assert steps.pop() <= (asked_at // 50 + 2) * 50  # at the first round that saw it
        assert all(e.values["horizon"] == 2 for e in applied())
        with pytest.raises(UserError, match="torchrun job of 2 ranks"):
            watcher.pause()  # nobody serves requests in a torchrun job: said, not sent
    finally:
        job.send_signal(signal.SIGTERM)  # what a service manager sends the launcher
        job.communicate(timeout=120)
    # Every rank stopped with a checkpoint, and its records reached rank 0's directory.
    watcher = Run.attach(run)
    for k in (0, 1):
        assert events(watcher, Stop, k)[-1].reason == "interrupted"
        assert events(watcher, Checkpoint, k)
    assert (run / "rank-1" / "checkpoints" / "worker-1.pt").exists()
    with pytest.raises(UserError, match="resume it with the same torchrun line"):
        Run.resume(run)  # a run of local worker processes would not find rank 1's files


def rank_pid(launcher: int, rank: int) -> int | None:
    """The process id of rank `rank` among the torchrun launcher's children."""
    for task in Path(f"/proc/{launcher}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in environ:
                return int(child)
    return None


def test_a_rank_killed_mid_run_is_restarted_and_the_job_goes_on_from_the_checkpoints(tmp_path):
    """A rank killed by SIGKILL mid-run is restarted by torchrun (--max-restarts) and the job
    goes on from the ranks' checkpoints, no round recorded twice. Only a real kill under torchrun
    shows the restart and the rounds lining up again."""
    run = tmp_path / "run"
    flags = ["--workers=3", "--steps=600", "--checkpoint-every=100", f"--run-dir={run}"]
    command = torchrun(3, *flags, restarts=1)
    job = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=ENV)
    own = RunDir(run / "rank-2", metrics="worker-2.jsonl")
    try:
        assert wait_until(lambda: any(c.step >= 200 for c in own.read_metrics(Checkpoint)), 300)
        victim = rank_pid(job.pid, 2)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        _, err = job.communicate(timeout=600)
    finally:
        job.kill()
    assert job.returncode == 0, err
    assert "resuming 3 workers on 3 ranks" in err and "finished at step 600" in err
    watcher = Run.attach(run)
    for k in (0, 1, 2):
        raw = (run / f"worker-{k}.jsonl").read_text().splitlines()
        records = RunDir(run, metrics=f"worker-{k}.jsonl").read_metrics()
        assert len(records) == len(raw), "every line on disk is a whole record"
        resumed = events(watcher, Resumed, k)
        assert len(resumed) == 1 and resumed[0].step >= 200  # from its own newest checkpoint
        merges = [m.step for m in events(watcher, Merge, k)]
        assert merges == sorted(set(merges)), "no merge round recorded twice"
        assert merges[-1] == 600 and events(watcher, Stop, k)[-1].reason == "done"
    # The job's rounds line up again after the restart: every worker took part in each.
    later = [m for m in events(watcher, Merge, 2) if m.step > events(watcher, Resumed, 2)[0].step]
    assert later and all(m.participants == (0, 1, 2) for m in later)
    for k in (1, 2):
        assert (run / f"worker-{k}.jsonl").read_bytes() == (
            run / f"rank-{k}" / f"worker-{k}.jsonl"
        ).read_bytes()


def rank_env(rank: int, world: int, port: int) -> dict:
    """What torchrun sets for each rank (here by hand, as for ranks started on two machines)."""
    return {
        **ENV,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def test_a_rank_that_cannot_reach_the_rendezvous_stops_with_one_line(tmp_path):
    """A rank whose rendezvous nobody answers stops in one line with exit 2 and writes nothing:
    only a real process waiting on a real TCP store shows the timeout turned into that line."""
    env = {**rank_env(1, 2, free_port()), "TDMPC2_LIVE_RENDEZVOUS_S": "3"}  # nobody listens
    command = [sys.executable, str(ROOT / "launch.py"), "--headless", *FLAGS, "--workers=2"]
    done = subprocess.run(
        [*command, f"--run-dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the rendezvous at 127.0.0.1:" in lines[0], lines
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "flags, words",
    [
        ([["--workers=3"], ["--workers=3"]], ["2 ranks for --workers 3", "multiple"]),
        (
            [["--workers=2", "--seed=1"], ["--workers=2", "--seed=2"]],
            ["rank 1 of this torchrun job", "same flags"],
        ),
    ],
)
def test_ranks_that_do_not_fit_together_stop_with_one_line(tmp_path, flags, words):
    """Two ranks with flags that do not fit together both stop at start-up with one line, exit 2,
    nothing written: only two real processes meeting at the rendezvous compare each other's
    flags."""
    port, started = free_port(), time.monotonic()
    run_dir = f"--run-dir={tmp_path / 'run'}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "launch.py"), "--headless", *FLAGS, *own, run_dir],
            stderr=subprocess.PIPE,
            text=True,
            env=rank_env(rank, 2, port),
        )
        for rank, own in enumerate(flags)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), err
        assert all(word in lines[0] for word in words), lines[0]
    assert time.monotonic() - started < 100  # told at start-up, not after a timeout
    assert not (tmp_path / "run").exists()  # nothing written


def test_two_ranks_from_pixels_merge_their_convolutions(tmp_path):
    """--obs rgb on 2 torchrun ranks (issue 55): the all-reduce averages the pixel encoder's
    convolutions like any weight, and each rank ends on the merged ones. Only real ranks show
    the pixel model crossing gloo."""
    run = tmp_path / "run"
    finished_job(2, run, "--workers=2", "--steps=100", "--obs=rgb")
    watcher = Run.attach(run)
    for k in (0, 1):
        assert [m.participants for m in events(watcher, Merge, k)] == [(0, 1)] * 2
    merged = load_state(run / "merge" / "merged.pt")["model"]
    assert merged["encoder.convs.0.weight"].shape == (32, 9, 7, 7)
    for final in (run / "worker-0.pt", run / "rank-1" / "worker-1.pt"):
        weights = load_state(final)["model"]
        assert all(torch.equal(weights[name], v) for name, v in merged.items())
