"""A pack of workers as one batched agent: the same as separate agents, merged inside, clipped
per worker, saved and resumed per worker."""

import dataclasses

import pytest
import torch
from conftest import random_batch, tiny_config

import agent.agent as agent_module
from agent.agent import TDMPC2, clip_per_worker

OBS, ACT = 5, 2
SEEDS = [3, 4, 5]


def _cfg(**overrides):
    # Dropout draws from torch's global stream, not the worker's: off where packs and lone
    # agents must draw the same numbers.
    return dataclasses.replace(tiny_config(), dropout=0.0, **overrides)


def _batch(cfg, seed=0):
    return random_batch(cfg, OBS, ACT, seed)


def _stack(batches):
    return tuple(torch.stack(parts) for parts in zip(*batches))


def _floats(state):
    return {k: v.clone() for k, v in state.items() if v.is_floating_point()}


def _mean(states):
    """The plain element-wise mean of several workers' float tensors."""
    return {k: torch.stack([s[k] for s in states]).mean(0) for k in states[0]}


def _distance(state, reference):
    """L2 norm of the difference over all tensors."""
    return float(torch.cat([(state[k] - reference[k]).flatten() for k in state]).norm())


def _same(a, b):
    """Equal element for element, NaN where the other has NaN (a buffer's first rows)."""
    return a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)


def _moments(agent, worker):
    """Worker `worker`'s Adam moments, both optimisers, in a fixed order."""
    out = []
    for optim in (agent.optim, agent.pi_optim):
        for group in optim.param_groups:
            for p in group["params"]:
                state = optim.state[p]
                out += [state["exp_avg"][worker].clone(), state["exp_avg_sq"][worker].clone()]
    return out


@pytest.mark.parametrize("batched", [False, True], ids=["threads", "batched"])
def test_a_pack_learns_and_plans_as_separate_agents_of_its_seeds(batched, monkeypatch):
    # batched: every layer as one bmm over the workers, as on a GPU (on a CPU a pack runs
    # each worker on a thread of its own).
    monkeypatch.setattr(TDMPC2, "cpu_threads", not batched)
    cfg = _cfg()
    pack = TDMPC2(cfg, OBS, ACT, seeds=SEEDS)
    lone = [TDMPC2(dataclasses.replace(cfg, seed=s), OBS, ACT) for s in SEEDS]
    for k, agent in enumerate(lone):
        for name, value in agent.model_state(0).items():
            assert torch.equal(pack.model_state(k)[name], value), (k, name)
    # Different seeds, different networks: a pack copying worker 0 everywhere would fail.
    key = "encoder.layers.0.weight"
    assert not torch.equal(pack.model_state(0)[key], pack.model_state(1)[key])

    obs = torch.randn(len(SEEDS), 4, OBS)
    planned = pack.act(obs, t0=True)
    assert planned.shape == (len(SEEDS), 4, ACT)
    for k, agent in enumerate(lone):
        assert torch.allclose(planned[k], agent.act(obs[k], t0=True), atol=1e-5), k

    for step in range(20):
        batches = [_batch(cfg, 100 * step + k) for k in range(len(SEEDS))]
        info = pack.update(_stack(batches))
        for k, agent in enumerate(lone):
            alone = agent.update(batches[k])
            for name in ("consistency_loss", "reward_loss", "value_loss", "pi_loss", "grad_norm"):
                assert info[name].shape == (len(SEEDS),)
                assert torch.allclose(info[name][k], alone[name], rtol=1e-4, atol=1e-5), (
                    step,
                    k,
                    name,
                )
    for k, agent in enumerate(lone):
        for name, value in agent.model_state(0).items():
            assert torch.allclose(pack.model_state(k)[name], value, atol=1e-5), (k, name)
        assert torch.equal(pack.noise.get_state(k), agent.noise.get_state(0)), k

    obs = torch.randn(len(SEEDS), 3, OBS)
    planned = pack.act(obs, t0=True, eval_mode=True)
    for k, agent in enumerate(lone):
        assert torch.allclose(planned[k], agent.act(obs[k], t0=True, eval_mode=True), atol=1e-4)


