"""The pixel encoder against the authors' (restated here from their layers.py: `conv`,
`ShiftAug`, `PixelPreprocess`), and the frame stacking of agent/pixels.py."""

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import tiny_config

from agent.agent import TDMPC2
from agent.config import make_config
from agent.conv import PAD, ConvEncoder, random_shift
from agent.errors import ConfigError
from agent.noise import PackNoise
from agent.pixels import FRAMES, OBS_DIM, SIZE, FrameStack, camera_of, frames_of
from agent.world_model import WorldModel


def authors_conv(in_channels=9, channels=32):
    """Their encoder after the shift: preprocess, four convolutions with ReLU between,
    flatten, SimNorm (groups of 8)."""
    return nn.Sequential(
        nn.Conv2d(in_channels, channels, 7, stride=2),
        nn.ReLU(),
        nn.Conv2d(channels, channels, 5, stride=2),
        nn.ReLU(),
        nn.Conv2d(channels, channels, 3, stride=2),
        nn.ReLU(),
        nn.Conv2d(channels, channels, 3, stride=1),
        nn.Flatten(),
    )


def authors_forward(net, images):
    x = net(images.float().div(255.0).sub(0.5))
    return F.softmax(x.view(*x.shape[:-1], -1, 8), dim=-1).view(x.shape)


def authors_shift(x, shift, pad=3):
    """Their ShiftAug (pad 3) with the shift given instead of drawn: replicate pad, then
    grid_sample of the padded image at pixel centres moved by the shift (x first)."""
    x = x.float()
    n, _, h, w = x.shape
    x = F.pad(x, (pad,) * 4, "replicate")
    eps = 1.0 / (h + 2 * pad)
    arange = torch.linspace(-1.0 + eps, 1.0 - eps, h + 2 * pad)[:h]
    arange = arange.unsqueeze(0).repeat(h, 1).unsqueeze(2)
    base_grid = torch.cat([arange, arange.transpose(1, 0)], dim=2).unsqueeze(0).repeat(n, 1, 1, 1)
    grid = base_grid + shift.view(n, 1, 1, 2).float() * 2.0 / (h + 2 * pad)
    return F.grid_sample(x, grid, padding_mode="zeros", align_corners=False)


def copy_weights(ours: ConvEncoder, theirs: nn.Sequential, worker: int = 0) -> None:
    convs = [m for m in theirs if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        for mine, conv in zip(ours.convs, convs, strict=True):
            conv.weight.copy_(mine.weight[worker])
            conv.bias.copy_(mine.bias[worker])


def pixels(*lead, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (*lead, OBS_DIM), dtype=torch.uint8, generator=g)


def test_encoder_shapes_and_parameters_are_the_authors_at_5m():
    cfg = make_config(5, obs="rgb", device="cpu")
    ours = WorldModel(cfg, OBS_DIM, 6).encoder
    theirs = authors_conv()
    shapes = [tuple(p.shape[1:]) for p in ours.parameters()]  # less the worker dimension
    assert shapes == [tuple(p.shape) for p in theirs.parameters()]
    assert sum(p.numel() for p in ours.parameters()) == 58_272
    assert sum(p.numel() for p in theirs.parameters()) == 58_272
    assert ours.project is None and ours.features == cfg.latent_dim == 512
    x = pixels(5)
    assert theirs(x.view(5, 9, SIZE, SIZE).float()).shape == (5, 512)


def test_encoder_without_the_shift_equals_the_authors():
    cfg = make_config(5, obs="rgb", device="cpu")
    ours = WorldModel(cfg, OBS_DIM, 6).encoder
    theirs = authors_conv()
    copy_weights(ours, theirs)
    obs = pixels(1, 7)
    expected = authors_forward(theirs, obs.view(7, 9, SIZE, SIZE))
    got = ours(obs)  # no noise: no shift
    assert got.shape == (1, 7, 512)
    torch.testing.assert_close(got[0], expected, atol=1e-6, rtol=1e-5)
    # float observations (acting) give the same latents as uint8 ones (the buffer's)
    torch.testing.assert_close(ours(obs.float()), got)


def test_conv_weights_start_as_torch_conv2d_starts_them():
    # The authors' weight_init leaves Conv2d alone: torch's own initialisation.
    torch.manual_seed(3)
    ours = ConvEncoder(32, 512, 8)
    torch.manual_seed(3)
    theirs = authors_conv()
    for mine, conv in zip(ours.convs, [m for m in theirs if isinstance(m, nn.Conv2d)]):
        assert torch.equal(mine.weight[0], conv.weight) and torch.equal(mine.bias[0], conv.bias)


def test_shift_equals_the_authors_grid_sample_for_every_shift():
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (49, 9, SIZE, SIZE), dtype=torch.uint8, generator=g)
    shift = torch.cartesian_prod(torch.arange(7), torch.arange(7))  # all 49 (x, y) shifts
    ours = random_shift(images, shift)
    assert ours.dtype == torch.uint8
    # bilinear at exact pixel centres: the pixel's value up to float rounding
    torch.testing.assert_close(ours.float(), authors_shift(images, shift), atol=5e-3, rtol=0)
    # a shift of (PAD, PAD) is no shift; (0, 0) takes the padded border's replicate
    centre = (shift == PAD).all(1)
    assert torch.equal(ours[centre], images[centre])
    corner = ours[(shift == 0).all(1)][0]
    assert torch.equal(
        corner[:, :PAD, PAD:], images[0, :, :1, : SIZE - PAD].expand_as(corner[:, :PAD, PAD:])
    )


