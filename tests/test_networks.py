import pytest
import torch

from agent.config import make_config
from agent.layers import Layer
from agent.world_model import WorldModel


def test_ensemble_layer_equals_separate_members():
    torch.manual_seed(0)
    layer = Layer((6, 3), 5, members=4, act="mish")
    x, a = torch.randn(7, 6), torch.randn(7, 3)
    out = layer((x, a))
    assert out.shape == (4, 7, 5)
    for m in range(4):
        h = torch.cat([x, a], -1) @ layer.weight[m] + layer.bias[m]
        h = torch.nn.functional.layer_norm(h, (5,)) * layer.ln_weight[m] + layer.ln_bias[m]
        assert torch.allclose(out[m], torch.nn.functional.mish(h), atol=1e-5)
    pair = torch.tensor([2, 0])
    assert torch.allclose(layer((x, a), members=pair), out[pair], atol=1e-6)


def test_layer_broadcasts_a_shared_input():
    torch.manual_seed(0)
    layer = Layer((8, 2), 4, act="simnorm", simnorm_dim=2)
    z, a = torch.randn(3, 1, 8), torch.randn(3, 5, 2)
    broadcast = layer((z, a))
    explicit = layer((z.expand(3, 5, 8).contiguous(), a))
    assert broadcast.shape == (3, 5, 4)
    assert torch.allclose(broadcast, explicit, atol=1e-6)


@pytest.mark.parametrize("size", [1, 5, 19, 48])
def test_world_model_shapes_for_every_preset(size):
    cfg = make_config(size)
    obs_dim, action_dim, n = 17, 6, 4
    model = WorldModel(cfg, obs_dim, action_dim)
    z = model.encode(torch.randn(n, obs_dim))
    a = torch.rand(n, action_dim) * 2 - 1
    assert z.shape == (n, cfg.latent_dim)
    groups = z.view(n, -1, cfg.simnorm_dim)
    assert torch.allclose(groups.sum(-1), torch.ones_like(groups[..., 0]), atol=1e-5)
    assert model.next(z, a).shape == (n, cfg.latent_dim)
    assert model.reward_logits(z, a).shape == (n, cfg.num_bins)
    assert model.q_logits((z, a)).shape == (cfg.num_q, n, cfg.num_bins)
    assert model.q_logits((z, a), model.random_q_pair(), target=True).shape == (2, n, cfg.num_bins)
    mean, action, log_prob, scaled_entropy = model.policy(z)
    assert mean.shape == action.shape == (n, action_dim) and log_prob.shape == (n, 1)
    assert scaled_entropy.shape == (n, 1)
    assert (action.abs() <= 1).all()
    # Reward and Q heads start at zero output, as in the reference initialisation.
    assert model.reward_logits(z, a).abs().max() == 0
    assert model.q_logits((z, a)).abs().max() == 0
    encoder_layers = len(model.encoder.layers)
    assert encoder_layers == max(cfg.num_enc_layers, 2)


def test_random_q_pair_is_two_distinct_members():
    model = WorldModel(make_config(5), 4, 2)
    for _ in range(20):
        pair = model.random_q_pair()
        assert pair.shape == (2,) and pair[0] != pair[1] and pair.max() < 5


def test_episodic_model_has_termination_head():
    model = WorldModel(make_config(1, episodic=True), 4, 2)
    assert model.termination_logit(model.encode(torch.randn(3, 4))).shape == (3, 1)
    assert WorldModel(make_config(1), 4, 2).termination is None


def test_target_qs_stay_in_eval_mode_so_the_td_target_has_no_dropout():
    # The reference keeps its target Qs in eval mode while training: the TD target is computed
    # without dropout. With a high dropout rate two target evaluations must still agree.
    model = WorldModel(make_config(1, dropout=0.3), 4, 2)
    with torch.no_grad():
        for p in model.target_qs.parameters():
            p.normal_(0, 0.5)
    model.train()
    assert model.qs.training and not model.target_qs.training
    z, a = model.encode(torch.randn(16, 4)), torch.rand(16, 2) * 2 - 1
    pair = torch.tensor([0, 1])
    first = model.q_logits((z, a), pair, target=True)
    assert torch.equal(first, model.q_logits((z, a), pair, target=True))
    # The online Qs do drop units in training (the value loss and policy loss use them so).
    model.qs.load_state_dict(model.target_qs.state_dict())
    assert not torch.equal(model.q_logits((z, a), pair), model.q_logits((z, a), pair))
