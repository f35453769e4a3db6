"""TD-MPC2's two losses, per worker of a pack: the world model's (latent consistency, reward,
value and, when episodic, termination) and the policy prior's. Each takes the networks and the
random stream it is to use, a whole pack's or one worker's (agent/pack/threads.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from agent.config import Config
from agent.math import TwoHot, percentile_range
from agent.noise import PackNoise
from agent.world_model import WorldModel


def rho_weights(rho: float, horizon: int, device: torch.device) -> torch.Tensor:
    """rho^t for t < horizon: later steps of the rollout weigh less."""
    return rho ** torch.arange(horizon, device=device, dtype=torch.float32)


def world_model_loss(
    cfg: Config,
    two_hot: TwoHot,
    m: WorldModel,
    noise: PackNoise,
    obs: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    terminated: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """The world model's total loss (P,), its parts, and the latents of the rollout
    (P, H+1, B, L) detached, for the policy's loss. obs (P, H+1, B, D), action (P, H, B, A),
    reward and terminated (P, H, B, 1)."""
    p, horizon, batch = action.shape[:3]
    action_dim = action.shape[-1]
    rho = rho_weights(cfg.rho, horizon, obs.device)
    with torch.no_grad():
        next_z = m.encode(obs[:, 1:], noise)
        flat_next = next_z.flatten(1, 2)
        next_action = m.policy(flat_next, noise.normal(horizon * batch, action_dim))
        target_q = two_hot.decode(
            m.q_logits((flat_next, next_action.action), noise.q_pair(cfg.num_q), target=True)
        )
        next_value = target_q.min(1).values.view(p, horizon, batch, 1)
        # Episodic: nothing past a terminal state. Otherwise a termination is bootstrapped
        # through like a time limit (--no-episodic: termination handling off altogether).
        alive = 1 - terminated if cfg.episodic else 1.0
        td_target = reward + cfg.gamma * alive * next_value

    z = m.encode(obs[:, 0], noise)
    zs = [z]
    consistency = 0.0
    for t in range(horizon):
        z = m.next(z, action[:, t])
        step_mse = F.mse_loss(z, next_z[:, t], reduction="none").mean((1, 2))
        consistency = consistency + rho[t] * step_mse
        zs.append(z)
    zs = torch.stack(zs, dim=1)  # (P, H+1, B, L)
    flat_z, flat_a = zs[:, :-1].flatten(1, 2), action.flatten(1, 2)
    reward_ce = two_hot.cross_entropy(m.reward_logits(flat_z, flat_a), reward.flatten(1, 2))
    q_ce = two_hot.cross_entropy(m.q_logits((flat_z, flat_a)), td_target.flatten(1, 2).unsqueeze(1))
    reward_loss = (reward_ce.view(p, horizon, batch).mean(2) * rho).sum(1) / horizon
    value_loss = (q_ce.view(p, -1, horizon, batch).mean(3) * rho).sum((1, 2)) / (
        horizon * cfg.num_q
    )
    consistency = consistency / horizon
    total = (
        cfg.consistency_coef * consistency
        + cfg.reward_coef * reward_loss
        + cfg.value_coef * value_loss
    )
    out = {
        "consistency_loss": consistency.detach(),
        "reward_loss": reward_loss.detach(),
        "value_loss": value_loss.detach(),
    }
    if m.termination is not None:
        logits = m.termination_logit(zs[:, 1:])
        termination_loss = F.binary_cross_entropy_with_logits(
            logits, terminated, reduction="none"
        ).mean((1, 2, 3))
        total = total + cfg.termination_coef * termination_loss
        out["termination_loss"] = termination_loss.detach()
    return total, out, zs.detach()


def policy_loss(
    cfg: Config, two_hot: TwoHot, m: WorldModel, noise: PackNoise, zs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The policy's loss (P,) on the rollout latents zs (P, H+1, B, L), which maximises the
    scaled mean of two random Qs (moving each worker's Q scale), its entropy (P,) and the mean
    of those Qs (P,): the value the agent predicts for its own policy."""
    p, steps, batch = zs.shape[:3]
    pi_z = zs.flatten(1, 2)
    sample = m.policy(pi_z, noise.normal(pi_z.shape[1], m.action_dim))
    q_logits = m.q_logits((pi_z, sample.action), noise.q_pair(cfg.num_q), detach=True)
    q = two_hot.decode(q_logits).mean(1).view(p, steps, batch)
    with torch.no_grad():
        spread = percentile_range(q[:, 0]).clamp_min(1.0)
        # A copy: the pack's workers' scales share one version counter, and a member on
        # another thread may move its own while this backward still needs this one.
        scale = m.q_scale.lerp_(spread, cfg.tau).clone()
    scaled_entropy = sample.scaled_entropy.view(p, steps, batch)
    objective = cfg.entropy_coef * scaled_entropy + q / scale.view(p, 1, 1)
    pi_loss = -(objective.mean(2) * rho_weights(cfg.rho, steps, zs.device)).mean(1)
    entropy = -sample.log_prob.view(p, -1).mean(1).detach()
    return pi_loss, entropy, q.detach().mean((1, 2))
