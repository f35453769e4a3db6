"""The self-check on a real agent (agent/check_probe.py): it leaves the agent as it found it, a
sound fast path is kept, and faults injected into the real agent end on the right fallback,
after which training goes on. Compiled paths are faked (torch.compile replaced by a wrapper
that raises at capture, perturbs the loss or replays a stale input): the same code decides on
CUDA, without Inductor here."""

import dataclasses

import pytest
import torch
from conftest import random_batch, tiny_config
from helpers.faults import fake_compile, mix_up_workers

import agent.agent as agent_module
from agent.agent import TDMPC2
from agent.check_probe import AgentProbe, check_fast_path, check_weights
from agent.self_check import PLAIN, FastPath

OBS, ACT = 5, 2


def _batch(cfg, pack, seed=0):
    parts = [random_batch(cfg, OBS, ACT, 10 * seed + k) for k in range(pack)]
    return tuple(torch.stack(column) for column in zip(*parts))


def _state(agent):
    model = {k: v.clone() for k, v in agent.model.state_dict().items()}
    optims = [
        {i: {k: v.clone() for k, v in s.items()} for i, s in enumerate(o.state.values())}
        for o in (agent.optim, agent.pi_optim)
    ]
    noise = [g.get_state() for g in agent.noise.generators]
    return model, optims, noise, torch.get_rng_state(), agent.cfg, agent._warm_mean


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("pack", [1, 2])
def test_the_check_leaves_the_agent_as_it_found_it(pack):
    """Networks, Adam state, random streams, warm start, knobs and torch's generator are
    unchanged, so training goes on as if there had been no check: the next update and plan
    are the same as a twin's that was never checked."""
    cfg = dataclasses.replace(tiny_config(), bf16=True)
    seeds = [1, 2][:pack]
    checked, twin = (TDMPC2(cfg, OBS, ACT, seeds=seeds) for _ in range(2))
    obs = torch.randn(pack, 3, OBS)
    for agent in (checked, twin):
        torch.manual_seed(7)
        agent.update(_batch(cfg, pack))  # Adam state and a warm start to keep
        agent.act(obs, t0=True)
    before = _state(checked)
    verdict = check_fast_path(checked)
    assert verdict.sound and verdict.path == twin.path
    assert _equal(_state(checked), before)
    after = []
    for agent in (checked, twin):
        torch.manual_seed(8)  # a lone agent's dropout draws from torch's generator
        after.append((agent.update(_batch(cfg, pack, 1)), agent.act(obs)))
    assert _equal(after[0], after[1])
    assert _equal(checked.model.state_dict(), twin.model.state_dict())


def test_a_cpu_pack_on_threads_in_bf16_agrees_and_keeps_its_path():
    cfg = dataclasses.replace(tiny_config(), bf16=True)
    agent = TDMPC2(cfg, OBS, ACT, seeds=[1, 2])
    assert agent.path == FastPath("eager", pack=2, threads=True, bf16=True)
    verdict = check_fast_path(agent)
    assert [t.outcome for t in verdict.trials] == ["agrees"]
    assert verdict.path == agent.path and agent.threads is not None and agent.cfg.bf16
    assert 0 < verdict.trials[0].worst < 1


def test_a_lone_float32_worker_is_the_plain_path_and_nothing_runs(monkeypatch):
    agent = TDMPC2(tiny_config(), OBS, ACT)
    monkeypatch.setattr(AgentProbe, "pair", lambda *a: pytest.fail("nothing to compare"))
    verdict = check_fast_path(agent)
    assert verdict.path == PLAIN and verdict.trials[0].outcome == "plain"


def test_bf16_that_raises_falls_back_to_float32_and_training_goes_on(monkeypatch):
    def broken_bf16(native):
        raise RuntimeError("no bf16 kernel for addmm on this CPU")

    monkeypatch.setattr(agent_module, "cpu_bf16", broken_bf16)
    cfg = dataclasses.replace(tiny_config(), bf16=True)
    agent = TDMPC2(cfg, OBS, ACT)
    verdict = check_fast_path(agent)
    assert verdict.path == PLAIN and not agent.cfg.bf16
    assert [t.outcome for t in verdict.trials] == ["raised", "plain"]
    assert "eager bf16 raised RuntimeError: no bf16 kernel for addmm" in verdict.line()
    info = agent.update(random_batch(cfg, OBS, ACT))  # float32 from now on: no bf16 called
    assert torch.isfinite(info["total_loss"])


def test_a_pack_whose_threads_mix_up_workers_goes_to_one_process_per_worker(monkeypatch):
    mix_up_workers(monkeypatch)
    cfg = dataclasses.replace(tiny_config(), bf16=True)
    agent = TDMPC2(cfg, OBS, ACT, seeds=[1, 2])
    verdict = check_fast_path(agent)
    assert [t.outcome for t in verdict.trials] == ["disagrees", "disagrees", "split"]
    assert verdict.path.split
    assert agent.path == FastPath("eager", pack=2, threads=True, bf16=True)  # the run splits it