def _trained_pack(cfg, seeds, updates=3):
    pack = TDMPC2(cfg, OBS, ACT, seeds=seeds)
    for step in range(updates):
        pack.update(_stack([_batch(cfg, 10 * step + k) for k in range(len(seeds))]))
    return pack


def test_merge_averages_the_members_and_writes_the_mean_into_each():
    pack = _trained_pack(_cfg(), [3, 4, 5, 6])
    before = [_floats(pack.model_state(k)) for k in range(4)]
    control_moments = _moments(pack, 3)
    expected = _mean(before[:3])

    result = pack.merge_workers([0, 1, 2])

    assert result.participants == [0, 1, 2] and result.left_out == {}
    for name, value in expected.items():
        assert torch.allclose(result.mean[name], value, atol=1e-6), name
        for k in range(3):
            assert torch.allclose(pack.model_state(k)[name], value, atol=1e-6), (k, name)
        # The control worker, not in the list, keeps its own networks and moments.
        assert torch.equal(pack.model_state(3)[name], before[3][name]), name
    assert all(torch.equal(a, b) for a, b in zip(_moments(pack, 3), control_moments))


def test_merge_reports_each_participants_distance_to_the_mean():
    # Each participant's L2 distance to the mean, as the file backend reports it too.
    pack = _trained_pack(_cfg(), [3, 4, 5])
    before = [_floats(pack.model_state(k)) for k in range(3)]
    mean = _mean(before)
    result = pack.merge_workers([0, 1, 2])
    assert sorted(result.distances) == [0, 1, 2]
    for k in range(3):
        assert result.distances[k] == pytest.approx(_distance(before[k], mean), rel=1e-4)


def test_merge_leaves_out_a_non_finite_member_and_resets_it():
    pack = _trained_pack(_cfg(), [3, 4, 5, 6])
    with torch.no_grad():
        pack.model.dynamics.layers[0].weight[1, 0, 0] = float("nan")
    before = [_floats(pack.model_state(k)) for k in range(4)]
    moments = [_moments(pack, k) for k in range(4)]
    assert any(m.abs().sum() > 0 for m in moments[1])  # updates gave it moments to zero

    result = pack.merge_workers([0, 1, 2])

    assert result.participants == [0, 2]
    assert list(result.left_out) == [1] and "non-finite" in result.left_out[1]
    expected = _mean([before[0], before[2]])
    for name, value in expected.items():
        assert torch.isfinite(value).all(), name
        for k in range(3):  # the left-out member too: reset to the others' mean
            assert torch.allclose(pack.model_state(k)[name], value, atol=1e-6), (k, name)
        assert torch.equal(pack.model_state(3)[name], before[3][name]), name
    assert all((m == 0).all() for m in _moments(pack, 1))
    for k in (0, 2, 3):  # the others keep their Adam moments
        assert all(torch.equal(a, b) for a, b in zip(_moments(pack, k), moments[k])), k


def test_merge_of_only_non_finite_members_changes_nothing():
    pack = _trained_pack(_cfg(), [3, 4, 5], updates=1)
    with torch.no_grad():
        pack.model.encoder.layers[0].bias[0, 0] = float("inf")
        pack.model.pi.layers[1].weight[1, 0, 0] = float("nan")
    before = [_floats(pack.model_state(k)) for k in range(3)]
    assert pack.merge_workers([0, 1]) is None
    for k in range(3):
        for name, value in before[k].items():
            assert _same(pack.model_state(k)[name], value), (k, name)


