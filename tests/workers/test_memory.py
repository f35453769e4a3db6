"""Whether a run's replay buffers fit (workers/host/memory.py), and the README's figures of what
a step from pixels takes, computed from the buffer itself."""

import re
from pathlib import Path

import pytest

from agent.buffer import EpisodeBuffer
from agent.config import make_config
from agent.errors import UserError
from agent.pixels import OBS_DIM
from workers.host.memory import (
    SHARE,
    available_bytes,
    buffers_bytes,
    check_buffers_fit,
    local_workers,
)

README = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
WALKER = (24, 6)  # walker-walk's state and action sizes


def test_the_memory_available_is_read_from_meminfo():
    text = "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n"
    assert available_bytes("cpu", text) == (20_000_000 * 1024, "memory available")
    total, where = available_bytes("cpu", "nothing useful")
    assert total > 0 and where == "memory"


def test_buffers_that_do_not_fit_are_refused_naming_a_size_that_fits():
    cfg = make_config(1, task="walker-walk", obs="rgb", steps=10_000_000, device="cpu")
    room = (20 * 10**9, "memory available")
    with pytest.raises(UserError) as refused:
        check_buffers_fit(cfg, 2, OBS_DIM, 6, room)
    line = str(refused.value)
    assert "\n" not in line and "the replay buffers do not fit: 2 worker(s) x" in line
    fits = int(re.search(r"--buffer-size (\d+) or less", line)[1])
    check_buffers_fit(cfg.__class__(**{**vars(cfg), "buffer_size": fits}), 2, OBS_DIM, 6, room)
    over = cfg.__class__(**{**vars(cfg), "buffer_size": fits + 2000})
    with pytest.raises(UserError):
        check_buffers_fit(over, 2, OBS_DIM, 6, room)
    # the same buffers from states fit: 152 bytes a step
    states = make_config(1, task="walker-walk", steps=10_000_000, device="cpu")
    check_buffers_fit(states, 2, *WALKER, room)
    assert buffers_bytes(states, 2, *WALKER) < SHARE * room[0] < buffers_bytes(cfg, 2, OBS_DIM, 6)


def test_a_torchrun_jobs_buffers_here_are_its_local_ranks(monkeypatch):
    assert local_workers(8, 0, 0) == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert local_workers(8, 2, 4) == 4  # 2 ranks here, a pack of 2 each


def test_the_readmes_figures_are_the_buffers():
    pixels = EpisodeBuffer.row_bytes(OBS_DIM, 6, frames=3, obs_bytes=1)
    states = EpisodeBuffer.row_bytes(*WALKER)
    assert f"{pixels:,} bytes a step (walker; states {states})" in README
    cfg = make_config(5, task="walker-walk", obs="rgb")  # the default --steps: 100,000
    assert f"{buffers_bytes(cfg, 1, OBS_DIM, 6) / 1e9:.1f} GB a worker for 100,000 steps" in README
    big = make_config(5, task="walker-walk", obs="rgb", steps=10_000_000)
    assert f"{buffers_bytes(big, 1, OBS_DIM, 6) / 1e9:.1f} GB for a 1M buffer" in README
    assert f"over {SHARE:.0%} of" in README.replace(" %", "%")
