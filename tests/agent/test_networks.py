import pytest
import torch

from agent.config import make_config
from agent.layers import Layer
from agent.noise import PackNoise
from agent.world_model import WorldModel


@pytest.mark.parametrize("pack", [1, 3])
def test_ensemble_layer_equals_separate_members(pack):
    torch.manual_seed(0)
    layer = Layer((6, 3), 5, members=4, act="mish", pack=pack)
    x, a = torch.randn(pack, 7, 6), torch.randn(pack, 7, 3)
    out = layer((x, a))
    assert out.shape == (pack, 4, 7, 5)
    for p in range(pack):
        for m in range(4):
            h = torch.cat([x[p], a[p]], -1) @ layer.weight[p, m] + layer.bias[p, m]
            h = torch.nn.functional.layer_norm(h, (5,)) * layer.ln_weight[p, m]
            h = h + layer.ln_bias[p, m]
            assert torch.allclose(out[p, m], torch.nn.functional.mish(h), atol=1e-5)
    # Each worker its own pair of members.
    pairs = torch.tensor([[2, 0], [1, 3], [3, 2]])[:pack]
    chosen = layer((x, a), members=pairs)
    for p in range(pack):
        assert torch.allclose(chosen[p], out[p, pairs[p]], atol=1e-6)


@pytest.mark.parametrize("pack", [1, 3])
def test_pack_layer_equals_each_worker_alone(pack):
    torch.manual_seed(0)
    layer = Layer((6,), 5, act="mish", pack=pack)
    x = torch.randn(pack, 4, 7, 6)
    out = layer(x)
    for p in range(pack):
        h = x[p] @ layer.weight[p] + layer.bias[p]
        h = torch.nn.functional.layer_norm(h, (5,)) * layer.ln_weight[p] + layer.ln_bias[p]
        assert torch.allclose(out[p], torch.nn.functional.mish(h), atol=1e-5)


@pytest.mark.parametrize("pack", [1, 2])
def test_layer_broadcasts_a_shared_input(pack):
    torch.manual_seed(0)
    layer = Layer((8, 2), 4, act="simnorm", simnorm_dim=2, pack=pack)
    z, a = torch.randn(pack, 3, 1, 8), torch.randn(pack, 3, 5, 2)
    broadcast = layer((z, a))
    explicit = layer((z.expand(pack, 3, 5, 8).contiguous(), a))
    assert broadcast.shape == (pack, 3, 5, 4)
    assert torch.allclose(broadcast, explicit, atol=1e-6)


@pytest.mark.parametrize("size", [1, 5, 19, 48])
def test_world_model_shapes_for_every_preset(size):
    cfg = make_config(size)
    obs_dim, action_dim, n = 17, 6, 4
    p = 2  # a pack of two workers: every tensor leads with the worker dimension
    model = WorldModel(cfg, obs_dim, action_dim, pack=p)
    z = model.encode(torch.randn(p, n, obs_dim))
    a = torch.rand(p, n, action_dim) * 2 - 1
    assert z.shape == (p, n, cfg.latent_dim)
    groups = z.view(p, n, -1, cfg.simnorm_dim)
    assert torch.allclose(groups.sum(-1), torch.ones_like(groups[..., 0]), atol=1e-5)
    assert model.next(z, a).shape == (p, n, cfg.latent_dim)
    assert model.reward_logits(z, a).shape == (p, n, cfg.num_bins)
    assert model.q_logits((z, a)).shape == (p, cfg.num_q, n, cfg.num_bins)
    pairs = PackNoise([1, 2], "cpu").q_pair(cfg.num_q)
    assert model.q_logits((z, a), pairs, target=True).shape == (p, 2, n, cfg.num_bins)
    mean, action, log_prob, scaled_entropy = model.policy(z, torch.randn(p, n, action_dim))
    assert mean.shape == action.shape == (p, n, action_dim) and log_prob.shape == (p, n, 1)
    assert scaled_entropy.shape == (p, n, 1)
    assert (action.abs() <= 1).all()
    # Reward and Q heads start at zero output, as in the reference initialisation.
    assert model.reward_logits(z, a).abs().max() == 0
    assert model.q_logits((z, a)).abs().max() == 0
    encoder_layers = len(model.encoder.layers)
    assert encoder_layers == max(cfg.num_enc_layers, 2)


