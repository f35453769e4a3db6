import pytest
import torch
from conftest import random_batch

from agent.agent import TDMPC2
from agent.errors import ConfigError, WeightsError
from agent.knobs import KnobValues
from agent.math import TwoHot
from agent.planner import plan

OBS, ACT = 5, 2


def _batch(cfg, seed=0):
    return random_batch(cfg, OBS, ACT, seed)


def test_losses_finite_and_decreasing_on_a_fixed_batch(tiny_cfg):
    agent = TDMPC2(tiny_cfg, OBS, ACT)
    batch = _batch(tiny_cfg)
    history = [agent.update(batch) for _ in range(60)]
    for name in ("consistency_loss", "reward_loss", "value_loss", "total_loss", "pi_loss"):
        values = torch.stack([h[name] for h in history])
        assert torch.isfinite(values).all(), name
        first, last = values[:5].mean(), values[-5:].mean()
        assert last < first, f"{name} did not decrease: {first:.4f} -> {last:.4f}"


def test_target_qs_move_by_polyak_tau(tiny_cfg):
    agent = TDMPC2(tiny_cfg, OBS, ACT)
    online = [p.detach().clone() for p in agent.model.qs.parameters()]
    with torch.no_grad():
        for p in agent.model.qs.parameters():
            p.add_(1.0)
    before = [p.clone() for p in agent.model.target_qs.parameters()]
    agent.model.update_targets(0.01)
    for old, new, q in zip(before, agent.model.target_qs.parameters(), online):
        assert torch.allclose(new, old + 0.01 * (q + 1.0 - old), atol=1e-6)
    assert not any(p.requires_grad for p in agent.model.target_qs.parameters())


def test_act_respects_bounds_and_batches(tiny_cfg):
    agent = TDMPC2(tiny_cfg, OBS, ACT)
    single = agent.act(torch.randn(OBS), t0=True)
    assert single.shape == (ACT,) and single.abs().max() <= 1
    several = agent.act(torch.randn(3, OBS), t0=torch.tensor([True, False, True]))
    assert several.shape == (3, ACT) and several.abs().max() <= 1
    agent.set_knobs(horizon=5, num_samples=32, num_elites=4, iterations=1)
    assert agent.act(torch.randn(OBS)).abs().max() <= 1
    assert agent._warm_mean.shape == (1, 1, 5, ACT)  # (workers, envs, horizon, action)


def test_warm_start_shifts_previous_mean_and_resets_at_episode_start(tiny_cfg):
    agent = TDMPC2(tiny_cfg, OBS, ACT)
    agent.act(torch.randn(2, OBS), t0=True)
    prev = agent._warm_mean.clone()
    warm = agent._shifted_warm_mean(2, torch.tensor([[False, True]]))[0]
    assert torch.equal(warm[0, :-1], prev[0, 0, 1:])
    assert (warm[0, -1] == 0).all() and (warm[1] == 0).all()


def test_an_evaluation_leaves_training_its_own_warm_start(tiny_cfg):
    """Evaluation runs in the middle of a training episode; the next training plan starts from
    training's last plan mean, shifted, and not from the evaluation's."""
    agent = TDMPC2(tiny_cfg, OBS, ACT)
    agent.act(torch.randn(OBS), t0=True)
    agent.act(torch.randn(OBS))
    training = agent._warm_mean.clone()
    for t in range(3):
        agent.act(torch.randn(OBS) * 3, t0=t == 0, eval_mode=True)
    assert not torch.allclose(agent._eval_warm_mean, training)
    warm = agent._shifted_warm_mean(1, torch.tensor([[False]]))
    assert torch.equal(warm[0, 0, :-1], training[0, 0, 1:])
    assert torch.equal(agent._shifted_warm_mean(1, torch.tensor([[True]])), torch.zeros_like(warm))
    # and the evaluation goes on from its own last plan, not from training's
    evaluating = agent._shifted_warm_mean(1, torch.tensor([[False]]), eval_mode=True)
    assert torch.equal(evaluating[0, 0, :-1], agent._eval_warm_mean[0, 0, 1:])