def _global_clip(params, max_norm):
    """One clip over the whole pack: what per-worker clipping must not be."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return norm.expand(next(p for p in params if p.grad is not None).shape[0])


def _one_update(monkeypatch, cfg, wild: bool, clip=clip_per_worker):
    """A fresh pack after one update; worker 1's gradients scaled by 1e6 before the clip
    when `wild` (the model's losses are bounded by design: huge inputs or rewards do not give
    huge gradients, so the gradient is made huge where the update clips it)."""

    def clip_wild(params, max_norm):
        if wild:
            for p in params:
                if p.grad is not None:
                    p.grad[1] *= 1e6
        return clip(params, max_norm)

    monkeypatch.setattr(agent_module, "clip_per_worker", clip_wild)
    pack = TDMPC2(cfg, OBS, ACT, seeds=SEEDS)
    info = pack.update(_stack([_batch(cfg, k) for k in range(len(SEEDS))]))
    return pack, info


def test_a_worker_with_huge_gradients_does_not_change_the_others_updates(monkeypatch):
    cfg = _cfg(grad_clip_norm=1e-3)
    calm, calm_info = _one_update(monkeypatch, cfg, wild=False)
    wild, wild_info = _one_update(monkeypatch, cfg, wild=True)
    for name in ("grad_norm", "pi_grad_norm"):
        assert (calm_info[name] > cfg.grad_clip_norm).all(), name  # the clip bites for all
        assert wild_info[name][1] > 1e5 * calm_info[name][1], name
    for name, value in calm.model.state_dict().items():
        for k in (0, 2):
            assert torch.equal(wild.model.state_dict()[name][k], value[k]), (k, name)
    for k in (0, 2):
        assert all(torch.equal(a, b) for a, b in zip(_moments(wild, k), _moments(calm, k)))
    # Worker 1's own step is that of a clipped gradient: finite, however wild its gradient.
    key = "encoder.layers.0.weight"
    assert torch.isfinite(wild.model_state(1)[key]).all()

    # The check is sharp: one clip over the whole pack would move workers 0 and 2.
    coupled, _ = _one_update(monkeypatch, cfg, wild=True, clip=_global_clip)
    assert not torch.equal(coupled.model_state(0)[key], calm.model_state(0)[key])


def test_clip_per_worker_clips_each_worker_as_torch_clips_it_alone():
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 4, 5), (3, 7), (3, 2, 3, 4)]
    params = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
        p.grad[1] *= 1e6  # worker 1: a huge gradient
        p.grad[2] *= 1e-3  # worker 2: under the limit, left as it is
    unused = torch.nn.Parameter(torch.zeros(3, 2))  # no gradient: skipped, as torch skips it
    original = [p.grad.clone() for p in params]

    norms = clip_per_worker(params + [unused], max_norm=1.0)

    assert norms.shape == (3,) and unused.grad is None
    for k in range(3):
        alone = [torch.nn.Parameter(p[k].detach().clone()) for p in params]
        for a, grad in zip(alone, original):
            a.grad = grad[k].clone()
        norm = torch.nn.utils.clip_grad_norm_(alone, max_norm=1.0)
        assert norms[k] == pytest.approx(float(norm), rel=1e-5), k
        for a, p in zip(alone, params):
            assert torch.allclose(p.grad[k], a.grad, rtol=1e-5, atol=1e-7), k
    assert float(torch.stack([p.grad[0].norm() for p in params]).norm()) == pytest.approx(1.0)
    assert all(torch.equal(p.grad[2], grad[2]) for p, grad in zip(params, original))


def test_a_pack_refuses_unpacked_observations():
    pack = TDMPC2(_cfg(), OBS, ACT, seeds=SEEDS)
    with pytest.raises(ValueError, match="pack of 3"):
        pack.act(torch.randn(4, OBS))
    with pytest.raises(ValueError, match="pack of 3"):
        pack.act(torch.randn(OBS))


def test_a_pack_refuses_observations_for_another_number_of_workers():
    pack = TDMPC2(_cfg(), OBS, ACT, seeds=SEEDS)
    with pytest.raises(ValueError, match="pack of 3"):
        pack.act(torch.randn(2, 3, OBS), t0=True)
    with pytest.raises(ValueError, match="expected 5"):
        pack.act(torch.randn(3, 2, OBS + 1), t0=True)
    batch = [torch.zeros(2, *shape) for shape in ((3, 4, OBS), (2, 4, ACT), (2, 4, 1), (2, 4, 1))]
    with pytest.raises(ValueError, match="pack of 3 updates"):
        pack.update(tuple(batch))


def test_a_cpu_pack_workers_threads_see_the_packs_weights_in_place():
    # A worker's thread runs a lone model over views of the pack's weights: merges and Adam
    # steps, all in place on the pack, reach it with nothing copied.
    cfg = _cfg()
    pack = TDMPC2(cfg, OBS, ACT, seeds=SEEDS)
    assert pack.threads is not None and len(pack.threads.members) == len(SEEDS)
    member = pack.threads.members[1]

    def same_as_worker_1():  # the member's tensors are a lone agent's: (1, ...)
        mine = member.state_dict()
        return all(torch.equal(mine[k][0], v) for k, v in pack.model_state(1).items())

    assert same_as_worker_1()
    pack.update(_stack([_batch(cfg, k) for k in range(len(SEEDS))]))
    assert same_as_worker_1()
    before = member.state_dict()["encoder.layers.0.weight"].clone()
    pack.merge_workers([0, 1, 2])
    assert same_as_worker_1() and not torch.equal(
        before, pack.model_state(1)["encoder.layers.0.weight"]
    )
    assert all(p.grad is None for p in member.parameters())  # gathered into the pack's


def test_a_batched_pack_of_two_plans_as_its_two_agents(monkeypatch):
    # Two workers and a horizon of three: no axis of the plan's tensors has another's length,
    # so weights broadcast over the wrong one cannot pass unnoticed.
    monkeypatch.setattr(TDMPC2, "cpu_threads", False)
    cfg = _cfg(horizon=3)
    pack = TDMPC2(cfg, OBS, ACT, seeds=[3, 4])
    lone = [TDMPC2(dataclasses.replace(cfg, seed=s), OBS, ACT) for s in (3, 4)]
    # 4 envs, as above: with an odd count the kernels' float rounding differs between a pack
    # and a lone agent, and MPPI's elite choice can turn that into another action.
    obs = torch.randn(2, 4, OBS)
    planned = pack.act(obs, t0=True)
    for k, agent in enumerate(lone):
        assert torch.allclose(planned[k], agent.act(obs[k], t0=True), atol=1e-5), k
        assert torch.allclose(pack._warm_mean[k], agent._warm_mean[0], atol=1e-5), k


def test_a_bf16_cpu_packs_workers_plan_and_learn_under_autocast(monkeypatch):
    # Autocast is per thread: each worker's thread must enter it, not only the caller's.
    import agent.agent as agent_module

    seen = {"plan": [], "loss": []}
    real_plan, real_loss = agent_module.plan, agent_module.world_model_loss

    def plan(*args, **kwargs):
        seen["plan"].append(torch.is_autocast_enabled("cpu"))
        return real_plan(*args, **kwargs)

    def world_model_loss(*args, **kwargs):
        seen["loss"].append(torch.is_autocast_enabled("cpu"))
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(agent_module, "plan", plan)
    monkeypatch.setattr(agent_module, "world_model_loss", world_model_loss)
    cfg = _cfg(bf16=True)
    pack = TDMPC2(cfg, OBS, ACT, seeds=[3, 4])
    assert pack.threads is not None
    pack.act(torch.randn(2, 4, OBS), t0=True)
    pack.update(_stack([_batch(cfg, k) for k in range(2)]))
    assert seen == {"plan": [True, True], "loss": [True, True]}


def _copy(agent, worker, cfg, weights_only):
    """A lone agent with `worker`'s networks and random stream, and its Adam state (step count
    included) or a new Adam's."""
    lone = TDMPC2(dataclasses.replace(cfg, seed=agent.seeds[worker]), OBS, ACT)
    lone.load_state_dict(agent.state_dict(worker), weights_only=weights_only)
    lone.noise.set_state(0, agent.noise.get_state(worker))
    return lone


