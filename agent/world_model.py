"""TD-MPC2's implicit world model: encoder, latent dynamics, reward, policy prior and Q ensemble.

The model holds a pack of P workers' networks (agent/layers.py): every input and output has a
leading worker dimension P, and P = 1 is one agent.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from agent.config import Config
from agent.conv import ConvEncoder
from agent.layers import MLP, Inputs
from agent.math import PolicySample, bounded_log_std, squashed_gaussian
from agent.noise import PackNoise
from agent.pixels import OBS_DIM


class WorldModel(nn.Module):
    """All networks of one agent. Latents are SimNorm'd; heads output two-hot logits."""

    def __init__(self, cfg: Config, obs_dim: int, action_dim: int, pack: int = 1):
        super().__init__()
        self.cfg, self.obs_dim, self.action_dim, self.pack = cfg, obs_dim, action_dim, pack
        latent, mlp, gs = cfg.latent_dim, cfg.mlp_dim, cfg.simnorm_dim
        za = (latent, action_dim)
        enc_hidden = [cfg.enc_dim] * max(cfg.num_enc_layers - 1, 1)
        p = pack
        if cfg.obs == "rgb":
            if obs_dim != OBS_DIM:
                raise ValueError(f"pixel observations have {OBS_DIM} values, got {obs_dim}")
            self.encoder = ConvEncoder(cfg.num_channels, latent, gs, pack=p)
        else:
            self.encoder = MLP(
                (obs_dim,),
                enc_hidden,
                latent,
                out_norm=True,
                out_act="simnorm",
                simnorm_dim=gs,
                pack=p,
            )
        self.dynamics = MLP(
            za, [mlp, mlp], latent, out_norm=True, out_act="simnorm", simnorm_dim=gs, pack=p
        )
        self.reward = MLP(za, [mlp, mlp], cfg.num_bins, pack=p)
        self.termination = MLP(za[:1], [mlp, mlp], 1, pack=p) if cfg.episodic else None
        self.pi = MLP((latent,), [mlp, mlp], 2 * action_dim, pack=p)
        self.qs = MLP(za, [mlp, mlp], cfg.num_bins, members=cfg.num_q, dropout=cfg.dropout, pack=p)
        self.reward.zero_last_layer()
        self.qs.zero_last_layer()
        self.target_qs = copy.deepcopy(self.qs).requires_grad_(False)
        # Each worker's running 5-95 percentile range of Q values: scales its policy objective.
        self.register_buffer("q_scale", torch.ones(pack))

    def train(self, mode: bool = True) -> WorldModel:
        """As nn.Module.train, but the target Qs stay in eval mode: the TD target is computed
        without dropout, as in the reference."""
        super().train(mode)
        self.target_qs.train(False)
        return self

    def encode(self, obs: torch.Tensor, noise: PackNoise | None = None) -> torch.Tensor:
        """Latents of observations (P, ..., obs_dim); the pixel encoder draws its random
        shifts from `noise` (None: unshifted), the state encoder draws nothing."""
        if self.cfg.obs == "rgb":
            return self.encoder(obs, noise)
        return self.encoder(obs)

    def next(self, z: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.dynamics((z, action))

    def reward_logits(self, z: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.reward((z, action))

    def termination_logit(self, z: torch.Tensor) -> torch.Tensor:
        assert self.termination is not None, "termination head exists only in episodic mode"
        return self.termination(z)

    def policy(self, z: torch.Tensor, eps: torch.Tensor) -> PolicySample:
        """(squashed mean, sampled action, log-prob, scaled entropy) of the policy prior at z,
        with standard normal noise eps (shaped as the action). The Gaussian's arithmetic is
        float32 under bf16 autocast too: a log std near its bounds, the tanh's saturation and
        the log-probability lose too much in bf16's 8 bits, and it is elementwise (cheap)."""
        mean, raw_log_std = self.pi(z).float().chunk(2, dim=-1)
        log_std = bounded_log_std(raw_log_std, self.cfg.log_std_min, self.cfg.log_std_max)
        return squashed_gaussian(mean, log_std, eps)

    def q_logits(
        self,
        inputs: Inputs,
        members: torch.Tensor | None = None,
        target: bool = False,
        detach: bool = False,
    ) -> torch.Tensor:
        """Logits (P, members, N, bins) of the chosen Qs (all by default; `members` (P, k): each
        worker's choice) at flat (P, N, .) inputs."""
        net = self.target_qs if target else self.qs
        return net(inputs, members, detach)

    def model_parameters(self) -> list[nn.Parameter]:
        """Parameters trained by the model loss (all but the policy and the targets)."""
        nets = [self.dynamics, self.reward, self.qs]
        if self.termination is not None:
            nets.append(self.termination)
        return [p for net in nets for p in net.parameters()]

    @torch.no_grad()
    def update_targets(self, tau: float) -> None:
        """Polyak-move the target Qs towards the online Qs."""
        target = list(self.target_qs.parameters())
        torch._foreach_lerp_(target, list(self.qs.parameters()), tau)


def weights_obs(model_state: dict) -> str:
    """What networks saved as `model_state` (a WorldModel's state dict) learned from: "rgb"
    when their encoder is the convolutional one, else "state"."""
    return "rgb" if any(name.startswith("encoder.convs.") for name in model_state) else "state"