def test_planner_finds_the_rewarded_action(tiny_cfg):
    """With reward -|a - 0.6| per step and no terminal value, MPPI must converge near 0.6."""
    agent = TDMPC2(tiny_cfg, OBS, ACT)
    two_hot = TwoHot(tiny_cfg.num_bins, tiny_cfg.vmin, tiny_cfg.vmax)
    model = agent.model

    def reward_logits(z, a):
        reward = -(a - 0.6).abs().sum(-1, keepdim=True)
        return two_hot.encode(reward).clamp_min(1e-30).log()

    model.reward_logits = reward_logits
    knobs = agent.plan_knobs()
    knobs = knobs.__class__(**{**knobs.__dict__, "iterations": 8, "num_pi_trajs": 0})
    with torch.no_grad():
        action, mean = plan(
            model,
            two_hot,
            torch.randn(1, 1, OBS),
            torch.zeros(1, 1, knobs.horizon, ACT),
            knobs,
            eval_mode=True,
            noise=agent.noise,
        )
    assert mean.shape == (1, 1, knobs.horizon, ACT)
    assert torch.allclose(action, torch.full_like(action, 0.6), atol=0.1), action


def test_bad_knob_is_refused_and_nothing_changes(tiny_cfg):
    agent = TDMPC2(tiny_cfg, OBS, ACT)
    before = agent.knobs
    with pytest.raises(ConfigError, match="iterations"):
        agent.set_knobs(horizon=4, iterations=0)
    assert agent.knobs == before


def test_a_runs_checked_values_are_taken_as_they_are_and_reach_the_planner(tiny_cfg):
    """A worker hands its agent the KnobValues its run checked: the agent's layer is taken (the
    merge frequency is the worker's), the config still checks across fields, and every field
    of the plan is the config's of the same name."""
    agent = TDMPC2(tiny_cfg, OBS, ACT)
    agent.set_knobs(KnobValues({"horizon": 2, "num_samples": 40, "merge_every": 77}))
    knobs = agent.plan_knobs()
    assert (knobs.horizon, knobs.num_samples) == (2, 40)
    assert "merge_every" not in agent.knobs
    for name, value in vars(knobs).items():
        wanted = (
            agent.cfg.resolved_iterations(ACT) if name == "iterations" else getattr(agent.cfg, name)
        )
        assert value == wanted, name
    before = agent.knobs
    with pytest.raises(ConfigError, match="num_elites"):
        agent.set_knobs(KnobValues({"num_elites": 64}))  # over the 40 samples
    assert agent.knobs == before
    with pytest.raises(ConfigError, match="iterations"):  # the values taken only with the rest
        agent.set_knobs(KnobValues({"horizon": 4}), iterations=0)
    assert agent.knobs == before


def test_state_dict_round_trip_and_mismatch(tiny_cfg):
    agent = TDMPC2(tiny_cfg, OBS, ACT)
    agent.update(_batch(tiny_cfg))
    other = TDMPC2(tiny_cfg, OBS, ACT)
    other.load_state_dict(agent.state_dict())
    obs = torch.randn(1, 4, OBS)
    assert torch.equal(agent.model.encode(obs), other.model.encode(obs))
    with pytest.raises(WeightsError, match="obs/action dims"):
        TDMPC2(tiny_cfg, OBS + 1, ACT).load_state_dict(agent.state_dict())
    bigger = TDMPC2(tiny_cfg.__class__(**{**tiny_cfg.__dict__, "mlp_dim": 128}), OBS, ACT)
    with pytest.raises(WeightsError, match="model size"):
        bigger.load_state_dict(agent.state_dict())
    with pytest.raises(WeightsError, match="format"):
        other.load_state_dict({"model": {}})
    older = agent.state_dict()  # Q biases saved as (E, 1, out), as before packs: still read
    older["model"] = {
        k: v.unsqueeze(1) if k.startswith("qs.") and k.endswith("bias") else v
        for k, v in older["model"].items()
    }
    other.load_state_dict(older)
    assert torch.equal(other.model.qs.layers[0].bias, agent.model.qs.layers[0].bias)
    without_model = {k: v for k, v in agent.state_dict().items() if k != "model"}
    with pytest.raises(WeightsError, match="do not match this model"):
        other.load_state_dict(without_model)
    poisoned = agent.state_dict()
    key = next(iter(poisoned["model"]))
    poisoned["model"][key] = poisoned["model"][key] * float("nan")
    with pytest.raises(WeightsError, match="non-finite"):
        other.load_state_dict(poisoned)


