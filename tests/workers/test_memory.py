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
    episodes_bytes,
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


def test_episodes_in_progress_are_counted(monkeypatch):
    """The trainer keeps each env's stacked observations until its episode ends: with many
    envs and long episodes that is more than the buffers, and refused as well."""
    cfg = make_config(1, task="walker-walk", obs="rgb", steps=10_000, device="cpu")
    cfg = cfg.__class__(**{**vars(cfg), "num_envs": 64, "episode_length": 5000})
    held = 64 * 5001 * OBS_DIM  # uint8 stacks, as EpisodeSoFar.obs holds them
    assert episodes_bytes(cfg, 1, OBS_DIM) >= held + 5001 * OBS_DIM  # and one stored's copy
    room = (10 * 10**9, "memory available")
    assert buffers_bytes(cfg, 1, OBS_DIM, 6) < SHARE * room[0] < held
    with pytest.raises(UserError) as refused:
        check_buffers_fit(cfg, 1, OBS_DIM, 6, room)
    line = str(refused.value)
    assert "\n" not in line and "episodes in progress (64 env(s) x 5,000 steps)" in line
    assert "give fewer --num-envs or a shorter --episode-length" in line


def test_a_resume_whose_buffers_outgrow_memory_is_refused_writing_nothing(tmp_path, monkeypatch):
    from conftest import tiny_run

    import workers.run.owner as owner
    from workers.run.owner import Run, RunSettings

    run = Run.create(tmp_path / "run", tiny_run(100), RunSettings(workers=2))
    config = (run.path / "config.json").read_bytes()
    meminfo = "MemAvailable:   100000 kB\n"  # 102 MB: 2 workers x 1M steps of states do not fit
    monkeypatch.setattr(owner, "available_bytes", lambda device: available_bytes(device, meminfo))
    Run.resume(run.path)  # its 100 steps still fit
    with pytest.raises(UserError) as refused:
        Run.resume(run.path, steps=10_000_000)
    line = str(refused.value)
    assert "\n" not in line and "2 worker(s) x 1,200,001 steps" in line
    assert "resume with fewer --steps than 10,000,000" in line
    assert (run.path / "config.json").read_bytes() == config


def test_an_added_worker_whose_buffer_does_not_fit_is_refused_writing_nothing(monkeypatch):
    from types import SimpleNamespace

    import workers.host.memory as memory
    from workers.run.processes import RunSide, WorkerProcesses
    from workers.rundir.settings import RunSettings

    cfg = make_config(1, task="walker-walk", obs="rgb", steps=1_000_000, device="cpu")
    saved = []
    side = RunSide(
        path=Path("nowhere"),
        cfg=cfg,
        resumed=False,
        lock=None,
        settings=lambda: RunSettings(workers=2),
        save_settings=saved.append,
        merge_every=lambda: 10,
        race=SimpleNamespace(lane_for_new=lambda lane: None),
        start_process=lambda specs: [],
        restarting=lambda: False,
        restarted_by_hand=lambda pack: None,
        removed=lambda index: None,
    )
    workers = WorkerProcesses(side)
    workers.procs[0] = None  # started
    monkeypatch.setattr(WorkerProcesses, "_check_merged_weights", lambda self, lane: None)
    monkeypatch.setattr(memory, "_read", lambda path: "MemAvailable:   8000000 kB\n")  # 8 GB
    with pytest.raises(UserError) as refused:
        workers.add()
    line = str(refused.value)
    assert "\n" not in line and "1 worker(s) x 1,002,001 steps" in line
    assert "no worker added" in line and saved == []
    memory.check_added_worker(cfg, 2, OBS_DIM, 6, "MemAvailable:   20000000 kB\n")  # 20 GB


def test_a_checkpoint_is_streamed_to_its_file_and_loaded_mapped(tmp_path, monkeypatch):
    """No bytes copy of a checkpoint (a pixel buffer: GBs) when it is saved or loaded."""
    import torch

    from workers.rundir.directory import load_checkpoint, load_state, save_checkpoint, state_size

    targets, save = [], torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, **kw: targets.append(f) or save(obj, f))
    state = {"buffer": {"obs": torch.ones(1000, 4096, dtype=torch.uint8)}, "step": 7}
    save_checkpoint(tmp_path / "w.pt", state)
    assert targets and all(hasattr(f, "fileno") for f in targets)  # a file, not a BytesIO
    size = (tmp_path / "w.pt").stat().st_size
    assert size <= state_size(state) < size + 10_000  # what a full-disk wait asks room for
    loaded, used, _ = load_checkpoint(tmp_path / "w.pt")
    obs = loaded["buffer"]["obs"]
    # Other files (merged weights, read again and again) are read, not mapped: a file cut short
    # in place while mapped is a bus error.
    read = load_state(tmp_path / "w.pt")["buffer"]["obs"]
    mapped = [
        [int(a, 16) for a in line.split()[0].split("-")]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.endswith(str(tmp_path / "w.pt"))
    ]
    assert any(a <= obs.data_ptr() < b for a, b in mapped)  # the file's pages, not a copy
    assert not any(a <= read.data_ptr() < b for a, b in mapped) and used == tmp_path / "w.pt"
    assert loaded["step"] == 7 and obs.sum() == 1000 * 4096