def _adam_steps(agent, worker):
    return {float(s["step"]) for s in agent.state_dict(worker)["optim"]["state"].values()}


@pytest.mark.parametrize("pack", [1, 3], ids=["lone", "pack"])
def test_a_reset_worker_steps_as_a_new_adam(pack, monkeypatch):
    # After a reset (non-finite weights: left out of a merge, given the mean, moments zeroed)
    # a worker's next updates are a new Adam's. With the pack's step count (5 here) its bias
    # correction would be the pack's, and its moves other sizes (about 3x once that count is
    # in the thousands). The other workers go on with their own Adam state.
    monkeypatch.setattr(TDMPC2, "cpu_threads", False)
    cfg = _cfg()
    agent = _trained_pack(cfg, SEEDS[:pack], updates=5)
    reset = pack - 1
    finite = _floats(agent.model_state(0))
    with torch.no_grad():
        agent.model.dynamics.layers[0].weight[reset, 0, 0] = float("nan")
    if pack == 1:  # nothing finite to merge: reset to other weights, as a merge round does
        agent.assign(finite, [0], reset=[0])
    else:
        assert list(agent.merge_workers(range(pack)).left_out) == [reset]
    lone = [_copy(agent, k, cfg, weights_only=k == reset) for k in range(pack)]
    updates = 3
    for step in range(updates):
        batches = [_batch(cfg, 50 + 10 * step + k) for k in range(pack)]
        before = [_floats(agent.model_state(k)) for k in range(pack)]
        agent.update(_stack(batches))
        for k in range(pack):
            lone[k].update(batches[k])
            for name, value in lone[k].model_state(0).items():
                moved = agent.model_state(k)[name] - before[k][name]
                expected = value - before[k][name]
                assert torch.allclose(moved, expected, rtol=1e-4, atol=1e-6), (step, k, name)
    assert _adam_steps(agent, reset) == {updates}  # saved as a lone agent's own count
    for k in range(reset):
        assert _adam_steps(agent, k) == {5 + updates}


