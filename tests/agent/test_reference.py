"""agent/ against TD-MPC2 written out plainly (tests/agent/reference.py), on tiny shapes with
every weight drawn at random, so that the two target Qs, the Q ensemble's members, the reward
head and the policy all differ and each fact of the method changes the numbers."""

import copy

import pytest
import torch
from conftest import random_batch, tiny_config
from reference import (
    Optimisers,
    decode,
    discount,
    mlp,
    plan,
    policy,
    policy_loss,
    two_hot,
    update,
    world_model_loss,
)

from agent import losses
from agent import planner as agent_planner
from agent.agent import TDMPC2
from agent.math import TwoHot
from agent.noise import PackNoise

OBS, ACT = 5, 3
SEED = 7


def small(**overrides):
    base = dict(
        seed=SEED,
        enc_dim=16,
        mlp_dim=24,
        latent_dim=16,
        num_q=5,
        batch_size=6,
        dropout=0.0,  # dropout's masks are the only draws the reference cannot repeat
        num_samples=12,
        num_elites=4,
        num_pi_trajs=3,
        iterations=3,
        temperature=0.5,
    )
    return tiny_config(**{**base, **overrides})


def randomised(agent: TDMPC2, scale: float = 0.4) -> TDMPC2:
    """Every weight, LayerNorm affine and target weight drawn at random (zero-initialised last
    layers would hide which Q is used)."""
    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for p in agent.model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale + (p == 1).float())
    return agent


def batch(cfg, terminal_every: int = 0, reward_scale: float = 1.0):
    obs, action, reward, terminated = random_batch(cfg, OBS, ACT, seed=3)
    if terminal_every:
        terminated = torch.zeros_like(terminated)
        terminated[-1, ::terminal_every] = 1.0
    return obs, action, reward * reward_scale, terminated


def close(a, b, tol=1e-4):
    return torch.allclose(
        torch.as_tensor(a).float(), torch.as_tensor(b).float(), atol=tol, rtol=tol
    )


@pytest.mark.parametrize("episodic", [False, True])
def test_the_world_model_loss_is_the_published_one(episodic):
    cfg = small(episodic=episodic)
    agent = randomised(TDMPC2(cfg, OBS, ACT))
    obs, action, reward, terminated = batch(cfg, terminal_every=2)
    two = TwoHot(cfg.num_bins, cfg.vmin, cfg.vmax)
    total, parts, zs = losses.world_model_loss(
        cfg,
        two,
        agent.model,
        PackNoise([SEED], torch.device("cpu")),
        obs[None],
        action[None],
        reward[None],
        terminated[None],
    )
    gen = torch.Generator().manual_seed(SEED)
    ref_total, ref_parts, ref_zs = world_model_loss(
        agent.model, cfg, obs, action, reward, terminated, gen
    )
    assert set(parts) == set(ref_parts)
    for name, value in ref_parts.items():
        assert close(parts[name][0], value), (name, parts[name], value)
    assert close(total[0], ref_total)
    assert close(zs[0], ref_zs)
    # The gradients too: the TD target and the consistency targets are constants.
    total.sum().backward()
    ours = {n: p.grad.clone() for n, p in agent.model.named_parameters() if p.grad is not None}
    agent.model.zero_grad()
    ref_total.backward()
    theirs = {n: p.grad for n, p in agent.model.named_parameters() if p.grad is not None}
    assert set(ours) == set(theirs)
    assert not any(n.startswith(("target_qs", "pi.")) for n in ours)
    for name in ours:
        assert close(ours[name], theirs[name], 1e-3), name