def test_policy_only_mode_acts(tiny_cfg):
    cfg = tiny_cfg.__class__(**{**tiny_cfg.__dict__, "mpc": False})
    agent = TDMPC2(cfg, OBS, ACT)
    assert agent.act(torch.randn(OBS), eval_mode=True).abs().max() <= 1


def test_episodic_mode_learns_termination(tiny_cfg):
    cfg = tiny_cfg.__class__(**{**tiny_cfg.__dict__, "episodic": True})
    agent = TDMPC2(cfg, OBS, ACT)
    obs, action, reward, terminated = _batch(cfg)
    terminated[-1, : cfg.batch_size // 2] = 1.0
    history = [agent.update((obs, action, reward, terminated)) for _ in range(40)]
    losses = torch.stack([h["termination_loss"] for h in history])
    assert torch.isfinite(losses).all() and losses[-5:].mean() < losses[:5].mean()
    assert agent.act(torch.randn(OBS), t0=True).abs().max() <= 1


def _recording_planner(monkeypatch):
    """Wrap the planner's rollout and terminal_value so a test sees what each one gets: the
    action sequences rolled out, and the rollouts given a terminal value."""
    import agent.planner as planner

    calls = {"rollout": [], "terminal": []}
    real_rollout, real_terminal = planner.rollout, planner.terminal_value

    def rollout(model, two_hot, z0, actions, gamma):
        calls["rollout"].append(actions.clone())
        return real_rollout(model, two_hot, z0, actions, gamma)

    def terminal_value(model, two_hot, rolled, noise):
        calls["terminal"].append(rolled)
        return real_terminal(model, two_hot, rolled, noise)

    monkeypatch.setattr(planner, "rollout", rollout)
    monkeypatch.setattr(planner, "terminal_value", terminal_value)
    return calls


def test_policy_trajectories_are_valued_again_in_every_iteration(tiny_cfg, monkeypatch):
    # Reference: each MPPI iteration values all num_samples sequences together, the policy
    # trajectories included (a new terminal policy action and the iteration's Q pair). Their
    # rewards and last latents do not change, so they are rolled out once.
    agent = TDMPC2(tiny_cfg.__class__(**{**tiny_cfg.__dict__, "iterations": 3}), OBS, ACT)
    calls = _recording_planner(monkeypatch)
    agent.act(torch.randn(OBS))
    k = agent.plan_knobs()
    assert [c.shape[3] for c in calls["rollout"]] == [k.num_pi_trajs] + [
        k.num_samples - k.num_pi_trajs
    ] * k.iterations
    assert [r.z.shape[2] for r in calls["terminal"]] == [k.num_samples] * k.iterations
    # The same policy trajectories (their last latents) lead every iteration's set.
    first = calls["terminal"][0].z[:, :, : k.num_pi_trajs]
    for rolled in calls["terminal"][1:]:
        assert torch.equal(rolled.z[:, :, : k.num_pi_trajs], first)
    # Valued the same way as all at once: the join does not change a sequence's return.
    import agent.planner as planner

    z0 = agent.model.encode(torch.randn(1, 1, OBS)).unsqueeze(2)
    pi, sampled = calls["rollout"][0], calls["rollout"][1]
    joined = planner.Rollout.join(
        planner.rollout(agent.model, agent.two_hot, z0, pi, k.gamma),
        planner.rollout(agent.model, agent.two_hot, z0, sampled, k.gamma),
    )
    whole = planner.rollout(agent.model, agent.two_hot, z0, torch.cat([pi, sampled], 3), k.gamma)
    assert torch.allclose(joined.ret, whole.ret, atol=1e-5)
    assert torch.allclose(joined.z, whole.z, atol=1e-5)


def test_evaluation_acts_with_a_drawn_elite_not_the_plan_mean(tiny_cfg, monkeypatch):
    # Reference: in evaluation too one elite is drawn by its score (Gumbel); only the
    # exploration noise is left out. The mean of the elites is (almost surely) none of them.
    agent = TDMPC2(tiny_cfg, OBS, ACT)
    calls = _recording_planner(monkeypatch)
    for seed in range(3):
        calls["rollout"].clear()
        torch.manual_seed(seed)
        action = agent.act(torch.randn(OBS), t0=True, eval_mode=True)
        # Step 0 of the policy trajectories and of the last iteration's sampled sequences.
        first_actions = torch.cat([calls["rollout"][0][0, 0, 0], calls["rollout"][-1][0, 0, 0]])
        distance = (first_actions - action).abs().sum(-1).min()
        assert distance < 1e-6, f"eval action is not a candidate's first action ({distance})"
        assert not torch.allclose(action, agent._eval_warm_mean[0, 0, 0], atol=1e-4)


def test_a_shorter_horizon_keeps_the_warm_start_it_has_room_for(tiny_cfg):
    agent = TDMPC2(tiny_cfg.__class__(**{**tiny_cfg.__dict__, "horizon": 5}), OBS, ACT)
    agent.act(torch.randn(OBS), t0=True)
    prev = agent._warm_mean.clone()
    agent.set_knobs(horizon=3)
    warm = agent._shifted_warm_mean(1, torch.tensor([[False]]))
    assert torch.equal(warm[0, 0], prev[0, 0, 1:4])


def test_a_lone_agent_answers_with_plain_numbers(tiny_cfg):
    info = TDMPC2(tiny_cfg, OBS, ACT).update(_batch(tiny_cfg))
    assert all(v.dim() == 0 for v in info.values())


def test_bf16_autocasts_on_the_cpu_only_when_asked(tiny_cfg):
    for bf16 in (False, True):
        agent = TDMPC2(tiny_cfg.__class__(**{**tiny_cfg.__dict__, "bf16": bf16}), OBS, ACT)
        with agent._autocast():
            assert torch.is_autocast_enabled("cpu") == bf16
            if bf16:
                assert torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_the_device_auto_is_the_cpu_without_a_gpu_and_cuda_is_refused_there(monkeypatch):
    from agent.agent import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without a GPU
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    for name in ("cuda", "cuda:1"):
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            resolve_device(name)


def test_a_pack_counts_adams_steps_of_its_furthest_worker_and_a_lone_agent_its_own(tiny_cfg):
    import dataclasses

    cfg = dataclasses.replace(tiny_cfg, dropout=0.0)
    trained = {}
    for steps in (3, 5):
        agent = TDMPC2(cfg, OBS, ACT)
        for _ in range(steps):
            agent.update(_batch(cfg))
        trained[steps] = agent.state_dict()

    def steps_of(agent):
        return {float(s["step"]) for s in agent.optim.state.values()}

    pack = TDMPC2(cfg, OBS, ACT, seeds=[1, 2])
    pack.load_state_dict(trained[5], worker=0)
    pack.load_state_dict(trained[3], worker=1)
    assert steps_of(pack) == {5.0}
    lone = TDMPC2(cfg, OBS, ACT)
    lone.load_state_dict(trained[5])
    lone.load_state_dict(trained[3])
    assert steps_of(lone) == {3.0}


def test_a_bf16_update_and_plan_stay_close_to_float32_on_the_same_weights(tiny_cfg):
    import dataclasses

    cfg = dataclasses.replace(tiny_cfg, dropout=0.0)
    fp32 = TDMPC2(cfg, OBS, ACT)
    bf16 = TDMPC2(dataclasses.replace(cfg, bf16=True), OBS, ACT)
    bf16.load_state_dict(fp32.state_dict())
    batch = _batch(cfg)
    ours, theirs = fp32.update(batch), bf16.update(batch)
    for name, value in ours.items():
        assert torch.isfinite(theirs[name]).all(), name
        assert float(theirs[name]) == pytest.approx(float(value), rel=0.1, abs=0.05), name
    # The policy's deterministic actions on the same observations are close; the planner's
    # (an elite drawn by rank, chaotic on untrained weights) stays finite and in range.
    obs = torch.randn(1, 16, OBS, generator=torch.Generator().manual_seed(3))  # a pack of 1
    eps = torch.zeros(1, 16, ACT)
    with torch.no_grad():
        mean32 = fp32.model.policy(fp32.model.encode(obs), eps).mean
        with bf16._autocast():
            mean16 = bf16.model.policy(bf16.model.encode(obs), eps).mean.float()
    assert (mean16 - mean32).abs().max() < 0.02  # the actions spread about 0.12
    planned = bf16.act(obs[0, 0], t0=True, eval_mode=True)
    assert torch.isfinite(planned).all() and planned.abs().max() <= 1.0
