"""TD-MPC2 for one worker, written out plainly from ../shared/design/tdmpc2.md: the yardstick
that tests/agent/test_reference.py holds agent/ to.

It shares only the weights with agent/: every layer, head, loss, target and MPPI step is computed
here again from the published facts (loops over time steps, the documented constants), so a
change to one fact in agent/ shows up as a difference. Random numbers are drawn from one
generator in the order the agent draws them from a worker's stream (agent/noise.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

# The published defaults, as numbers (not read from agent/config.py).
RHO, TAU, LR, ENC_LR_SCALE, PI_EPS, GRAD_CLIP = 0.5, 0.01, 3e-4, 0.3, 1e-5, 20.0
CONSISTENCY, REWARD, VALUE, TERMINATION, ENTROPY = 20.0, 0.1, 0.1, 1.0, 1e-4
BINS, VMIN, VMAX, LOG_STD_MIN, LOG_STD_MAX, SIMNORM = 101, -10.0, 10.0, -10.0, 2.0, 8
CENTRES = torch.linspace(VMIN, VMAX, BINS)
BIN_WIDTH = (VMAX - VMIN) / (BINS - 1)


def discount(episode_length: int) -> float:
    """clip((L/5 - 1)/(L/5), 0.95, 0.995)."""
    frac = episode_length / 5
    return float(np.clip((frac - 1) / frac, 0.95, 0.995))


# numbers ---------------------------------------------------------------------------------
def symlog(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.log(1 + x.abs())


def symexp(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * (torch.exp(x.abs()) - 1)


def two_hot(x: torch.Tensor) -> torch.Tensor:
    """(..., 1) -> (..., BINS): a triangle of one bin's width around symlog(x) on the bin
    centres, which puts the mass on the two nearest bins in proportion to closeness."""
    s = symlog(x).clamp(VMIN, VMAX)
    return F.relu(1 - (CENTRES - s).abs() / BIN_WIDTH)


def decode(logits: torch.Tensor) -> torch.Tensor:
    probs = torch.exp(logits - logits.logsumexp(-1, keepdim=True))
    return symexp((probs * CENTRES).sum(-1, keepdim=True))


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(...,) soft cross-entropy of the logits against the two-hot of a scalar target."""
    return -(two_hot(target) * (logits - logits.logsumexp(-1, keepdim=True))).sum(-1)


# networks (worker 0 of agent/'s stacked weights) ------------------------------------------
def mish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.tanh(torch.log(1 + torch.exp(x)))


def simnorm(x: torch.Tensor) -> torch.Tensor:
    groups = x.reshape(*x.shape[:-1], -1, SIMNORM)
    return (groups.exp() / groups.exp().sum(-1, keepdim=True)).reshape(x.shape)


def layer(lay, x: torch.Tensor, member: int | None, constant: bool = False) -> torch.Tensor:
    """Linear -> LayerNorm -> Mish (or -> LayerNorm -> SimNorm, or Linear alone); `constant`:
    the weights take no gradient."""

    def param(t: torch.Tensor) -> torch.Tensor:
        t = t.detach() if constant else t
        return t[0] if member is None else t[0, member]

    y = x @ param(lay.weight) + param(lay.bias)
    if lay.norm:
        centred = y - y.mean(-1, keepdim=True)
        y = centred / torch.sqrt(centred.square().mean(-1, keepdim=True) + 1e-5)
        y = y * param(lay.ln_weight) + param(lay.ln_bias)
    if lay.act == "mish":
        return mish(y)
    if lay.act == "simnorm":
        return simnorm(y)
    return y


def mlp(net, *inputs: torch.Tensor, member: int | None = None, constant=False) -> torch.Tensor:
    x = torch.cat(inputs, -1)
    for lay in net.layers:
        x = layer(lay, x, member, constant)
    return x


