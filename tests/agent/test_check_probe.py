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
from helpers.tf32 import TF32Matmuls

import agent.agent as agent_module
import agent.check_probe as check_probe
import agent.planner as planner
from agent.agent import TDMPC2
from agent.check_probe import AgentProbe, check_fast_path, check_inputs, check_weights
from agent.layers import Layer
from agent.pixels import OBS_DIM
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
    moments = [
        t for o in (checked.optim, checked.pi_optim) for s in o.state.values() for t in s.values()
    ]
    verdict = check_fast_path(checked)
    assert verdict.sound and verdict.path == twin.path
    assert _equal(_state(checked), before)
    # In the same tensors (CUDA graphs replay from their addresses).
    after = [
        t for o in (checked.optim, checked.pi_optim) for s in o.state.values() for t in s.values()
    ]
    assert len(after) == len(moments) and all(a is b for a, b in zip(after, moments))
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
    for name, value in weights.items():  # unit-scale outputs, gains about 1, small biases
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "weight":
            fan_in = value.shape[-2]
            assert 0.8 < value.std() * fan_in**0.5 < 1.2, name
        elif leaf == "ln_weight":
            assert abs(value.mean() - 1) < 0.05 and 0.05 < value.std() < 0.15, name
        elif name != "q_scale":
            assert abs(value.mean()) < 0.05 and 0.05 < value.std() < 0.15, name
    assert AgentProbe(agent, seed=5).weights.keys() == weights.keys()
    assert all(torch.equal(AgentProbe(agent, seed=5).weights[k], v) for k, v in weights.items())
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


def test_the_checks_inputs_each_worker_its_own_rewards():
    cfg = dataclasses.replace(tiny_config(), episodic=True)
    agent = TDMPC2(cfg, OBS, ACT, seeds=[1, 2, 3])
    inputs = check_inputs(agent, batch=40, envs=2, seed=9)
    obs, action, reward, terminated = inputs.batch
    h = cfg.horizon
    assert obs.shape == (3, h + 1, 40, OBS) and action.shape == (3, h, 40, ACT)
    assert reward.shape == terminated.shape == (3, h, 40, 1)
    assert action.min() < -0.9 and action.max() > 0.9 and action.abs().max() <= 1
    assert not torch.allclose(reward[1] - 5, reward[0])  # a draw of its own, not an offset
    for k in range(3):  # worker k's rewards in [5k, 5k + 5)
        assert 5 * k <= reward[k].min() and reward[k].max() < 5 * k + 5
        assert reward[k].max() - reward[k].min() > 4
    assert set(terminated.unique().tolist()) == {0.0, 1.0} and 0.03 < terminated.mean() < 0.2
    assert inputs.obs.shape == (3, 2, OBS) and inputs.warm.shape == (3, 2, h + 1, ACT)
    assert inputs.warm.abs().max() <= 0.5 and inputs.warm.min() < -0.4 < 0.4 < inputs.warm.max()
    again = check_inputs(agent, batch=40, envs=2, seed=9)
    assert all(torch.equal(a, b) for a, b in zip(again.batch, inputs.batch))
    lone = check_inputs(TDMPC2(tiny_config(), OBS, ACT), batch=8, envs=1, seed=9)
    assert not lone.batch[3].any() and lone.batch[3].shape == (1, h, 8, 1)  # none terminates
    worker = inputs.worker(2)
    assert torch.equal(worker.batch[2], reward[2:3]) and torch.equal(worker.warm, inputs.warm[2:])


def test_an_episodic_pack_in_bf16_agrees_termination_loss_compared():
    cfg = dataclasses.replace(tiny_config(), episodic=True, bf16=True)
    agent = TDMPC2(cfg, OBS, ACT, seeds=[1, 2])
    fast, plain = AgentProbe(agent).pair(agent.path)
    assert "termination_loss" in plain.losses and (plain.losses["termination_loss"] > 0).all()
    assert check_fast_path(agent).trials[0].outcome == "agrees"


