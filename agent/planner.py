"""MPPI in latent space with policy-prior trajectories, batched over workers and environments."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from agent.math import TwoHot, gumbel_choice
from agent.noise import PackNoise
from agent.world_model import WorldModel


@dataclass(frozen=True)
class PlanKnobs:
    """What one plan runs with: each field is the Config's of the same name
    (TDMPC2.plan_knobs), iterations as resolved for the action space."""

    horizon: int
    iterations: int
    num_samples: int
    num_elites: int
    num_pi_trajs: int
    temperature: float
    min_std: float
    max_std: float
    gamma: float


@dataclass(frozen=True)
class Rollout:
    """Action sequences rolled out in the model from one latent per env (S per env)."""

    ret: torch.Tensor  # (P, N, S, 1): sum_t gamma^t r_t
    z: torch.Tensor  # (P, N, S, L): the latent after the last action
    alive: torch.Tensor | None  # (P, N, S, 1): 0 after a predicted termination (episodic only)
    discount: float  # gamma^H

    def join(self, other: Rollout) -> Rollout:
        """Both sets of sequences side by side (self's first)."""
        alive = None
        if self.alive is not None:
            alive = torch.cat([self.alive, other.alive], dim=2)
        return Rollout(
            torch.cat([self.ret, other.ret], dim=2),
            torch.cat([self.z, other.z], dim=2),
            alive,
            self.discount,
        )


def rollout(
    model: WorldModel, two_hot: TwoHot, z0: torch.Tensor, actions: torch.Tensor, gamma: float
) -> Rollout:
    """Roll action sequences (H, P, N, S, A) out from z0 (P, N, 1, L), one latent for all S."""
    s = actions.shape[3]
    z, ret, discount = z0, 0.0, 1.0
    alive = None
    for t in range(actions.shape[0]):
        reward = two_hot.decode(model.reward_logits(z, actions[t]))
        z = model.next(z, actions[t])
        ret = ret + discount * reward * (1 if alive is None else alive)
        if model.termination is not None:
            step_alive = (model.termination_logit(z) < 0).to(z.dtype)
            alive = step_alive if alive is None else alive * step_alive
        discount = discount * gamma
    return Rollout(ret, z.expand(-1, -1, s, -1), alive, discount)


def terminal_value(
    model: WorldModel, two_hot: TwoHot, r: Rollout, noise: PackNoise
) -> torch.Tensor:
    """(P, N, S, 1): the rollout's rewards plus gamma^H Q_avg(z_H, pi(z_H)), with a new policy
    action and one random Q pair per worker for all the sequences."""
    p, n, s, _ = r.z.shape
    flat_z = r.z.reshape(p, n * s, -1)
    pi_action = model.policy(flat_z, noise.normal(n * s, model.action_dim)).action
    pair = noise.q_pair(model.cfg.num_q)
    q = two_hot.decode(model.q_logits((flat_z, pi_action), pair)).mean(1)
    q = q.view(p, n, s, 1)
    return r.ret + r.discount * q * (1 if r.alive is None else r.alive)


def policy_actions(
    model: WorldModel, z0: torch.Tensor, horizon: int, count: int, noise: PackNoise
) -> torch.Tensor:
    """(H, P, N, count, A) action sequences drawn from the policy prior, rolled out in the
    model."""
    z = z0.expand(-1, -1, count, -1)
    actions = []
    for t in range(horizon):
        eps = noise.normal(z.shape[1], count, model.action_dim)
        actions.append(model.policy(z, eps).action)
        if t < horizon - 1:
            z = model.next(z, actions[-1])
    return torch.stack(actions)


def elites(
    value: torch.Tensor, num_elites: int, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The best sequences' indices (..., E) by value (..., S) and their weights: the softmax
    of temperature x value. Values come in float32 (the two-hot decodes are) and stay so: in
    bf16 many candidates tie, and at temperature 0.5 one rounding step of a value of 100 moves
    its weight about tenfold."""
    elite_value, elite_idx = value.topk(num_elites, dim=-1)
    return elite_idx, F.softmax(temperature * elite_value, dim=-1)


def plan(
    model: WorldModel,
    two_hot: TwoHot,
    obs: torch.Tensor,
    warm_mean: torch.Tensor,
    knobs: PlanKnobs,
    eval_mode: bool,
    noise: PackNoise,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One MPPI call for P workers' N environments each.

    obs: (P, N, obs_dim); warm_mean: (P, N, H, A), already shifted (zeros at episode start).
    Returns (actions (P, N, A) in [-1, 1], the final mean (P, N, H, A) for the next warm start).
    """
    k = knobs
    z0 = model.encode(obs, noise).unsqueeze(2)  # (P, N, 1, L)
    p, n, a_dim = obs.shape[0], obs.shape[1], warm_mean.shape[-1]
    num_sampled = k.num_samples - k.num_pi_trajs
    pi_actions, pi_rollout = [], None
    if k.num_pi_trajs:
        pi_actions.append(policy_actions(model, z0, k.horizon, k.num_pi_trajs, noise))
        # Their rewards and last latents do not change between iterations: rolled out once.
        pi_rollout = rollout(model, two_hot, z0, pi_actions[0], k.gamma)
    mean = warm_mean.permute(2, 0, 1, 3)  # (H, P, N, A)
    std = torch.full_like(mean, k.max_std)
    for _ in range(k.iterations):
        draw = noise.normal(k.horizon, n, num_sampled, a_dim).transpose(0, 1).to(mean.dtype)
        sampled = (mean.unsqueeze(3) + std.unsqueeze(3) * draw).clamp(-1, 1)
        actions = torch.cat([*pi_actions, sampled], dim=3)  # (H, P, N, S, A)
        rolled = rollout(model, two_hot, z0, sampled, k.gamma)
        if pi_rollout is not None:
            rolled = pi_rollout.join(rolled)
        # The policy trajectories' terminal value is taken again in every iteration with the
        # sampled ones (a new terminal policy action, the iteration's Q pair), as in the
        # reference: a lucky first value does not keep one elite for the whole plan.
        value = terminal_value(model, two_hot, rolled, noise).squeeze(-1).nan_to_num(0.0)
        elite_idx, score = elites(value, k.num_elites, k.temperature)  # (P, N, E) each
        index = elite_idx.unsqueeze(0).unsqueeze(-1).expand(k.horizon, -1, -1, -1, a_dim)
        elite_actions = actions.gather(3, index)  # (H, P, N, E, A)
        weights = score.unsqueeze(0).unsqueeze(-1)
        mean = (weights * elite_actions).sum(3)
        std = ((weights * (elite_actions - mean.unsqueeze(3)).square()).sum(3)).sqrt()
        std = std.clamp(k.min_std, k.max_std)
    # One elite drawn by its score, in evaluation too (the mean of a two-mode elite set can sit
    # between the modes); only the exploration noise is left out there.
    choice = gumbel_choice(score, noise.uniform(n, k.num_elites))  # (P, N)
    index = choice.view(p, n, 1, 1).expand(-1, -1, 1, a_dim)
    action = elite_actions[0].gather(2, index).squeeze(2)  # (P, N, A)
    if not eval_mode:
        action = action + std[0] * noise.normal(n, a_dim).to(action.dtype)
    return action.clamp(-1, 1), mean.permute(1, 2, 0, 3)
