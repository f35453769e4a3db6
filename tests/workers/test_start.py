"""A new run's start weights (--load): read from any file of one worker's networks, checked
before anything is written, and loaded by every worker that starts fresh."""

import dataclasses

import pytest
import torch
from conftest import tiny_run

from agent.agent import TDMPC2
from agent.errors import WeightsError
from workers.run.owner import Run, RunSettings
from workers.run.spawn import worker_spec
from workers.run.start_weights import read_start_weights
from workers.rundir.directory import RunDir, load_state, save_state
from workers.rundir.paths import start_path
from workers.rundir.records import StartedFromWeights
from workers.showcase.shown_weights import weights_file
from workers.training.first_weights import start_worker
from workers.training.trainer import Trainer

CARTPOLE_DIMS = (5, 1)


def trained_agent(cfg) -> TDMPC2:
    agent = TDMPC2(dataclasses.replace(cfg, seed=7), *CARTPOLE_DIMS)
    with torch.no_grad():  # weights no fresh agent has
        for p in agent.model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    return agent


def assert_same_networks(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_start_weights_read_from_final_weights_checkpoint_or_merged_file(tmp_path):
    cfg = tiny_run(100)
    agent = trained_agent(cfg)
    networks = agent.model_state(0)
    files = {
        "final": agent.state_dict(0),
        "checkpoint": {"agent": agent.state_dict(0), "step": 100},
        "merged": {"model": networks, "round": 3, "step": 90},
    }
    for name, state in files.items():
        save_state(tmp_path / f"{name}.pt", state)
        assert_same_networks(read_start_weights(tmp_path / f"{name}.pt", cfg), networks)

    with pytest.raises(WeightsError, match="obs/action dims"):
        read_start_weights(tmp_path / "final.pt", dataclasses.replace(cfg, task="walker-walk"))
    with pytest.raises(WeightsError, match="model size"):
        read_start_weights(tmp_path / "merged.pt", dataclasses.replace(cfg, mlp_dim=48))
    save_state(tmp_path / "other.pt", {"steps": 3})
    with pytest.raises(WeightsError, match="holds no networks"):
        read_start_weights(tmp_path / "other.pt", cfg)


def test_every_fresh_worker_starts_from_the_run_start_weights(tmp_path):
    cfg = tiny_run(100)
    agent = trained_agent(cfg)
    save_state(tmp_path / "w.pt", agent.state_dict(0))
    settings = RunSettings(workers=2, merge_every=50)
    run = Run.create(tmp_path / "run", cfg, settings, start_weights=tmp_path / "w.pt")
    assert start_path(run.path).exists()
    # The window shows the start weights until the first merge or checkpoint.
    assert weights_file(run.path, -1)[0] == start_path(run.path)
    for index in (0, 1):
        spec = worker_spec(run.path, run.cfg, settings, index, 50)
        trainer = Trainer(dataclasses.replace(cfg, seed=cfg.seed + 1000 * index), progress=False)
        trainer.members[0].run_dir = log = RunDir.create(tmp_path / f"log-{index}")
        assert start_worker(spec, trainer, 0, None) is None
        assert_same_networks(trainer.agent.model_state(0), agent.model_state(0))
        assert [type(r) for r in log.read_metrics()] == [StartedFromWeights]
    stored = load_state(start_path(run.path))
    assert stored["source"] == str(tmp_path / "w.pt")


def test_a_bad_start_file_writes_nothing(tmp_path):
    (tmp_path / "bad.pt").write_bytes(b"not a torch file")
    with pytest.raises(WeightsError, match="corrupt"):
        Run.create(
            tmp_path / "run",
            tiny_run(100),
            RunSettings(workers=1),
            start_weights=tmp_path / "bad.pt",
        )
    assert not (tmp_path / "run").exists()