# compiled paths, faked ------------------------------------------------------------------
@pytest.mark.parametrize("pack", [1, 2])
@pytest.mark.parametrize("fault", ["raise", "perturb", "stale"])
def test_faulty_cuda_graphs_fall_back_to_compile_and_training_goes_on(fault, pack, monkeypatch):
    monkeypatch.setattr(torch, "compile", fake_compile(fault))
    cfg = tiny_config()
    agent = TDMPC2(cfg, OBS, ACT, seeds=[1, 2][:pack])
    agent.use_path(FastPath("graphs", pack=pack))  # as a CUDA agent starts
    verdict = check_fast_path(agent)
    assert verdict.path == FastPath("compile", pack=pack) == agent.path
    outcome = {"raise": "raised", "perturb": "disagrees", "stale": "disagrees"}[fault]
    assert [t.outcome for t in verdict.trials] == [outcome, "agrees"]
    line = verdict.line()
    assert line.startswith(
        f"fast path: compiled without CUDA graphs, {'a pack of 2, ' * (pack > 1)}"
    )
    expected = {
        "raise": "graphs raised RuntimeError: CUDA graphs: operation not permitted",
        "perturb": "graphs disagrees: total_loss of worker",
        "stale": "graphs disagrees: ",
    }[fault]
    assert expected in line
    info = agent.update(_batch(cfg, pack, 3))  # training goes on, compiled without graphs
    assert info["total_loss"].shape == (pack,) and torch.isfinite(info["total_loss"]).all()
    assert agent.act(torch.randn(pack, 1, OBS)).shape == (pack, 1, ACT)


def test_sound_cuda_graphs_are_kept_their_draws_replayed_with_dropout_on(monkeypatch):
    """The compiled path's reference is the same pack's eager update and plan, from the same
    generator state: dropout stays on and the draws still match exactly."""
    monkeypatch.setattr(torch, "compile", fake_compile(None))
    agent = TDMPC2(tiny_config(), OBS, ACT, seeds=[1, 2])
    assert agent.cfg.dropout > 0
    agent.use_path(FastPath("graphs", pack=2))
    probe = AgentProbe(agent)
    fast, reference = probe.pair(agent.path)
    for name, value in reference.losses.items():
        assert torch.equal(fast.losses[name], value), name
    assert torch.equal(fast.action, reference.action)
    verdict = check_fast_path(agent)
    assert verdict.path == FastPath("graphs", pack=2) and verdict.sound
    assert [t.outcome for t in verdict.trials] == ["agrees"]


def test_graphs_are_compared_on_their_third_call_with_the_training_shapes(monkeypatch):
    calls = []
    real = AgentProbe._load

    def counted(self, agent, worker=None):
        calls.append(agent.cfg.batch_size)
        return real(self, agent, worker)

    monkeypatch.setattr(torch, "compile", fake_compile(None))
    monkeypatch.setattr(AgentProbe, "_load", counted)
    agent = TDMPC2(tiny_config(), OBS, ACT)
    agent.use_path(FastPath("graphs"))
    AgentProbe(agent).pair(agent.path)
    assert len(calls) == 4  # warm-up, record, replay, then the eager reference


def test_check_weights_are_random_everywhere_the_zeroed_heads_too():
    agent = TDMPC2(tiny_config(), OBS, ACT, seeds=[1, 2])
    state = agent.model.state_dict()
    weights = check_weights(state, seed=5)
    assert weights.keys() == {k for k, v in state.items() if v.is_floating_point()}
    for name, value in weights.items():
        assert value.shape == state[name].shape and value.dtype == state[name].dtype
        assert value.std() > 0, name
    assert weights["qs.layers.2.weight"].abs().min() > 0  # zero-initialised in the model
    assert (weights["q_scale"] >= 1).all() and (weights["q_scale"] < 2).all()
    again = check_weights(state, seed=5)
    assert all(torch.equal(again[k], v) for k, v in weights.items())
    other = check_weights(state, seed=6)
    assert not torch.equal(other["encoder.layers.0.weight"], weights["encoder.layers.0.weight"])


def test_a_path_asked_for_by_hand_is_kept_even_when_it_disagrees(monkeypatch):
    monkeypatch.setattr(torch, "compile", fake_compile("perturb"))
    agent = TDMPC2(tiny_config(), OBS, ACT, seeds=[1, 2])
    verdict = check_fast_path(agent, asked="graphs")
    assert verdict.path == FastPath("graphs", pack=2) == agent.path and not verdict.sound
    assert verdict.asked == "graphs" and "kept as asked" in verdict.line()
    verdict = check_fast_path(agent, asked="eager")
    assert agent.path == FastPath("eager", pack=2) and verdict.sound