def test_the_eager_check_draws_from_its_own_streams_without_dropout_on_small_shapes(monkeypatch):
    """Dropout off (a pack draws its masks over all workers at once), the check's own seeds,
    and a small plan: at most 64 samples, a quarter of them elites in float32 (all in bf16),
    half the policy's, drawn within 0.5."""
    seen = []
    real = check_probe.step

    def watched(agent, inputs):
        models = [agent.model] + ([] if agent.threads is None else agent.threads.members)
        layers = [m for model in models for m in model.modules() if isinstance(m, Layer)]
        seen.append(
            (
                agent.cfg.num_samples,
                agent.cfg.num_elites,
                agent.cfg.num_pi_trajs,
                agent.cfg.max_std,
                {layer.dropout for layer in layers},
                [g.initial_seed() for g in agent.noise.generators],
                inputs.batch[0].shape[2],
            )
        )
        return real(agent, inputs)

    monkeypatch.setattr(check_probe, "step", watched)
    cfg = dataclasses.replace(
        tiny_config(), num_samples=100, num_elites=10, batch_size=48, bf16=False
    )
    agent = TDMPC2(cfg, OBS, ACT, seeds=[1, 2])
    probe = AgentProbe(agent, seed=70)
    probe.pair(agent.path)
    small = (64, 16, 32, 0.5, {0.0})
    assert seen[0] == (*small, [71, 72], 32)  # the pack
    assert seen[1:] == [(*small, [71], 32), (*small, [72], 32)]  # one lone agent per worker
    assert {layer.dropout for layer in agent.model.modules() if isinstance(layer, Layer)} == {
        0.0,
        cfg.dropout,
    }  # restored: dropout on the Qs' first layer, none elsewhere
    assert (agent.cfg.num_samples, agent.cfg.max_std) == (100, cfg.max_std)
    seen.clear()  # bf16: every sample an elite (its rounding would settle near-ties at the k-th)
    bf16 = TDMPC2(dataclasses.replace(cfg, bf16=True), OBS, ACT, seeds=[1, 2])
    AgentProbe(bf16, seed=70).pair(bf16.path)
    assert len(seen) == 3 and {elites for _, elites, *_ in seen} == {64}


def test_the_plain_path_is_float32_whatever_the_agent_computes_in():
    cfg = dataclasses.replace(tiny_config(), bf16=True)
    probe = AgentProbe(TDMPC2(cfg, OBS, ACT))
    plain = probe.plain()
    float32 = probe._eager(PLAIN)  # the agent itself made plain
    bf16 = probe._eager(probe.agent.path)
    assert torch.equal(plain.losses["total_loss"], float32.losses["total_loss"])
    assert torch.equal(plain.mean, float32.mean)
    assert not torch.equal(plain.losses["total_loss"], bf16.losses["total_loss"])
    assert probe.plain() is plain  # made once


def test_a_compiled_path_without_graphs_is_compared_on_its_first_call(monkeypatch):
    loads = []
    real = AgentProbe._load
    monkeypatch.setattr(torch, "compile", fake_compile(None))
    monkeypatch.setattr(
        AgentProbe, "_load", lambda self, a, w=None: loads.append(1) or real(self, a, w)
    )
    agent = TDMPC2(tiny_config(), OBS, ACT)
    AgentProbe(agent).pair(FastPath("compile"))
    assert len(loads) == 2  # one call, then the eager reference


def test_compiling_time_is_the_first_compiled_calls(monkeypatch):
    ticks = iter(range(1, 100))
    clock = {"now": 0.0}

    def perf_counter():  # each reading a second later than the last, and one more
        clock["now"] += next(ticks)
        return clock["now"]

    monkeypatch.setattr(torch, "compile", fake_compile(None))
    monkeypatch.setattr(check_probe.time, "perf_counter", perf_counter)
    agent = TDMPC2(tiny_config(), OBS, ACT)
    probe = AgentProbe(agent)
    probe.pair(FastPath("graphs"))
    assert probe.compile_seconds == 2.0  # readings 1 and 3: the first call's start and end
    probe.pair(FastPath("graphs"))
    # The first pair read 1, 3 (its first call), 6, 10 (the others' starts); then 15 and 21.
    assert probe.compile_seconds == 2.0 + 6.0


def test_a_pack_asked_to_run_eager_keeps_its_threads_and_one_that_cannot_split_says_so(
    monkeypatch,
):
    agent = TDMPC2(dataclasses.replace(tiny_config(), bf16=True), OBS, ACT, seeds=[1, 2])
    verdict = check_fast_path(agent, asked="eager")
    assert verdict.path == FastPath("eager", pack=2, threads=True, bf16=True) == agent.path
    mix_up_workers(monkeypatch)
    verdict = check_fast_path(agent, can_split=False)
    assert verdict.path == FastPath("eager", pack=2, threads=True) and not verdict.sound


