"""bf16 on a CPU without a bf16 unit: the same numbers as PyTorch's bf16 matmuls, computed in
float32 (agent/cpu/bf16.py)."""

import torch

from agent.cpu.bf16 import cpu_bf16


def _ulps_apart(ours: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """How many bf16 steps (at the reference's magnitude) separate two results."""
    reference = reference.float()
    step = torch.exp2(torch.floor(torch.log2(reference.abs().clamp(min=1e-30))) - 7)
    return (ours.float() - reference).abs() / step


def _leaves(*tensors: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
    return [t.to(dtype).requires_grad_() for t in tensors]


def test_bf16_without_a_unit_gives_the_numbers_of_bf16_matmuls_forward_and_backward():
    g = torch.Generator().manual_seed(0)
    # 512-term sums: an accumulation in bf16 (or none in bf16 at all) would show.
    x, w, b = (
        torch.randn(3, 64, 512, generator=g),
        torch.randn(3, 512, 48, generator=g),
        torch.randn(3, 1, 48, generator=g),
    )
    weights = torch.randn(3, 64, 48, generator=g)

    def layer(x, w, b):  # a bmm layer and a plain one, as agent/layers.py runs them
        y = torch.baddbmm(b, x, w)
        return torch.addmm(b[0], y[0], w[0, :48].T.contiguous()) * y[1:].mean(0)

    # The reference: bf16 tensors through PyTorch's own bf16 kernels.
    ref = _leaves(x, w, b, dtype=torch.bfloat16)
    y_ref = layer(*ref)
    (y_ref.float() * weights[0]).sum().backward()
    # Ours: float32 weights and inputs under autocast, matmuls emulated.
    ours = _leaves(x, w, b, dtype=torch.float32)
    with cpu_bf16(native=False):
        y = layer(*ours)
        (y.float() * weights[0]).sum().backward()
    assert y.dtype == torch.bfloat16
    assert _ulps_apart(y, y_ref).max() <= 1  # only the order of the sums differs
    for mine, theirs in zip(ours, ref):
        assert mine.grad.dtype == torch.float32
        assert (_ulps_apart(mine.grad, theirs.grad) <= 1).float().mean() > 0.99
    # ... and they are bf16's numbers, not float32's.
    y32 = layer(x, w, b)
    assert (_ulps_apart(y, y32) >= 0.5).float().mean() > 0.2
