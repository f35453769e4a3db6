"""Normed linear layers and MLPs, for one network or a batched ensemble of any number of them.

An ensemble keeps its members' weights stacked as (members, in, out) and runs all members in one
batched matmul. A layer may take several inputs whose features would otherwise be concatenated
([latent, action]): each input gets its own rows of the weight, which avoids the concat and lets an
input with batch 1 (the same latent for every planner sample) be multiplied once and broadcast.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from agent.fast_ops import dropout, mish
from agent.math import simnorm

Inputs = torch.Tensor | Sequence[torch.Tensor]


class Layer(nn.Module):
    """Linear -> [dropout] -> [LayerNorm -> Mish | SimNorm], single or ensemble (members > 0)."""

    def __init__(
        self,
        in_dims: Sequence[int],
        out_dim: int,
        members: int = 0,
        norm: bool = True,
        act: str | None = "mish",
        dropout: float = 0.0,
        simnorm_dim: int = 8,
    ):
        super().__init__()
        self.in_dims, self.out_dim, self.members = tuple(in_dims), out_dim, members
        self.act, self.dropout, self.simnorm_dim = act, dropout, simnorm_dim
        lead = (members,) if members else ()
        self.weight = nn.Parameter(torch.empty(*lead, sum(in_dims), out_dim))
        nn.init.trunc_normal_(self.weight, std=0.02)
        self.bias = nn.Parameter(torch.zeros(*lead, *((1,) if members else ()), out_dim))
        self.norm = norm
        if norm:
            self.ln_weight = nn.Parameter(torch.ones_like(self.bias))
            self.ln_bias = nn.Parameter(torch.zeros_like(self.bias))

    def _params(self, members: torch.Tensor | None, detach: bool) -> list[torch.Tensor]:
        params = [self.weight, self.bias] + ([self.ln_weight, self.ln_bias] if self.norm else [])
        if members is not None:
            params = [p[members] for p in params]
        return [p.detach() for p in params] if detach else params

    def forward(
        self,
        inputs: Inputs,
        members: torch.Tensor | None = None,
        detach: bool = False,
    ) -> torch.Tensor:
        xs = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
        weight, bias, *ln = self._params(members, detach)
        rows = torch.split(weight, self.in_dims, dim=-2)
        if self.members:
            y = self._ensemble_matmul(xs, rows, bias)
        else:
            y = self._single_matmul(xs, rows, bias)
        if self.dropout and self.training:
            y = dropout(y, self.dropout)
        if not self.norm:
            return y
        if self.members:
            y = torch.addcmul(ln[1], F.layer_norm(y, (self.out_dim,)), ln[0])
        else:
            y = F.layer_norm(y, (self.out_dim,), ln[0], ln[1])
        if self.act == "mish":
            return mish(y)
        if self.act == "simnorm":
            return simnorm(y, self.simnorm_dim)
        return y

    def _single_matmul(
        self, xs: list[torch.Tensor], rows: Sequence[torch.Tensor], bias: torch.Tensor
    ) -> torch.Tensor:
        leads = [x.shape[:-1] for x in xs]
        if all(lead == leads[0] for lead in leads):
            y = bias
            for x, w in zip(xs, rows):
                y = torch.addmm(y, x.reshape(-1, x.shape[-1]), w)
            return y.view(*leads[0], self.out_dim)
        # Inputs of different batch shapes (a latent shared by many actions): broadcast.
        y = bias
        for x, w in zip(xs, rows):
            y = y + x @ w
        return y

    @staticmethod
    def _ensemble_matmul(
        xs: list[torch.Tensor], rows: Sequence[torch.Tensor], bias: torch.Tensor
    ) -> torch.Tensor:
        """Inputs (N, d) shared by all members or (E, N, d) per member -> (E, N, out)."""
        members = rows[0].shape[0]
        y = bias
        for x, w in zip(xs, rows):
            if x.dim() == 2:
                x = x.unsqueeze(0).expand(members, *x.shape)
            y = torch.baddbmm(y, x, w)
        return y

    def extra_repr(self) -> str:
        lead = f"members={self.members}, " if self.members else ""
        return (
            f"{lead}in={self.in_dims}, out={self.out_dim}, act={self.act}, dropout={self.dropout}"
        )


class MLP(nn.Module):
    """A stack of Layers; the first takes one or several inputs, hidden layers use Mish."""

    def __init__(
        self,
        in_dims: Sequence[int],
        hidden: Sequence[int],
        out_dim: int,
        members: int = 0,
        out_norm: bool = False,
        out_act: str | None = None,
        dropout: float = 0.0,
        simnorm_dim: int = 8,
    ):
        super().__init__()
        dims = [tuple(in_dims)] + [(h,) for h in hidden]
        layers = [
            Layer(d, h, members, dropout=dropout if i == 0 else 0.0)
            for i, (d, h) in enumerate(zip(dims, hidden))
        ]
        layers.append(
            Layer(dims[-1], out_dim, members, norm=out_norm, act=out_act, simnorm_dim=simnorm_dim)
        )
        self.layers = nn.ModuleList(layers)

    def forward(
        self, inputs: Inputs, members: torch.Tensor | None = None, detach: bool = False
    ) -> torch.Tensor:
        x = inputs
        for layer in self.layers:
            x = layer(x, members, detach)
        return x

    def zero_last_layer(self) -> None:
        nn.init.zeros_(self.layers[-1].weight)
