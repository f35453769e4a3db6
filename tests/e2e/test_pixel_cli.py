"""Bad input for a pixel run on the command line (issue 55): one line, exit 2, nothing written."""

import json
import os
import subprocess
import sys

from conftest import TINY_FLAGS, tiny_config
from e2e.test_cli import ROOT, assert_clean_error, batch

from agent.agent import TDMPC2
from agent.pixels import OBS_DIM
from workers.rundir.directory import save_state


def weights(path, **overrides):
    """A worker's final weights file, as worker-K.pt holds them, of a tiny run's model."""
    cfg = tiny_config(**overrides)
    agent = TDMPC2(cfg, OBS_DIM if cfg.obs == "rgb" else 5, 1)
    save_state(path, agent.state_dict())
    return str(path)


def test_bad_pixel_input_is_one_line_exit_2_and_nothing_written(tmp_path):
    """--obs depth, --obs rgb for a gymnasium env, buffers that would not fit, weights of
    the other observation kind, lanes that differ in obs: each refused before the first
    write (one process for all, tests/helpers/cli_batch.py)."""
    tiny = [flag for flag in TINY_FLAGS if not flag.startswith(("--mlp", "--enc", "--latent"))]
    tiny += ["--mlp-dim=64", "--enc-dim=32", "--latent-dim=32"]  # tiny_config's model
    states = weights(tmp_path / "states.pt")
    pixels = weights(tmp_path / "pixels.pt", obs="rgb")
    cases = [
        (["--obs", "depth"], ["obs must be state or rgb", "'depth'"]),
        (["--obs", "rgb", "--task", "Pendulum-v1"], ["--obs rgb renders DMControl", "Pendulum-v1"]),
        (
            [*tiny, "--obs", "rgb", "--steps", "90000000", "--buffer-size", "90000000"],
            ["the replay buffers do not fit", "12,", "give --buffer-size"],
        ),
        ([*tiny, "--obs", "rgb", "--load", states], ["learned from states", "from pixels"]),
        ([*tiny, "--load", pixels], ["learned from pixels", "learns from states"]),
        (
            [*tiny, "--obs", "rgb", "--workers", "2", "--lane=obs=rgb", "--lane=obs=state"],
            ["lanes cannot differ in obs"],
        ),
    ]
    runs = [tmp_path / f"r{i}" for i in range(len(cases))]
    argvs = [["--headless", *args, "--run-dir", str(r)] for (args, _), r in zip(cases, runs)]
    results = json.loads(batch(argvs).stdout)
    for (code, err), (_, words) in zip(results, cases, strict=True):
        assert_clean_error(subprocess.CompletedProcess([], code, "", err), *words)
    assert not any(r.exists() for r in runs)


def test_a_task_that_cannot_render_here_is_one_line(tmp_path):
    """Only a process of its own chooses its GL backend (MUJOCO_GL is read at import): here
    GLFW with no display, which imports but cannot render."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "PYOPENGL_PLATFORM")}
    env.update(MUJOCO_GL="glfw", TDMPC2_LIVE_NO_BOOTSTRAP="1", OMP_NUM_THREADS="1")
    argv = ["--headless", "--obs", "rgb", *TINY_FLAGS, "--run-dir", str(tmp_path / "r")]
    result = subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert_clean_error(result, "--obs rgb: cartpole-balance cannot render here", "MUJOCO_GL=glfw")
    assert not (tmp_path / "r").exists()