@pytest.mark.parametrize("episodic", [True, False])
def test_the_td_target_bootstraps_from_the_lower_of_two_target_qs_and_not_past_a_terminal(
    episodic,
):
    """Episodic: a termination cuts the TD target to the reward. --no-episodic: termination
    handling is off, so a termination is bootstrapped through like a time limit."""
    cfg = small(episodic=episodic, num_q=2, horizon=1, batch_size=4)
    agent = randomised(TDMPC2(cfg, OBS, ACT))
    m = agent.model
    obs, action, reward, _ = batch(cfg)
    terminated = torch.tensor([[[1.0], [0.0], [1.0], [0.0]]])
    captured = {}
    real_ce = TwoHot.cross_entropy

    def spy(self, logits, target):
        if logits.dim() == 4:  # the Q ensemble's loss: its target is the TD target
            captured["td"] = target[0, 0, :, 0].clone()
        return real_ce(self, logits, target)

    two = TwoHot(cfg.num_bins, cfg.vmin, cfg.vmax)
    TwoHot.cross_entropy = spy
    try:
        losses.world_model_loss(
            cfg,
            two,
            m,
            PackNoise([SEED], "cpu"),
            obs[None],
            action[None],
            reward[None],
            terminated[None],
        )
    finally:
        TwoHot.cross_entropy = real_ce
    with torch.no_grad():
        gen = torch.Generator().manual_seed(SEED)
        next_z = mlp(m.encoder, obs[1])
        eps = torch.randn(4, ACT, generator=gen)
        pi_action = policy(m, next_z, eps).action
        values = [decode(mlp(m.target_qs, next_z, pi_action, member=i)) for i in (0, 1)]
    assert not close(values[0], values[1], 1e-2), "the two target Qs must differ for this test"
    gamma = discount(cfg.episode_length)
    alive = 1 - terminated[0, :, 0] if episodic else torch.ones(4)
    expected = reward[0, :, 0] + gamma * torch.minimum(*values)[:, 0] * alive
    assert close(captured["td"], expected)
    cut = close(captured["td"][[0, 2]], reward[0, [0, 2], 0])  # nothing after the terminal
    assert cut == episodic


def test_the_policy_loss_and_q_scale_are_the_published_ones():
    cfg = small()
    agent = randomised(TDMPC2(cfg, OBS, ACT))
    m = agent.model
    with torch.no_grad():
        m.q_scale.fill_(3.0)
    zs = torch.softmax(torch.randn(cfg.horizon + 1, cfg.batch_size, 16), -1)
    two = TwoHot(cfg.num_bins, cfg.vmin, cfg.vmax)
    loss, entropy, q_mean = losses.policy_loss(cfg, two, m, PackNoise([SEED], "cpu"), zs[None])
    new_scale = float(m.q_scale[0])
    gen = torch.Generator().manual_seed(SEED)
    ref_loss, ref_entropy, ref_scale, ref_q = policy_loss(m, cfg, zs, gen, 3.0)
    assert close(loss[0], ref_loss) and close(entropy[0], ref_entropy)
    assert float(q_mean[0]) == pytest.approx(ref_q, rel=1e-5)
    assert new_scale == pytest.approx(ref_scale, rel=1e-5)
    loss.sum().backward()
    with_grad = {n.split(".")[0] for n, p in m.named_parameters() if p.grad is not None}
    assert with_grad == {"pi"}, "the policy's loss trains the policy alone"


def test_the_q_scale_is_at_least_one_and_moves_by_tau():
    cfg = small()
    agent = TDMPC2(cfg, OBS, ACT)  # zero-initialised Q heads: every Q is 0, the spread 0
    m = agent.model
    with torch.no_grad():
        m.q_scale.fill_(5.0)
    zs = torch.softmax(torch.randn(cfg.horizon + 1, cfg.batch_size, 16), -1)
    two = TwoHot(cfg.num_bins, cfg.vmin, cfg.vmax)
    losses.policy_loss(cfg, two, m, PackNoise([SEED], "cpu"), zs[None])
    assert float(m.q_scale[0]) == pytest.approx(5.0 + 0.01 * (1.0 - 5.0))


