"""MPPI in latent space with policy-prior trajectories, batched over several environments."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from agent.math import TwoHot, gumbel_choice
from agent.world_model import WorldModel


@dataclass(frozen=True)
class PlanKnobs:
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
    """Action sequences rolled out in the model from one latent per env (K per env)."""

    ret: torch.Tensor  # (N, K, 1): sum_t gamma^t r_t
    z: torch.Tensor  # (N, K, L): the latent after the last action
    alive: torch.Tensor | None  # (N, K, 1): 0 after a predicted termination (episodic only)
    discount: float  # gamma^H

    def join(self, other: Rollout) -> Rollout:
        """Both sets of sequences side by side (self's first)."""
        alive = None
        if self.alive is not None:
            alive = torch.cat([self.alive, other.alive], dim=1)
        return Rollout(
            torch.cat([self.ret, other.ret], dim=1),
            torch.cat([self.z, other.z], dim=1),
            alive,
            self.discount,
        )


def rollout(
    model: WorldModel, two_hot: TwoHot, z0: torch.Tensor, actions: torch.Tensor, gamma: float
) -> Rollout:
    """Roll action sequences (H, N, K, A) out from z0 (N, 1, L), the same latent for all K."""
    horizon, n, k, _ = actions.shape
    z, ret, discount = z0, 0.0, 1.0
    alive = None
    for t in range(horizon):
        reward = two_hot.decode(model.reward_logits(z, actions[t]))
        z = model.next(z, actions[t])
        ret = ret + discount * reward * (1 if alive is None else alive)
        if model.termination is not None:
            step_alive = (model.termination_logit(z) < 0).to(z.dtype)
            alive = step_alive if alive is None else alive * step_alive
        discount = discount * gamma
    return Rollout(ret, z.expand(n, k, -1), alive, discount)


def terminal_value(model: WorldModel, two_hot: TwoHot, r: Rollout) -> torch.Tensor:
    """(N, K, 1): the rollout's rewards plus gamma^H Q_avg(z_H, pi(z_H)), with a new policy
    action and one random Q pair for all the sequences."""
    n, k, _ = r.z.shape
    flat_z = r.z.reshape(n * k, -1)
    pi_action = model.policy(flat_z).action
    q = two_hot.decode(model.q_logits((flat_z, pi_action), model.random_q_pair())).mean(0)
    q = q.view(n, k, 1)
    return r.ret + r.discount * q * (1 if r.alive is None else r.alive)


def policy_actions(model: WorldModel, z0: torch.Tensor, horizon: int, count: int) -> torch.Tensor:
    """(H, N, count, A) action sequences drawn from the policy prior, rolled out in the model."""
    z = z0.expand(-1, count, -1)
    actions = []
    for t in range(horizon):
        actions.append(model.policy(z)[1])
        if t < horizon - 1:
            z = model.next(z, actions[-1])
    return torch.stack(actions)


def plan(
    model: WorldModel,
    two_hot: TwoHot,
    obs: torch.Tensor,
    warm_mean: torch.Tensor,
    knobs: PlanKnobs,
    eval_mode: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One MPPI call for N environments.

    obs: (N, obs_dim); warm_mean: (N, H, A), already shifted (zeros at episode start).
    Returns (actions (N, A) in [-1, 1], the final mean (N, H, A) for the next warm start).
    """
    k = knobs
    z0 = model.encode(obs).unsqueeze(1)  # (N, 1, L)
    n, a_dim = obs.shape[0], warm_mean.shape[-1]
    num_sampled = k.num_samples - k.num_pi_trajs
    pi_actions, pi_rollout = [], None
    if k.num_pi_trajs:
        pi_actions.append(policy_actions(model, z0, k.horizon, k.num_pi_trajs))
        # Their rewards and last latents do not change between iterations: rolled out once.
        pi_rollout = rollout(model, two_hot, z0, pi_actions[0], k.gamma)
    mean = warm_mean.transpose(0, 1)  # (H, N, A)
    std = torch.full_like(mean, k.max_std)
    for _ in range(k.iterations):
        noise = torch.randn(k.horizon, n, num_sampled, a_dim, device=obs.device, dtype=mean.dtype)
        sampled = (mean.unsqueeze(2) + std.unsqueeze(2) * noise).clamp(-1, 1)
        actions = torch.cat([*pi_actions, sampled], dim=2)  # (H, N, S, A)
        rolled = rollout(model, two_hot, z0, sampled, k.gamma)
        if pi_rollout is not None:
            rolled = pi_rollout.join(rolled)
        # The policy trajectories' terminal value is taken again in every iteration with the
        # sampled ones (a new terminal policy action, the iteration's Q pair), as in the
        # reference: a lucky first value does not keep one elite for the whole plan.
        value = terminal_value(model, two_hot, rolled).squeeze(-1).nan_to_num(0.0)
        elite_value, elite_idx = value.topk(k.num_elites, dim=1)
        index = elite_idx.view(1, n, -1, 1).expand(k.horizon, -1, -1, a_dim)
        elite_actions = actions.gather(2, index)  # (H, N, E, A)
        score = F.softmax(k.temperature * elite_value, dim=1)  # (N, E)
        weights = score.view(1, n, -1, 1)
        mean = (weights * elite_actions).sum(2)
        std = ((weights * (elite_actions - mean.unsqueeze(2)).square()).sum(2)).sqrt()
        std = std.clamp(k.min_std, k.max_std)
    # One elite drawn by its score, in evaluation too (the mean of a two-mode elite set can sit
    # between the modes); only the exploration noise is left out there.
    choice = gumbel_choice(score)  # (N,)
    action = elite_actions[0, torch.arange(n, device=obs.device), choice]
    if not eval_mode:
        action = action + std[0] * torch.randn_like(action)
    return action.clamp(-1, 1), mean.transpose(0, 1)
