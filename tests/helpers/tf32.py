"""TF32 on a CPU, for the tests: float32 matmuls as a CUDA GPU computes them at
torch.set_float32_matmul_precision("high") (agent/agent.py's matmul_precision), each input
rounded to TF32's 10-bit mantissa (8-bit exponent, as float32's), the products summed in
float32. Two rounded inputs multiply exactly in float32 (11 + 11 significant bits), so this is
the tensor cores' arithmetic up to the order of the sums, as agent/cpu/bf16.py emulates bf16.

A dispatch mode, so it sees the matmuls of the forward and of the backward (which runs on the
calling thread on a CPU), but not those of other threads: a CPU pack on threads is not
covered, and needs none (on a GPU a pack is batched)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# Each matmul and the positions of its two factors (addmm's and baddbmm's first argument is
# the term added, in float32).
FACTORS = {
    aten.mm.default: (0, 1),
    aten.bmm.default: (0, 1),
    aten.addmm.default: (1, 2),
    aten.baddbmm.default: (1, 2),
}
LOW_BITS = (1 << 13) - 1  # float32's 23 mantissa bits less TF32's 10


def tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 `x` rounded to the nearest TF32 number (ties to even), kept as float32."""
    bits = x.view(torch.int32)
    even = (bits >> 13) & 1
    return ((bits + (LOW_BITS >> 1) + even) & ~LOW_BITS).view(torch.float32)


class TF32Matmuls(TorchDispatchMode):
    """`with TF32Matmuls():` float32 matmuls on TF32-rounded inputs, on this thread."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        factors = FACTORS.get(func, ())
        args = tuple(
            tf32(a)
            if i in factors and isinstance(a, torch.Tensor) and a.dtype == torch.float32
            else a
            for i, a in enumerate(args)
        )
        return func(*args, **(kwargs or {}))