def test_random_q_pair_is_two_distinct_members_per_worker():
    noise = PackNoise([1, 2, 3], "cpu")
    seen = set()
    for _ in range(20):
        pairs = noise.q_pair(5)
        assert pairs.shape == (3, 2) and (pairs[:, 0] != pairs[:, 1]).all() and pairs.max() < 5
        seen.add(tuple(pairs[0].tolist()))
    assert len(seen) > 3


def test_episodic_model_has_termination_head():
    model = WorldModel(make_config(1, episodic=True), 4, 2)
    assert model.termination_logit(model.encode(torch.randn(1, 3, 4))).shape == (1, 3, 1)
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
    z, a = model.encode(torch.randn(1, 16, 4)), torch.rand(1, 16, 2) * 2 - 1
    pair = torch.tensor([[0, 1]])
    first = model.q_logits((z, a), pair, target=True)
    assert torch.equal(first, model.q_logits((z, a), pair, target=True))
    # The online Qs do drop units in training (the value loss and policy loss use them so).
    model.qs.load_state_dict(model.target_qs.state_dict())
    assert not torch.equal(model.q_logits((z, a), pair), model.q_logits((z, a), pair))


def test_a_layer_says_what_it_is():
    model = WorldModel(make_config(1), 5, 2, pack=2)
    assert repr(model.qs.layers[0]).endswith(
        "(pack=2, members=2, in=(128, 2), out=384, act=mish, dropout=0.01)"
    )
    assert repr(model.pi.layers[0]).endswith("(pack=2, in=(128,), out=384, act=mish, dropout=0.0)")


def test_layers_start_as_published_and_mlps_are_built_as_declared():
    from agent.layers import MLP

    layer = Layer((512,), 512)
    assert layer.weight.shape == (1, 512, 512) and layer.simnorm_dim == 8  # defaults: 1 worker
    assert abs(layer.weight.std().item() - 0.02) < 0.001 and not layer.bias.any()
    assert layer(torch.randn(1, 3, 512)).requires_grad  # weights take gradients by default
    assert not layer(torch.randn(1, 3, 512), detach=True).requires_grad
    plain = MLP((4,), [8], 16, out_act="simnorm", out_norm=True)
    assert plain.layers[-1].simnorm_dim == 8 and plain.layers[0].weight.shape[0] == 1
    mlp = MLP((4,), [8, 16], 3, out_act="simnorm", out_norm=True, simnorm_dim=3, dropout=0.1)
    assert [lay.dropout for lay in mlp.layers] == [0.1, 0.0, 0.0]  # the first layer only
    assert mlp.layers[-1].in_dims == (16,) and mlp.layers[-1].simnorm_dim == 3
    mlp.zero_last_layer()
    assert not mlp.layers[-1].weight.any() and all(lay.weight.any() for lay in mlp.layers[:-1])


def test_a_layers_dropout_draws_from_its_own_generator():
    layer = Layer((16,), 4000, dropout=0.1)
    x = torch.randn(1, 1, 16)
    outs = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)  # torch's global stream must not matter
        layer.generator = torch.Generator().manual_seed(3)
        outs.append(layer(x))
    assert torch.equal(*outs)
    assert not torch.equal(outs[0], layer.eval()(x))  # dropout did act


def test_the_latents_simnorm_groups_and_every_head_follow_the_config_and_the_pack():
    cfg = make_config(1, simnorm_dim=4, episodic=True)
    model = WorldModel(cfg, 5, 2, pack=2)
    assert model.encoder.layers[-1].simnorm_dim == model.dynamics.layers[-1].simnorm_dim == 4
    for net in (model.encoder, model.dynamics, model.reward, model.termination, model.pi):
        assert all(lay.weight.shape[0] == 2 for lay in net.layers)