@pytest.mark.parametrize("episodic, clip", [(False, 20.0), (True, 20.0), (False, 0.2)])
def test_an_update_is_the_published_update(episodic, clip):
    """Three updates of the agent against three of the reference (Adam's lrs and eps, the
    gradient clip, the order of the two steps, the Q scale, the Polyak step): at the published
    clip of 20, which these small gradients stay under, and at one that clips them."""
    cfg = small(episodic=episodic, grad_clip_norm=clip)
    agent = randomised(TDMPC2(cfg, OBS, ACT))
    ref = copy.deepcopy(agent.model)
    optimisers = Optimisers(ref)
    gen = torch.Generator().manual_seed(SEED)
    data = batch(cfg, terminal_every=3, reward_scale=20.0)
    for step in range(3):
        info = agent.update(data)
        expected = update(ref, cfg, optimisers, data, gen, clip)
        norms = expected["grad_norm"], expected["pi_grad_norm"]
        assert all(norm > clip for norm in norms) == (clip < 1), norms
        for name, value in expected.items():
            assert close(info[name], value, 2e-3), (step, name, float(info[name]), value)
    theirs = dict(ref.named_parameters())
    for name, p in agent.model.named_parameters():
        assert close(p, theirs[name], 2e-4), name
    assert close(agent.model.q_scale, ref.q_scale)


@pytest.mark.parametrize(
    "eval_mode, pi_trajs, episodic",
    [(False, 0, False), (False, 3, False), (True, 0, False), (True, 3, False), (False, 3, True)],
)
# The published std range, and ranges whose upper or lower clamp acts.
@pytest.mark.parametrize("min_std, max_std", [(0.05, 2.0), (0.05, 0.3), (0.6, 2.0)])
def test_a_plan_is_published_mppi(eval_mode, pi_trajs, episodic, min_std, max_std):
    cfg = small(
        num_pi_trajs=pi_trajs, horizon=3, min_std=min_std, max_std=max_std, episodic=episodic
    )
    agent = randomised(TDMPC2(cfg, OBS, ACT))
    obs = torch.randn(2, OBS, generator=torch.Generator().manual_seed(5))
    warm = torch.rand(2, cfg.horizon, ACT, generator=torch.Generator().manual_seed(6)) - 0.5
    knobs = agent.plan_knobs()
    two = TwoHot(cfg.num_bins, cfg.vmin, cfg.vmax)
    with torch.no_grad():
        action, mean = agent_planner.plan(
            agent.model, two, obs[None], warm[None], knobs, eval_mode, PackNoise([SEED], "cpu")
        )
        ref_action, ref_mean = plan(
            agent.model, cfg, obs, warm, eval_mode, torch.Generator().manual_seed(SEED)
        )
    assert close(mean[0], ref_mean, 1e-4)
    assert close(action[0], ref_action, 1e-4)


def test_planning_values_use_the_discount_and_the_temperature():
    """The published knobs change the plan: a plan made with another temperature or discount
    than the reference's differs (so the two facts above are not vacuous)."""
    cfg = small(num_pi_trajs=0)
    agent = randomised(TDMPC2(cfg, OBS, ACT))
    obs, warm = torch.randn(2, OBS), torch.zeros(2, cfg.horizon, ACT)
    two = TwoHot(cfg.num_bins, cfg.vmin, cfg.vmax)
    base = agent.plan_knobs()

    def mean_of(knobs):
        with torch.no_grad():
            return agent_planner.plan(
                agent.model, two, obs[None], warm[None], knobs, True, PackNoise([SEED], "cpu")
            )[1]

    reference = mean_of(base)
    for change in ({"temperature": 5.0}, {"gamma": 0.5}):
        assert not close(mean_of(base.__class__(**{**base.__dict__, **change})), reference)


def test_the_two_hot_is_the_triangle_on_the_nearest_bins():
    two = TwoHot(101, -10.0, 10.0)
    x = torch.tensor([-1e4, -7.3, -0.05, 0.0, 0.013, 0.999, 3.3, 250.0]).unsqueeze(-1)
    assert close(two.encode(x), two_hot(x), 1e-5)
    logits = torch.randn(8, 101) * 3
    assert close(two.decode(logits), decode(logits), 1e-4)