def test_a_pack_resumed_from_checkpoints_keeps_a_reset_workers_own_adam_count(monkeypatch):
    """A worker reset alone 2 updates before its pack was checkpointed resumes (each worker
    loaded from its own state, in either order) stepping as its own Adam: as a lone agent
    resumed from its checkpoint steps. Under the pack's count its bias correction would be
    the pack's (3.2x too large a step 100 updates after a reset, at the pack's thousands)."""
    monkeypatch.setattr(TDMPC2, "cpu_threads", False)
    cfg = _cfg()
    agent = _trained_pack(cfg, SEEDS[:2], updates=5)
    with torch.no_grad():
        agent.model.dynamics.layers[0].weight[1, 0, 0] = float("nan")
    agent.merge_workers(range(2))  # worker 1 left out and reset: its own count from here
    agent.update(_stack([_batch(cfg, 60 + k) for k in range(2)]))
    agent.update(_stack([_batch(cfg, 70 + k) for k in range(2)]))
    saved = [agent.state_dict(k) for k in range(2)]
    assert [_adam_steps(agent, k) for k in range(2)] == [{7.0}, {2.0}]
    for order in ((0, 1), (1, 0)):
        resumed = TDMPC2(cfg, OBS, ACT, seeds=SEEDS[:2])
        for k in order:
            resumed.load_state_dict(saved[k], worker=k)
        lone = [TDMPC2(dataclasses.replace(cfg, seed=SEEDS[k]), OBS, ACT) for k in range(2)]
        for k in range(2):
            lone[k].load_state_dict(saved[k])
            resumed.noise.set_state(k, lone[k].noise.get_state(0))
        for step in range(2):
            batches = [_batch(cfg, 80 + 10 * step + k) for k in range(2)]
            before = [_floats(resumed.model_state(k)) for k in range(2)]
            resumed.update(_stack(batches))
            for k in range(2):
                lone[k].update(batches[k])
                for name, value in lone[k].model_state(0).items():
                    moved = resumed.model_state(k)[name] - before[k][name]
                    expected = value - before[k][name]
                    assert torch.allclose(moved, expected, rtol=1e-4, atol=1e-6), (order, k, name)
        assert [_adam_steps(resumed, k) for k in range(2)] == [{9.0}, {4.0}]
