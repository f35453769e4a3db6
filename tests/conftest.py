import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TDMPC2_LIVE_NO_BOOTSTRAP", "1")
# One intra-op thread per test process where pytest runs two of them (tests/run.sh: -n 2, one
# per core), else two as on the CI machine; tests/mutate.sh runs one test process per core.
THREADS = "1" if os.environ.get("PYTEST_XDIST_WORKER") else "2"
torch.set_num_threads(int(os.environ.get("TDMPC2_LIVE_TEST_THREADS", THREADS)))

from agent.config import make_config  # noqa: E402
from agent.envs import name_task  # noqa: E402
from workers.rundir.directory import RunDir  # noqa: E402
from workers.rundir.records import Record  # noqa: E402

# The gymnasium modules the tests train on, named as a person names one with --task (a task
# read from a run directory imports only a named module: agent/envs/gym.py).
for _module in ("helpers.slide_env", "helpers.broken_env", "helpers.exiting_env", "nope_pkg"):
    name_task(f"{_module}:Any-v0")


def tiny_config(**overrides):
    """A small but complete config: every code path, a fraction of the FLOPs."""
    base = dict(
        device="cpu",
        task="cartpole-balance",
        enc_dim=32,
        mlp_dim=64,
        latent_dim=32,
        batch_size=32,
        num_samples=64,
        num_elites=8,
        num_pi_trajs=4,
        iterations=2,
    )
    return make_config(1, **{**base, **overrides})


def random_batch(cfg, obs_dim: int, action_dim: int, seed: int = 0):
    """One worker's batch of random data, shaped as a buffer's sample: obs (H+1, B, D), action
    (H, B, A), reward and terminated (H, B, 1)."""
    g = torch.Generator().manual_seed(seed)
    h, b = cfg.horizon, cfg.batch_size
    return (
        torch.randn(h + 1, b, obs_dim, generator=g),
        torch.rand(h, b, action_dim, generator=g) * 2 - 1,
        torch.rand(h, b, 1, generator=g) * 5,
        torch.zeros(h, b, 1),
    )


def tiny_run(steps: int, **overrides):
    """tiny_config with short episodes and a planning horizon of 1 (a third less work per agent
    step than 3: what these runs test is the processes around the agent), for runs of a few
    hundred agent steps."""
    base = dict(
        horizon=1,
        episode_length=50,
        seed_steps=100,
        eval_episodes=1,
        eval_every=0,
        steps=steps,
        mlp_dim=32,
        enc_dim=16,
        latent_dim=16,
        batch_size=16,
        num_samples=16,
        num_elites=4,
        num_pi_trajs=2,
        iterations=1,
    )
    return tiny_config(**{**base, **overrides})


# tiny_run's settings as command-line flags, for tests that start launch.py: float32 as
# tiny_run (the command line's default is bf16 where the CPU has a bf16 unit, which makes a
# tiny model slower and a worker's start-up check it), the same on every host.
TINY_FLAGS = [
    "--task=cartpole-balance",
    "--model-size=1",
    "--device=cpu",
    "--no-bf16",
    "--mlp-dim=32",
    "--enc-dim=16",
    "--latent-dim=16",
    "--batch-size=16",
    "--num-samples=16",
    "--num-elites=4",
    "--num-pi-trajs=2",
    "--iterations=1",
    "--horizon=1",
    "--episode-length=50",
    "--seed-steps=100",
    "--eval-episodes=1",
]


@pytest.fixture
def tiny_cfg():
    return tiny_config()


# Programs a test started (launch.py and the like), killed after the test if still running.
STARTED: list[subprocess.Popen] = []


def default_sigint() -> None:
    # A test runner started in the background (nohup, `&`) ignores SIGINT, and its children
    # inherit that: give the program the Ctrl+C a terminal would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_program(*command: str, stdout=subprocess.DEVNULL) -> subprocess.Popen:
    """A program in its own process group, as a terminal runs it (stdout=None: inherited)."""
    env = {**os.environ, "TDMPC2_LIVE_NO_BOOTSTRAP": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        list(command),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    STARTED.append(proc)
    return proc


@pytest.fixture(autouse=True)
def no_leftover_programs():
    """A failed test must not leave a training program running into the next tests."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
            proc.wait(timeout=30)


def launch(*args, timeout=300, cwd=ROOT, env=None, drop=()) -> subprocess.CompletedProcess:
    """`launch.py ARGS` run to its end in this Python: its exit code and output. `env`: more
    variables; `drop`: variables of this process it does not get."""
    base = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**base, "TDMPC2_LIVE_NO_BOOTSTRAP": "1", "OMP_NUM_THREADS": "1", **(env or {})},
        cwd=cwd,
    )


def free_port() -> int:
    """A TCP port of this machine that nothing listens on now (a rendezvous for ranks)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout=180.0, poll=0.2) -> bool:
    """Whether `predicate()` came true within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return False


def events(run, kind: type[Record], worker: int | None = None) -> list[Record]:
    """A run's records of one kind from every worker's metrics file (all, or `worker`'s)."""
    found = []
    for index in range(run.settings.workers):
        if worker in (None, index):
            log = RunDir(run.path, metrics=f"worker-{index}.jsonl")
            found += [replace(r, worker=index) for r in log.read_metrics(kind)]
    return found


DURATIONS = Path(__file__).parent / "durations.json"  # each test file's seconds in a past run


def pytest_collection_modifyitems(config, items):
    """Each file's tests together, the files longest first as a past run timed them
    (durations.json; the slow-marked learning check leads): tests/run.sh gives whole files to
    two test processes as each frees up (pytest-xdist --dist loadfile), so the run ends on
    short files, not with one process idle while the other finishes a long one, and a file's
    module fixtures start once. A file missing from durations.json goes with the short ones;
    refresh it with tests/durations.py from a run's --junitxml when long tests change."""
    try:
        seconds = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        seconds = {}

    def order(item):
        path = item.nodeid.split("::")[0]
        return item.get_closest_marker("slow") is None, -float(seconds.get(path, 0.0)), path

    items.sort(key=order)