def test_a_steps_weight_change_is_the_update_s():
    agent = TDMPC2(tiny_config(), OBS, ACT, seeds=[1, 2])
    inputs = check_inputs(agent, batch=8, envs=1, seed=3)
    before = {k: v.clone() for k, v in agent.model.named_parameters()}
    out = check_probe.step(agent, inputs)
    for name, value in agent.model.named_parameters():
        assert torch.equal(out.delta[name], value.detach() - before[name]), name
    assert out.delta["encoder.layers.0.weight"].abs().max() > 0
    assert out.action.shape == (2, 1, ACT) and out.mean.shape == (2, 1, agent.cfg.horizon, ACT)
    assert out.losses["total_loss"].shape == (2,)


def test_an_agent_takes_only_a_path_of_its_own_pack():
    agent = TDMPC2(tiny_config(), OBS, ACT, seeds=[1, 2])
    for path in (FastPath("eager"), FastPath("eager", pack=2, split=True)):
        with pytest.raises(ValueError, match="a pack of 2 cannot compute as"):
            agent.use_path(path)
    agent.use_path(FastPath("eager", pack=2))  # batched, as on a GPU
    assert agent.threads is None and agent.path == FastPath("eager", pack=2)
    agent.use_path(FastPath("eager", pack=2, threads=True, bf16=True))
    assert agent.threads is not None and agent.cfg.bf16
    threads = agent.threads
    agent.use_path(FastPath("eager", pack=2, threads=True))
    assert agent.threads is threads and not agent.cfg.bf16  # its threads kept


def test_the_path_a_compiled_agent_computes_on(monkeypatch):
    modes = []
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None, **o: modes.append(mode) or fn)
    agent = TDMPC2(tiny_config(), OBS, ACT)
    agent.use_path(FastPath("graphs"))
    assert agent.path == FastPath("graphs") and agent.compiled and agent.fused_update
    agent.use_path(FastPath("graphs"))  # the same mode: not compiled again
    agent.use_path(FastPath("compile"))
    assert agent.path == FastPath("compile")
    assert modes == ["reduce-overhead", "reduce-overhead", None, None]  # update, plan each
    agent.use_path(FastPath("eager"))
    assert agent.path == FastPath("eager") and not agent.compiled and not agent.fused_update
    assert agent._update_fn == agent._update


def test_compiling_draws_random_numbers_with_pytorchs_kernels(monkeypatch):
    """Inductor's fallback_random: a compiled call's draws are the eager ones, from the same
    generator state, which the check replays (checked with Inductor in test_graphs.py)."""
    monkeypatch.setattr(torch._inductor.config, "fallback_random", False)
    monkeypatch.setattr(torch, "compile", fake_compile(None))
    TDMPC2(tiny_config(), OBS, ACT).use_path(FastPath("compile"))
    assert torch._inductor.config.fallback_random is True


def _wrong_top_k_in_a_pack(monkeypatch):
    """A batched pack whose top-k takes the worst sequences as elites, best first as the right
    ones come (so that with every sample an elite it is the right top-k); a lone agent's is
    right."""
    real = planner.elites

    def elites(value, num_elites, temperature):
        if value.shape[0] == 1:
            return real(value, num_elites, temperature)
        worst = value.topk(num_elites, dim=-1, largest=False).indices.flip(-1)
        return worst, torch.softmax(temperature * value.gather(-1, worst), dim=-1)

    monkeypatch.setattr(planner, "elites", elites)


def test_a_wrong_top_k_of_the_elites_is_caught(monkeypatch):
    # The eager check's plan has fewer elites than samples in float32: with every sample an
    # elite, any top-k picks them all and the plan is the same.
    monkeypatch.setattr(TDMPC2, "cpu_threads", False)  # a batched pack, as on a GPU
    agent = TDMPC2(dataclasses.replace(tiny_config(), bf16=False), OBS, ACT, seeds=[1, 2])
    assert [t.outcome for t in check_fast_path(agent).trials] == ["agrees"]
    _wrong_top_k_in_a_pack(monkeypatch)
    verdict = check_fast_path(agent)
    assert [t.outcome for t in verdict.trials] == ["disagrees", "split"]
    assert verdict.trials[0].detail.startswith(("plan mean of worker", "action of worker"))


