import math

import pytest
import torch
import torch.nn.functional as F

from agent.cpu.fast_ops import dropout, mish
from agent.math import TwoHot, gumbel_choice, simnorm, squashed_gaussian, symexp, symlog


def test_symlog_symexp_are_inverse():
    x = torch.linspace(-1000, 1000, 2001)
    assert torch.allclose(symexp(symlog(x)), x, rtol=1e-5, atol=1e-4)


def test_two_hot_round_trip_and_mass():
    two_hot = TwoHot(101, -10.0, 10.0)
    x = torch.tensor([-500.0, -3.7, -0.01, 0.0, 0.3, 1.0, 42.0, 9000.0]).unsqueeze(-1)
    probs = two_hot.encode(x)
    assert probs.shape == (8, 101)
    assert torch.allclose(probs.sum(-1), torch.ones(8))
    assert ((probs > 0).sum(-1) <= 2).all()
    decoded = two_hot.decode(probs.clamp_min(1e-30).log())
    assert torch.allclose(decoded, x, rtol=1e-3, atol=1e-3)


def test_two_hot_clamps_outside_support():
    two_hot = TwoHot(101, -10.0, 10.0)
    huge = torch.tensor([[1e30]])
    assert two_hot.encode(huge)[0, -1] == 1.0


def test_soft_cross_entropy_is_minimal_at_target():
    two_hot = TwoHot(101, -10.0, 10.0)
    target = torch.tensor([[2.5]])
    exact = two_hot.encode(target).clamp_min(1e-30).log()
    off = two_hot.encode(torch.tensor([[-2.5]])).clamp_min(1e-30).log()
    assert two_hot.cross_entropy(exact, target) < two_hot.cross_entropy(off, target)


def test_simnorm_is_softmax_per_group():
    x = torch.randn(3, 5, 64) * 4
    out = simnorm(x, 8)
    groups = out.view(3, 5, 8, 8)
    assert torch.allclose(groups.sum(-1), torch.ones(3, 5, 8), atol=1e-6)
    expected = F.softmax(x.view(3, 5, 8, 8), dim=-1).view(3, 5, 64)
    assert torch.allclose(out, expected, atol=1e-6)


def test_squashed_gaussian_log_prob_matches_change_of_variables():
    torch.manual_seed(0)
    mean, log_std, eps = torch.randn(4, 3), torch.randn(4, 3) * 0.3, torch.randn(4, 3)
    _, action, log_prob, _ = squashed_gaussian(mean, log_std, eps)
    normal = torch.distributions.Normal(mean, log_std.exp())
    pre_tanh = mean + eps * log_std.exp()
    expected = normal.log_prob(pre_tanh).sum(-1) - torch.log(1 - action.square() + 1e-6).sum(-1)
    assert torch.allclose(log_prob.squeeze(-1), expected, atol=1e-4)
    assert (action.abs() < 1).all()


def test_scaled_entropy_scales_the_gaussian_log_prob_before_the_tanh_correction():
    # Reference: scaled entropy = -action_dim * log N(pre-tanh action); the tanh correction is
    # not multiplied by the action dimension, so saturated actions are not penalised A-fold.
    torch.manual_seed(1)
    log_std, eps = torch.randn(4, 21) * 0.3, torch.randn(4, 21)
    calm = squashed_gaussian(torch.zeros(4, 21), log_std, eps)
    saturated = squashed_gaussian(torch.full((4, 21), 6.0), log_std, eps)
    gaussian = torch.distributions.Normal(0.0, log_std.exp()).log_prob(eps * log_std.exp())
    expected = -21 * gaussian.sum(-1, keepdim=True)
    assert torch.allclose(calm.scaled_entropy, expected, atol=1e-3)
    assert torch.allclose(saturated.scaled_entropy, expected, atol=1e-3)
    # The log-probability itself keeps the correction: saturation changes it a lot.
    assert (saturated.log_prob - calm.log_prob).abs().min() > 10


def test_gumbel_choice_follows_weights():
    torch.manual_seed(0)
    weights = torch.tensor([0.1, 0.6, 0.3]).expand(20000, 3)
    counts = (
        torch.bincount(gumbel_choice(weights, torch.rand(20000, 3)), minlength=3).float() / 20000
    )
    assert torch.allclose(counts, torch.tensor([0.1, 0.6, 0.3]), atol=0.02)


def test_fast_mish_matches_torch_value_and_gradient():
    x = (torch.randn(1000) * 8).requires_grad_()
    y = mish(x)
    (g,) = torch.autograd.grad(y.sum(), x)
    x2 = x.detach().clone().requires_grad_()
    y2 = F.mish(x2)
    (g2,) = torch.autograd.grad(y2.sum(), x2)
    assert torch.allclose(y, y2, atol=1e-5)
    assert torch.allclose(g, g2, atol=1e-5)
    with torch.no_grad():
        assert torch.allclose(mish(x.detach()), y2, atol=1e-5)


def test_fast_dropout_rate_and_scale():
    torch.manual_seed(0)
    x = torch.ones(400_000)
    y = dropout(x, 0.01)
    dropped = (y == 0).float().mean().item()
    assert 0.008 < dropped < 0.012
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / 0.99))
    assert math.isclose(y.mean().item(), 1.0, abs_tol=0.003)


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_dropout_edge_rates(p):
    y = dropout(torch.ones(1000), p)
    if p == 0.0:
        assert (y == 1).all()
    else:
        assert set(y.unique().tolist()) <= {0.0, 2.0}


def test_percentile_range_is_each_rows_own():
    from agent.math import percentile_range

    rows = torch.stack([torch.arange(101.0), torch.arange(101.0) * 10])
    assert torch.allclose(percentile_range(rows), torch.tensor([90.0, 900.0]))
    assert torch.allclose(percentile_range(rows.view(2, 1, 101)), torch.tensor([90.0, 900.0]))


@pytest.mark.parametrize("p", [0.5, 0.9])
def test_high_dropout_rates_drop_as_many_as_asked(p):
    # From 0.5 up the fast path's repeated positions would lower the rate a lot: torch's own.
    torch.manual_seed(0)
    y = dropout(torch.ones(100_000), p)
    assert abs((y == 0).float().mean().item() - p) < 0.01


def test_dropout_draws_from_its_generator_and_keeps_the_dtype():
    x = torch.ones(50_000)
    masks = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)  # the global stream must not matter
        masks.append(dropout(x, 0.01, torch.Generator().manual_seed(7)))
    assert torch.equal(*masks)
    assert dropout(x.bfloat16(), 0.01, torch.Generator().manual_seed(7)).dtype == torch.bfloat16


def test_two_hot_clamps_below_the_support_too():
    two_hot = TwoHot(101, -10.0, 10.0)
    assert two_hot.encode(torch.tensor([[-1e6]]))[0, 0] == 1.0
