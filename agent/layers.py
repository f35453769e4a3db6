"""Normed linear layers and MLPs whose weights carry a leading worker dimension.

A pack of P workers is one model: every weight is stacked as (P, in, out), or (P, E, in, out) for
an ensemble of E (the Q functions), and runs as one batched matmul per layer, so P workers cost
about the kernel launches of one. Inputs and outputs carry the same leading P (P = 1 is one
agent). A layer may take several inputs whose features would otherwise be concatenated
([latent, action]): each input gets its own rows of the weight, which avoids the concat and lets
an input with fewer rows (one latent shared by many planner samples) be multiplied once and
broadcast.

Why stacked weights and not torch.func (functional_call + vmap over modules stacked with
torch.func.stack_module_state): forward and backward of the 5M dynamics MLP for a pack of 4 on
the CPU took 1.18x as long with vmap (30 interleaved pairs, BENCHMARKS.md "Packs"); vmap cannot
run the CPU kernels of agent/cpu/fast_ops.py nor a custom autograd Function without extra rules; and
stacked weights keep one state-dict layout for a pack and a lone agent. On a GPU a layer is one
bmm for the whole pack; on a CPU each worker runs a lone layer over its slice of the weights, on a
thread of its own (agent/pack/threads.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from agent.cpu.fast_ops import dropout, mish
from agent.math import simnorm

Inputs = torch.Tensor | Sequence[torch.Tensor]


def _flat_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (B, ..., in) times w (B, in, out) -> (B, ..., out), one bmm over the batch B."""
    y = torch.bmm(x.reshape(x.shape[0], -1, x.shape[-1]), w)
    return y.view(*x.shape[:-1], w.shape[-1])


class Layer(nn.Module):
    """Linear -> [dropout] -> [LayerNorm -> Mish | SimNorm] for P workers (x E members)."""

    def __init__(
        self,
        in_dims: Sequence[int],
        out_dim: int,
        members: int = 0,
        norm: bool = True,
        act: str | None = "mish",
        dropout: float = 0.0,
        simnorm_dim: int = 8,
        pack: int = 1,
    ):
        super().__init__()
        self.in_dims, self.out_dim, self.members = tuple(in_dims), out_dim, members
        self.act, self.dropout, self.simnorm_dim, self.pack = act, dropout, simnorm_dim, pack
        self.generator: torch.Generator | None = None  # dropout's stream; None: torch's global
        lead = (pack, members) if members else (pack,)
        self.weight = nn.Parameter(torch.empty(*lead, sum(in_dims), out_dim))
        nn.init.trunc_normal_(self.weight, std=0.02)
        self.bias = nn.Parameter(torch.zeros(*lead, out_dim))
        self.norm = norm
        if norm:
            self.ln_weight = nn.Parameter(torch.ones_like(self.bias))
            self.ln_bias = nn.Parameter(torch.zeros_like(self.bias))

    def _params(self, members: torch.Tensor | None, detach: bool) -> list[torch.Tensor]:
        params = [self.weight, self.bias] + ([self.ln_weight, self.ln_bias] if self.norm else [])
        if members is not None:  # (P, k): each worker's chosen members
            rows = torch.arange(self.pack, device=members.device).unsqueeze(1)
            params = [p[rows, members] for p in params]
        return [p.detach() for p in params] if detach else params

    def forward(
        self,
        inputs: Inputs,
        members: torch.Tensor | None = None,
        detach: bool = False,
    ) -> torch.Tensor:
        """Inputs (P, ..., d_i); an ensemble also takes (P, E, ..., d_i) and returns
        (P, E, ..., out)."""
        xs = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
        params = self._params(members, detach)
        return self._layer(xs, params)

    def _layer(self, xs: list[torch.Tensor], params: list[torch.Tensor]) -> torch.Tensor:
        weight, bias, *ln = params
        rows = torch.split(weight, self.in_dims, dim=-2)
        if self.members:
            y = self._ensemble_matmul(xs, rows, bias)
        else:
            y = self._pack_matmul(xs, rows, bias)
        if self.dropout and self.training:
            y = dropout(y, self.dropout, self.generator)
        if not self.norm:
            return y
        if bias.shape[:-1] == (1,):  # one worker: LayerNorm's own affine, one pass fewer
            y = F.layer_norm(y, (self.out_dim,), ln[0].view(-1), ln[1].view(-1))
        else:
            shape = (*bias.shape[:-1], *(1,) * (y.dim() - bias.dim()), self.out_dim)
            y = F.layer_norm(y, (self.out_dim,))
            y = torch.addcmul(ln[1].view(shape), y, ln[0].view(shape))
        if self.act == "mish":
            return mish(y)
        if self.act == "simnorm":
            return simnorm(y, self.simnorm_dim)
        return y

    def _pack_matmul(
        self, xs: list[torch.Tensor], rows: Sequence[torch.Tensor], bias: torch.Tensor
    ) -> torch.Tensor:
        shapes = [x.shape[:-1] for x in xs]
        if all(s == shapes[0] for s in shapes):
            p = xs[0].shape[0]
            if p == 1:  # one worker: plain matmuls (a bmm of one costs more on a CPU)
                y = bias[0]
                for x, w in zip(xs, rows):
                    y = torch.addmm(y, x.reshape(-1, x.shape[-1]), w[0])
                y = y.unsqueeze(0)
            else:
                y = bias.unsqueeze(1)
                for x, w in zip(xs, rows):
                    y = torch.baddbmm(y, x.reshape(p, -1, x.shape[-1]), w)
            return y.view(*shapes[0], self.out_dim)
        # Inputs of different shapes (a latent shared by many actions): broadcast the parts.
        y = bias.view(bias.shape[0], *(1,) * (max(len(s) for s in shapes) - 1), self.out_dim)
        for x, w in zip(xs, rows):
            y = y + _flat_matmul(x, w)
        return y

    @staticmethod
    def _ensemble_matmul(
        xs: list[torch.Tensor], rows: Sequence[torch.Tensor], bias: torch.Tensor
    ) -> torch.Tensor:
        """Inputs (P, N, d) shared by all members or (P, E, N, d) per member -> (P, E, N, out)."""
        p, e = rows[0].shape[:2]
        y = bias.reshape(p * e, 1, -1)
        n = None
        for x, w in zip(xs, rows):
            if x.dim() == 3 and p == 1:
                x = x[0].expand(e, *x.shape[1:])  # a view: bmm reads it without a copy
            elif x.dim() == 3:
                x = x.unsqueeze(1).expand(p, e, *x.shape[1:])
            n = x.shape[-2]
            y = torch.baddbmm(y, x.reshape(p * e, n, x.shape[-1]), w.reshape(p * e, *w.shape[2:]))
        return y.view(p, e, n, -1)

    def extra_repr(self) -> str:
        lead = f"members={self.members}, " if self.members else ""
        return (
            f"pack={self.pack}, {lead}in={self.in_dims}, out={self.out_dim}, act={self.act}, "
            f"dropout={self.dropout}"
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
        pack: int = 1,
    ):
        super().__init__()
        dims = [tuple(in_dims)] + [(h,) for h in hidden]
        layers = [
            Layer(d, h, members, dropout=dropout if i == 0 else 0.0, pack=pack)
            for i, (d, h) in enumerate(zip(dims, hidden))
        ]
        layers.append(
            Layer(
                dims[-1],
                out_dim,
                members,
                norm=out_norm,
                act=out_act,
                simnorm_dim=simnorm_dim,
                pack=pack,
            )
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