def test_shifts_are_drawn_per_image_from_each_workers_stream():
    noise = PackNoise([1, 2], torch.device("cpu"))
    drawn = noise.integers(2 * PAD + 1, 4000, 2)
    assert drawn.shape == (2, 4000, 2)
    assert set(drawn.unique().tolist()) == set(range(7))
    assert not torch.equal(drawn[0], drawn[1])
    lone = PackNoise([2], torch.device("cpu")).integers(2 * PAD + 1, 4000, 2)
    assert torch.equal(lone[0], drawn[1]), "worker 1 draws what an agent of its seed would"


def test_the_encoder_shifts_when_given_a_stream():
    cfg = make_config(5, obs="rgb", device="cpu")
    enc = WorldModel(cfg, OBS_DIM, 6).encoder
    obs = pixels(1, 64)
    plain = enc(obs)
    noise = PackNoise([5], torch.device("cpu"))
    state = noise.get_state(0)
    shifted = enc(obs, noise)
    assert not torch.allclose(shifted, plain)
    # the same draws again: the same latents; and what they are is the shifted images' latents
    noise.set_state(0, state)
    shift = noise.integers(2 * PAD + 1, 64, 2)[0]
    moved = random_shift(obs.view(64, 9, SIZE, SIZE), shift).reshape(1, 64, OBS_DIM)
    torch.testing.assert_close(shifted, enc(moved))


@pytest.mark.parametrize("size", ["tiny", 5], ids=["projected", "5M-features"])
def test_a_pack_encodes_as_its_lone_workers(size):
    cfg = tiny_config(obs="rgb") if size == "tiny" else make_config(5, obs="rgb", device="cpu")
    pack = WorldModel(cfg, OBS_DIM, 1, pack=2).encoder
    obs = pixels(2, 5)
    together = pack(obs)
    for k in range(2):
        lone = ConvEncoder(cfg.num_channels, cfg.latent_dim, cfg.simnorm_dim)
        lone.load_state_dict({name: t[k : k + 1] for name, t in pack.state_dict().items()})
        torch.testing.assert_close(together[k : k + 1], lone(obs[k : k + 1]), atol=1e-6, rtol=1e-5)


def test_other_model_sizes_map_the_512_features_to_their_latent():
    for size in (1, 19):
        cfg = make_config(size, obs="rgb", device="cpu")
        enc = WorldModel(cfg, OBS_DIM, 6).encoder
        assert enc.project is not None and enc.project.weight.shape == (1, 512, cfg.latent_dim)
        z = enc(pixels(1, 3))
        assert z.shape == (1, 3, cfg.latent_dim)
        groups = z.view(1, 3, -1, cfg.simnorm_dim).sum(-1)
        torch.testing.assert_close(groups, torch.ones_like(groups))  # SimNorm'd


def test_pixel_config_is_checked():
    with pytest.raises(ConfigError, match="obs must be state or rgb") as err:
        make_config(1, obs="depth")
    assert err.value.field == "obs"
    with pytest.raises(ValueError, match="pixel observations"):
        WorldModel(tiny_config(obs="rgb"), 24, 1)


def test_a_pixel_agent_acts_and_updates_on_uint8_batches():
    cfg = tiny_config(obs="rgb")
    agent = TDMPC2(cfg, OBS_DIM, 1)
    h, b = cfg.horizon, cfg.batch_size
    batch = (
        pixels(h + 1, b),
        torch.rand(h, b, 1) * 2 - 1,
        torch.rand(h, b, 1),
        torch.zeros(h, b, 1),
    )
    before = agent.model.encoder.convs[0].weight.clone()
    info = agent.update(batch)
    assert all(math.isfinite(float(v)) for v in info.values())
    assert not torch.equal(before, agent.model.encoder.convs[0].weight), "the encoder learns"
    action = agent.act(pixels(seed=1), t0=True)
    assert action.shape == (1,) and -1 <= float(action) <= 1