def broadcast_cat(z: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shape = torch.broadcast_shapes(z.shape[:-1], a.shape[:-1])
    return z.expand(*shape, z.shape[-1]), a.expand(*shape, a.shape[-1])


def encode(m, obs):
    return mlp(m.encoder, obs)


def next_latent(m, z, a):
    return mlp(m.dynamics, *broadcast_cat(z, a))


def reward_logits(m, z, a):
    return mlp(m.reward, *broadcast_cat(z, a))


def q_logits(m, i: int, z, a, target: bool = False, constant: bool = False):
    return mlp(m.target_qs if target else m.qs, *broadcast_cat(z, a), member=i, constant=constant)


class Policy(NamedTuple):
    action: torch.Tensor
    log_prob: torch.Tensor
    scaled_entropy: torch.Tensor


def policy(m, z: torch.Tensor, eps: torch.Tensor) -> Policy:
    """a = tanh(mean + std eps), log std tanh-mapped into [-10, 2]; the scaled entropy term is
    minus the Gaussian log-probability times the action dimension."""
    out = mlp(m.pi, z)
    dims = out.shape[-1] // 2
    mean, raw = out[..., :dims], out[..., dims:]
    log_std = LOG_STD_MIN + (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(raw) + 1) / 2
    pre_tanh = mean + log_std.exp() * eps
    gaussian = torch.distributions.Normal(mean, log_std.exp()).log_prob(pre_tanh).sum(-1)
    action = torch.tanh(pre_tanh)
    log_prob = gaussian - torch.log(1 - action.square() + 1e-6).sum(-1)
    return Policy(action, log_prob, -gaussian * dims)


def q_pair(gen: torch.Generator, num_q: int) -> list[int]:
    return torch.rand(num_q, generator=gen).argsort()[:2].tolist()


# update -----------------------------------------------------------------------------------
def world_model_loss(m, cfg, obs, action, reward, terminated, gen):
    """(total, {part: value}, rollout latents (H+1, B, L)) for one worker's batch."""
    horizon, batch, dims = action.shape
    with torch.no_grad():
        next_z = encode(m, obs[1:])
        eps = torch.randn(horizon * batch, dims, generator=gen).view(horizon, batch, dims)
        pair = q_pair(gen, cfg.num_q)
        pi_action = policy(m, next_z, eps).action
        lowest = torch.minimum(
            *(decode(q_logits(m, i, next_z, pi_action, target=True)) for i in pair)
        )
        # Without termination handling a termination is bootstrapped like a time limit.
        alive = (1 - terminated) if cfg.episodic else torch.ones_like(terminated)
        td_target = reward + discount(cfg.episode_length) * alive * lowest
    z = encode(m, obs[0])
    zs, consistency, reward_loss, value_loss, termination_loss = [z], 0.0, 0.0, 0.0, 0.0
    for t in range(horizon):
        w = RHO**t
        reward_loss += w * cross_entropy(reward_logits(m, z, action[t]), reward[t]).mean()
        for i in range(cfg.num_q):
            value_loss += w * cross_entropy(q_logits(m, i, z, action[t]), td_target[t]).mean()
        z = next_latent(m, z, action[t])
        consistency += w * (z - next_z[t]).square().mean()
        if cfg.episodic:
            logit = mlp(m.termination, z)
            termination_loss += F.binary_cross_entropy_with_logits(logit, terminated[t]) / horizon
        zs.append(z)
    parts = {
        "consistency_loss": consistency / horizon,
        "reward_loss": reward_loss / horizon,
        "value_loss": value_loss / (horizon * cfg.num_q),
    }
    total = (
        CONSISTENCY * parts["consistency_loss"]
        + REWARD * parts["reward_loss"]
        + VALUE * parts["value_loss"]
    )
    if cfg.episodic:
        parts["termination_loss"] = termination_loss
        total = total + TERMINATION * termination_loss
    return total, parts, torch.stack(zs).detach()


def policy_loss(m, cfg, zs, gen, q_scale: float):
    """(loss, entropy, new Q scale, mean Q) on the rollout latents zs (H+1, B, L)."""
    steps, batch, _ = zs.shape
    dims = m.action_dim
    eps = torch.randn(steps * batch, dims, generator=gen).view(steps, batch, dims)
    pair = q_pair(gen, cfg.num_q)
    sample = policy(m, zs, eps)
    # Online Qs whose weights take no gradient: the policy's loss trains the policy alone.
    q = sum(decode(q_logits(m, i, zs, sample.action, constant=True)) for i in pair) / 2
    first = q[0].detach().flatten().numpy()
    spread = max(float(np.percentile(first, 95) - np.percentile(first, 5)), 1.0)
    scale = q_scale + TAU * (spread - q_scale)
    objective = ENTROPY * sample.scaled_entropy.unsqueeze(-1) + q / scale
    loss = -sum(RHO**t * objective[t].mean() for t in range(steps)) / steps
    return loss, -sample.log_prob.mean().detach(), scale, float(q.detach().mean())


class Optimisers:
    """Adam as published: lr 3e-4, the encoder's x 0.3, the policy's eps 1e-5."""

    def __init__(self, m):
        self.model_params = [
            *m.encoder.parameters(),
            *m.dynamics.parameters(),
            *m.reward.parameters(),
            *m.qs.parameters(),
            *(m.termination.parameters() if m.termination is not None else []),
        ]
        self.model = torch.optim.Adam(
            [
                {"params": list(m.encoder.parameters()), "lr": LR * ENC_LR_SCALE},
                {"params": self.model_params[len(list(m.encoder.parameters())) :], "lr": LR},
            ]
        )
        self.pi = torch.optim.Adam(m.pi.parameters(), lr=LR, eps=PI_EPS)


def clip_and_step(optim: torch.optim.Optimizer, clip: float) -> float:
    params = [p for g in optim.param_groups for p in g["params"] if p.grad is not None]
    norm = float(torch.sqrt(sum(p.grad.square().sum() for p in params)))
    if norm > clip:
        for p in params:
            p.grad *= clip / (norm + 1e-6)
    optim.step()
    optim.zero_grad()
    return norm


def update(m, cfg, optimisers: Optimisers, batch, gen, clip=GRAD_CLIP) -> dict[str, float]:
    """One gradient step: model loss and Adam step, then the policy's on the detached rollout
    latents, then the target Qs' Polyak step; each gradient clipped to norm `clip`."""
    total, parts, zs = world_model_loss(m, cfg, *batch, gen)
    total.backward()
    grad_norm = clip_and_step(optimisers.model, clip)
    pi_loss, entropy, scale, q_mean = policy_loss(m, cfg, zs, gen, float(m.q_scale[0]))
    with torch.no_grad():
        m.q_scale.fill_(scale)
    pi_loss.backward()
    pi_grad_norm = clip_and_step(optimisers.pi, clip)
    with torch.no_grad():
        for target, online in zip(m.target_qs.parameters(), m.qs.parameters()):
            target.copy_((1 - TAU) * target + TAU * online)
    return {
        **{k: float(v) for k, v in parts.items()},
        "total_loss": float(total),
        "pi_loss": float(pi_loss),
        "grad_norm": grad_norm,
        "pi_grad_norm": pi_grad_norm,
        "pi_entropy": float(entropy),
        "q_scale": scale,
        "q_mean": q_mean,
    }


# planning ---------------------------------------------------------------------------------
def sequence_values(m, cfg, z0, actions, gamma, gen):
    """(N, S): sum_t gamma^t r_t + gamma^H Q_avg(z_H, pi(z_H)) for actions (H, N, S, A)."""
    horizon, n, s, dims = actions.shape
    z = z0[:, None].expand(n, s, z0.shape[-1])
    ret, alive = torch.zeros(n, s, 1), torch.ones(n, s, 1)
    for t in range(horizon):
        ret = ret + gamma**t * alive * decode(reward_logits(m, z, actions[t]))
        z = next_latent(m, z, actions[t])
        if cfg.episodic:  # no reward or value after a predicted termination (logit > 0)
            alive = alive * (mlp(m.termination, z) <= 0).float()
    eps = torch.randn(n * s, dims, generator=gen).view(n, s, dims)
    pi_action = policy(m, z, eps).action
    pair = q_pair(gen, cfg.num_q)
    q = sum(decode(q_logits(m, i, z, pi_action)) for i in pair) / 2
    return (ret + gamma**horizon * alive * q).squeeze(-1)


def plan(m, cfg, obs, warm_mean, eval_mode, gen):
    """MPPI for one worker's N envs: (actions (N, A), final mean (N, H, A))."""
    knobs = SimpleNamespace(  # the config's own values, not the agent's PlanKnobs
        horizon=cfg.horizon,
        iterations=cfg.iterations,
        num_samples=cfg.num_samples,
        num_elites=cfg.num_elites,
        num_pi_trajs=cfg.num_pi_trajs,
        temperature=cfg.temperature,
        min_std=cfg.min_std,
        max_std=cfg.max_std,
        gamma=discount(cfg.episode_length),
    )
    horizon, n, dims = knobs.horizon, obs.shape[0], warm_mean.shape[-1]
    z0 = encode(m, obs)
    pi_actions = [torch.zeros(n, 0, dims)] * horizon
    z = z0[:, None].expand(n, knobs.num_pi_trajs, z0.shape[-1])
    for t in range(horizon if knobs.num_pi_trajs else 0):
        eps = torch.randn(n, knobs.num_pi_trajs, dims, generator=gen)
        pi_actions[t] = policy(m, z, eps).action
        if t < horizon - 1:
            z = next_latent(m, z, pi_actions[t])
    mean = warm_mean.transpose(0, 1)  # (H, N, A)
    std = torch.full_like(mean, knobs.max_std)
    for _ in range(knobs.iterations):
        sampled_count = knobs.num_samples - knobs.num_pi_trajs
        draw = torch.randn(horizon, n, sampled_count, dims, generator=gen)
        sampled = (mean[:, :, None] + std[:, :, None] * draw).clamp(-1, 1)
        actions = torch.cat([torch.stack(pi_actions), sampled], dim=2)
        value = sequence_values(m, cfg, z0, actions, knobs.gamma, gen)
        elite_idx = value.argsort(-1, descending=True)[:, : knobs.num_elites]
        elite_value = value.gather(1, elite_idx)
        elites = torch.stack([actions[:, i, elite_idx[i]] for i in range(n)], dim=1)
        weight = torch.exp(knobs.temperature * (elite_value - elite_value.max(-1, True).values))
        weight = (weight / weight.sum(-1, keepdim=True))[None, :, :, None]
        mean = (weight * elites).sum(2)
        std = torch.sqrt((weight * (elites - mean[:, :, None]).square()).sum(2))
        std = std.clamp(knobs.min_std, knobs.max_std)
    uniform = torch.rand(n, knobs.num_elites, generator=gen)
    choice = (weight[0, :, :, 0].log() - torch.log(-torch.log(uniform))).argmax(-1)
    action = torch.stack([elites[0, i, choice[i]] for i in range(n)])
    if not eval_mode:
        action = action + std[0] * torch.randn(n, dims, generator=gen)
    return action.clamp(-1, 1), mean.transpose(0, 1)
