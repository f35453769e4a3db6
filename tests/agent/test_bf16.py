"""bf16 on a CPU without a bf16 unit: the same numbers as PyTorch's bf16 matmuls, computed in
float32 (agent/cpu/bf16.py)."""

import torch
from conftest import tiny_config

from agent import planner
from agent.agent import TDMPC2
from agent.cpu.bf16 import cpu_bf16
from agent.math import TwoHot, symexp


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


# What bf16 rounding harms stays float32 under autocast ------------------------------------
def _values_near(q: float, n: int = 1000) -> tuple[TwoHot, torch.Tensor]:
    """bf16 logits (as a head computes them under autocast) of value distributions around q."""
    two = TwoHot(101, -10.0, 10.0)
    g = torch.Generator().manual_seed(1)
    targets = q * (1 + 0.1 * torch.randn(n, 1, generator=g))
    logits = two.encode(targets).clamp_min(1e-4).log() + 0.3 * torch.randn(n, 101, generator=g)
    return two, logits.to(torch.bfloat16)


def test_the_decoded_value_and_the_cross_entropy_are_float32_under_bf16_autocast():
    two, logits = _values_near(200.0)
    targets = torch.full((logits.shape[0], 1), 201.5)
    with cpu_bf16(native=False):
        value, ce = two.decode(logits), two.cross_entropy(logits, targets)
    wide = logits.float()
    assert value.dtype == ce.dtype == torch.float32
    assert torch.allclose(value, two.decode(wide), rtol=1e-6, atol=0)
    assert torch.allclose(ce, two.cross_entropy(wide, targets), rtol=1e-6, atol=1e-6)
    # In bf16 the value would be off by up to 1 %: far more than one backup at 0.99 moves it.
    rounded = symexp((torch.softmax(logits, -1) @ two.centres.bfloat16()).unsqueeze(-1))
    assert ((rounded.float() - value).abs() / value).max() > 2e-3


def test_the_planners_values_and_weights_are_float32_under_bf16_autocast(monkeypatch):
    cfg = tiny_config(bf16=True, num_samples=32, num_elites=8, num_pi_trajs=4, iterations=2)
    agent = TDMPC2(cfg, 5, 2)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # heads that predict values of about 150, as DMControl's, and vary
        for head in (agent.model.qs, agent.model.reward):
            last = head.layers[-1]
            last.weight.copy_(torch.randn(last.weight.shape, generator=g))
            last.bias[..., 75] = 10.0
    seen = []
    real = planner.elites

    def spy(value, num_elites, temperature):
        idx, score = real(value, num_elites, temperature)
        seen.append((value.clone(), score.clone(), idx))
        return idx, score

    monkeypatch.setattr(planner, "elites", spy)
    agent.act(torch.randn(5), t0=True)
    assert len(seen) == cfg.iterations
    for value, score, idx in seen:
        assert value.dtype == score.dtype == torch.float32
        assert value.abs().mean() > 50 and value.std() > 1
        exact = torch.softmax(0.5 * value.double().gather(-1, idx), -1)
        assert torch.allclose(score.double(), exact, atol=1e-6)


def test_the_bf16_knob_changes_the_number_format_between_two_calls():
    """bf16 is a live knob: autocast is entered per call, so a plan right after the change
    computes its matmuls in bf16, and one after turning it off in float32 again."""
    agent = TDMPC2(tiny_config(bf16=False), 5, 1)
    formats = []
    agent.model.encoder.register_forward_hook(lambda m, i, out: formats.append(out.dtype))
    obs = torch.randn(5)
    for bf16 in (False, True, False):
        agent.set_knobs(bf16=bf16)
        agent.act(obs, t0=True)
        assert set(formats) == {torch.bfloat16 if bf16 else torch.float32}
        formats.clear()
