"""Small numeric helpers of TD-MPC2: symlog, two-hot, SimNorm, squashed Gaussian, running scale."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

LOG_SQRT_2PI = 0.9189385332046727


def symlog(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.log1p(x.abs())


def symexp(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.expm1(x.abs())


class TwoHot:
    """Two-hot encoding of scalars over evenly spaced bins in symlog space.

    Decoding and the cross-entropy run in float32 whatever the logits' format: under bf16
    autocast a decoded value rounded to bf16 is off by up to 1 % (Q ~ 200: about 1.5), more
    than one backup at discount 0.99 moves it, so value learning would stall in the rounding.
    No matmul here, so autocast cannot take the sum back to bf16."""

    def __init__(self, num_bins: int, vmin: float, vmax: float, device: torch.device | str = "cpu"):
        self.num_bins, self.vmin, self.vmax = num_bins, vmin, vmax
        self.bin_size = (vmax - vmin) / (num_bins - 1)
        self.centres = torch.linspace(vmin, vmax, num_bins, device=device)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """(..., 1) scalars -> (..., num_bins) probabilities on the two nearest bins."""
        x = symlog(x).clamp(self.vmin, self.vmax)
        pos = (x - self.vmin) / self.bin_size
        low = pos.floor().clamp(max=self.num_bins - 2)
        upper_mass = pos - low
        out = torch.zeros(*x.shape[:-1], self.num_bins, device=x.device, dtype=x.dtype)
        low = low.long()
        out.scatter_(-1, low, 1 - upper_mass)
        return out.scatter_(-1, low + 1, upper_mass)

    def decode(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., num_bins) logits -> (..., 1) scalars: symexp of the expected bin centre."""
        probs = F.softmax(logits.float(), dim=-1)
        return symexp((probs * self.centres).sum(-1, keepdim=True))

    def cross_entropy(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Soft cross-entropy of logits (..., num_bins) against scalar targets (..., 1)."""
        log_probs = F.log_softmax(logits.float(), dim=-1)
        return -(self.encode(target.float()) * log_probs).sum(-1, keepdim=True)


def simnorm(x: torch.Tensor, group: int) -> torch.Tensor:
    """Softmax within consecutive groups of `group` features."""
    # Softmax over a short innermost dim is ~9x slower on CPU than over a strided middle dim,
    # so the group axis is moved out of the innermost position first (same values).
    groups = x.unflatten(-1, (-1, group)).transpose(-1, -2)
    return F.softmax(groups, dim=-2).transpose(-1, -2).reshape(x.shape)


class PolicySample(NamedTuple):
    mean: torch.Tensor
    """tanh of the Gaussian mean (the deterministic action)."""
    action: torch.Tensor
    """tanh(mean + std * eps)."""
    log_prob: torch.Tensor
    """(..., 1) log-probability of the action, tanh correction applied."""
    scaled_entropy: torch.Tensor
    """(..., 1) the policy loss's entropy term: minus the Gaussian log-probability *before* the
    tanh correction, times the action dimension (the correction is not scaled), as the
    reference computes it."""


def squashed_gaussian(mean: torch.Tensor, log_std: torch.Tensor, eps: torch.Tensor) -> PolicySample:
    """tanh(mean + std * eps) with its log-probability and the scaled entropy term."""
    gaussian = (-0.5 * eps.square() - log_std - LOG_SQRT_2PI).sum(-1, keepdim=True)
    action = torch.tanh(mean + eps * log_std.exp())
    log_prob = gaussian - torch.log(F.relu(1 - action.square()) + 1e-6).sum(-1, keepdim=True)
    return PolicySample(torch.tanh(mean), action, log_prob, -gaussian * eps.shape[-1])


def bounded_log_std(raw: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Map an unbounded network output into [low, high] with tanh."""
    return low + 0.5 * (high - low) * (torch.tanh(raw) + 1)


def percentile_range(x: torch.Tensor, low: float = 0.05, high: float = 0.95) -> torch.Tensor:
    """(P,): each row's high-quantile minus low-quantile, for x (P, ...)."""
    levels = torch.tensor([low, high], device=x.device)
    q = torch.quantile(x.detach().float().flatten(1), levels, dim=1)
    return q[1] - q[0]


def gumbel_choice(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Index drawn with probability proportional to weights along the last dim (Gumbel trick),
    from uniform numbers shaped as weights."""
    gumbel = -torch.log(-torch.log(uniform.clamp_min(1e-20)))
    return (weights.clamp_min(1e-20).log() + gumbel).argmax(-1)