class _Recorded(AgentProbe):
    """The probe, keeping what each path it compared gave."""

    def __init__(self, agent, seed):
        super().__init__(agent, seed)
        self.pairs = {}

    def pair(self, path):
        self.pairs[path] = super().pair(path)
        return self.pairs[path]


@pytest.mark.parametrize("fault", ["perturb", "stale"])
def test_under_tf32_a_sound_pack_is_kept_and_faults_are_still_caught(fault, monkeypatch):
    # On CUDA both sides of the check run float32 matmuls in TF32 (agent.py's
    # matmul_precision), emulated here. A batched pack against lone agents is the arithmetic
    # in another order, which TF32's rounding can turn into another elite drawn as the action
    # (float32's bound on the action refused the sound pack), but not a loss 1 % off (CUDA
    # graphs that perturb it) or a stale input. Which seed's rounding reorders two near-tied
    # elites changes with torch's kernels, so the pack's draw is settled the other way here.
    monkeypatch.setattr(torch, "compile", fake_compile(fault))
    monkeypatch.setattr(TDMPC2, "cpu_threads", False)
    monkeypatch.setattr(check_probe, "tf32_matmuls", lambda agent: True)
    real_choice = planner.gumbel_choice

    def near_tie_settled_otherwise(weights, uniform):
        choice = real_choice(weights, uniform)
        return (choice + 1) % weights.shape[-1] if weights.shape[0] > 1 else choice

    monkeypatch.setattr(planner, "gumbel_choice", near_tie_settled_otherwise)
    probes = []
    seed = check_probe.CHECK_SEED
    monkeypatch.setattr(
        check_probe, "AgentProbe", lambda a: probes.append(_Recorded(a, seed)) or probes[-1]
    )
    cfg = dataclasses.replace(tiny_config(), bf16=False, iterations=6, batch_size=16)
    agent = TDMPC2(cfg, 24, 6, seeds=[1, 2])
    agent.use_path(FastPath("graphs", pack=2))  # as a CUDA agent starts
    with TF32Matmuls():
        verdict = check_fast_path(agent)
    # The eager pack (each compiled path's reference) agrees, the faulty graphs do not.
    assert [t.outcome for t in verdict.trials] == ["disagrees", "agrees"], verdict.line()
    assert verdict.path == FastPath("compile", pack=2) == agent.path
    fast, plain = probes[0].pairs[FastPath("eager", pack=2)]
    assert (fast.action - plain.action).abs().max() > 0.1  # sharp: another elite was drawn


def test_a_pixel_pack_in_bf16_agrees_and_is_left_as_found():
    """The pixel encoder's convolutions stay float32 under bf16 on a CPU; the check's random
    weights give them unit-scale outputs (fan-in: channels x kernel area), so its rounding
    stays within the tolerances, and the check puts everything back."""
    cfg = tiny_config(obs="rgb", bf16=True)
    agent = TDMPC2(cfg, OBS_DIM, ACT, seeds=[1, 2])
    agent.act(torch.randint(0, 256, (2, 1, OBS_DIM), dtype=torch.uint8), t0=True)
    before = _state(agent)
    verdict = check_fast_path(agent)
    assert [t.outcome for t in verdict.trials] == ["agrees"] and agent.cfg.bf16
    assert _equal(_state(agent), before)
    conv = check_weights(agent.model_state(0))["encoder.convs.0.weight"]
    assert 0.8 < float(conv.std() * (9 * 7 * 7) ** 0.5) < 1.2


@pytest.mark.parametrize("fault", ["perturb", "stale"])
def test_a_pixel_pack_with_faulty_cuda_graphs_falls_back_and_trains(fault, monkeypatch):
    monkeypatch.setattr(torch, "compile", fake_compile(fault))
    cfg = tiny_config(obs="rgb")
    agent = TDMPC2(cfg, OBS_DIM, ACT, seeds=[1, 2])
    agent.use_path(FastPath("graphs", pack=2))  # as a CUDA agent starts
    verdict = check_fast_path(agent)
    assert [t.outcome for t in verdict.trials] == ["disagrees", "agrees"]
    assert verdict.path == FastPath("compile", pack=2) == agent.path
    batch = check_inputs(agent, cfg.batch_size, 1, 3).batch
    assert batch[0].dtype == torch.uint8  # the check's observations are pixels
    info = agent.update(batch)
    assert torch.isfinite(info["total_loss"]).all()