# frame stacking --------------------------------------------------------------------------------
def frame(value: int) -> np.ndarray:
    return np.full((SIZE, SIZE, 3), value, np.uint8)


def test_frame_stack_fills_at_reset_and_shifts_at_each_step():
    stack = FrameStack()
    first = stack.reset(frame(7))
    assert first.shape == (OBS_DIM,) and first.dtype == np.uint8
    assert [int(f.max()) for f in frames_of(first)] == [7, 7, 7]
    assert [int(f.max()) for f in frames_of(stack.push(frame(8)))] == [7, 7, 8]
    assert [int(f.max()) for f in frames_of(stack.push(frame(9)))] == [7, 8, 9]
    assert [int(f.max()) for f in frames_of(stack.push(frame(10)))] == [8, 9, 10]
    assert [int(f.max()) for f in frames_of(stack.reset(frame(1)))] == [1, 1, 1]


def test_frames_are_concatenated_on_channels_as_the_authors_do():
    stack = FrameStack()
    images = [
        np.random.default_rng(i).integers(0, 256, (SIZE, SIZE, 3), np.uint8) for i in range(3)
    ]
    stack.reset(images[0])
    stack.push(images[1])
    obs = stack.push(images[2])
    theirs = np.concatenate([im.transpose(2, 0, 1) for im in images])  # (9, 64, 64)
    assert np.array_equal(obs.reshape(3 * FRAMES, SIZE, SIZE), theirs)
    assert np.array_equal(frames_of(obs)[2], images[2])


def test_the_authors_cameras():
    assert camera_of("quadruped") == 2
    assert {camera_of(d) for d in ("walker", "cheetah", "cartpole", "reacher")} == {0}


@pytest.mark.parametrize("threads", [True, False], ids=["cpu-threads", "batched"])
def test_a_pixel_pack_updates_and_plans_as_its_lone_workers(threads, monkeypatch):
    """Batched (a GPU's path: one grouped convolution for the pack) or on a CPU's threads, a
    pack's update and plan are its lone workers' (dropout off: a pack draws its masks apart)."""
    monkeypatch.setattr(TDMPC2, "cpu_threads", threads)
    cfg = tiny_config(obs="rgb", dropout=0.0)
    pack = TDMPC2(cfg, OBS_DIM, 1, seeds=[1, 2])
    h, b = cfg.horizon, cfg.batch_size
    batch = (pixels(2, h + 1, b), torch.rand(2, h, b, 1) * 2 - 1, torch.rand(2, h, b, 1))
    batch = (*batch, torch.zeros(2, h, b, 1))
    obs = pixels(2, 3, seed=4)
    together = pack.update(batch)
    acted = pack.act(obs, t0=True)
    for k, seed in enumerate([1, 2]):
        lone = TDMPC2(cfg, OBS_DIM, 1, seeds=[seed])
        info = lone.update(tuple(x[k] for x in batch))
        for name in ("total_loss", "grad_norm", "consistency_loss"):
            torch.testing.assert_close(together[name][k], info[name], rtol=1e-4, atol=1e-5)
        conv = lone.model.encoder.convs[0].weight[0]
        torch.testing.assert_close(
            pack.model.encoder.convs[0].weight[k], conv, rtol=1e-4, atol=1e-6
        )
        torch.testing.assert_close(
            acted[k], lone.act(obs[k : k + 1], t0=True)[0], atol=1e-4, rtol=0
        )


def test_encoding_leaves_the_observations_as_they_were():
    enc = ConvEncoder(32, 512, 8)
    obs = pixels(1, 4).float()
    kept = obs.clone()
    first = enc(obs)
    assert torch.equal(obs, kept)
    torch.testing.assert_close(enc(obs), first)


def test_the_convolutions_stay_float32_under_a_cpus_bf16_autocast():
    """bf16 runs autocast the networks on a CPU; the convolutions stay float32 (oneDNN's bf16
    convolutions ran 8x slower here), so the encoder's output is float32's exactly."""
    enc = ConvEncoder(32, 512, 8)
    obs = pixels(1, 3)
    plain = enc(obs)
    with torch.autocast("cpu", torch.bfloat16):
        inside = enc(obs)
    assert inside.dtype == torch.float32 and torch.equal(inside, plain)
