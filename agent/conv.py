"""The authors' pixel encoder (`conv` in their layers.py) for a pack of P workers: a random
shift (replicate padding of 3, 0-6 pixels in x and y per image), pixels to [-0.5, 0.5], four
convolutions of `num_channels` (kernel 7 stride 2, 5 stride 2, 3 stride 2, 3 stride 1) with
ReLU between, flattened (32 x 4 x 4 = 512), then SimNorm. Where the flattened size is not the
latent's (it is at 5M only: 512), a linear layer maps it to the latent first (a deviation the
README lists). As theirs, the shift is drawn in every call: learning, planning and acting.

Weights carry the pack's leading worker dimension like agent/layers.py's: one worker runs plain
convolutions, a pack runs each as one grouped convolution (the workers' channels side by side).
Images are channels-last (NHWC): the CPU's convolutions ran 2-3x faster so. On a CPU they stay
float32 under bf16 autocast: oneDNN's bf16 convolutions ran 8x slower here (BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from agent.layers import Layer
from agent.math import simnorm
from agent.noise import PackNoise
from agent.pixels import CHANNELS, FRAMES, SIZE

PAD = 3  # the shift's padding: shifts of 0 to 2 * PAD pixels
KERNELS = ((7, 2), (5, 2), (3, 2), (3, 1))  # (kernel, stride) of each convolution


def conv_side(size: int = SIZE) -> int:
    """The side of the last convolution's output for a size x size input (4 for 64)."""
    for kernel, stride in KERNELS:
        size = (size - kernel) // stride + 1
    return size


def random_shift(images: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Images (N, C, S, S) moved by `shift` (N, 2) whole pixels in [0, 2 * PAD] (x first, as
    the authors' sampling grid has it) within their replicate-padded border: pixel (y, x) of
    image n is the input's (y + shift_y - PAD, x + shift_x - PAD), clamped to the image. The
    authors sample the padded image bilinearly at pixel centres, which gives these values
    (up to float rounding); an index is exact and works on uint8, before the float copy."""
    n, c, s = images.shape[0], images.shape[1], images.shape[-1]
    ar = torch.arange(s, device=images.device)
    rows = (shift[:, 1, None] + ar - PAD).clamp(0, s - 1)
    cols = (shift[:, 0, None] + ar - PAD).clamp(0, s - 1)
    flat = (rows[:, :, None] * s + cols[:, None, :]).view(n, 1, s * s).expand(n, c, s * s)
    return images.reshape(n, c, s * s).gather(2, flat).view(n, c, s, s)


class Conv(nn.Module):
    """One convolution of P workers: weight (P, out, in, k, k), bias (P, out); each worker's
    initialised as torch's Conv2d initialises its own (the authors leave it so)."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int, pack: int):
        super().__init__()
        self.stride = stride
        self.weight = nn.Parameter(torch.empty(pack, out_channels, in_channels, kernel, kernel))
        self.bias = nn.Parameter(torch.empty(pack, out_channels))
        bound = 1 / math.sqrt(in_channels * kernel * kernel)
        for k in range(pack):
            nn.init.kaiming_uniform_(self.weight[k], a=math.sqrt(5))
            nn.init.uniform_(self.bias[k], -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, P * in, H, W), the workers' channels side by side -> (N, P * out, H', W')."""
        p = self.weight.shape[0]
        weight = self.weight.flatten(0, 1).contiguous(memory_format=torch.channels_last)
        return F.conv2d(x, weight, self.bias.flatten(), self.stride, groups=p)

    def extra_repr(self) -> str:
        p, out, inp, k, _ = self.weight.shape
        return f"pack={p}, in={inp}, out={out}, kernel={k}, stride={self.stride}"


class ConvEncoder(nn.Module):
    """Stacked frames (P, ..., FRAMES * 3 * SIZE * SIZE), uint8 or float in [0, 255] ->
    SimNorm'd latents (P, ..., latent_dim)."""

    def __init__(self, channels: int, latent_dim: int, simnorm_dim: int, pack: int = 1):
        super().__init__()
        self.in_channels, self.simnorm_dim = CHANNELS * FRAMES, simnorm_dim
        ins = (self.in_channels, channels, channels, channels)
        self.convs = nn.ModuleList(
            Conv(i, channels, k, s, pack) for i, (k, s) in zip(ins, KERNELS, strict=True)
        )
        self.features = channels * conv_side() ** 2
        self.project = None
        if self.features != latent_dim:  # the authors' 512 fits the 5M latent only
            self.project = Layer((self.features,), latent_dim, norm=False, act=None, pack=pack)

    def forward(self, obs: torch.Tensor, noise: PackNoise | None = None) -> torch.Tensor:
        """`noise`: the stream the shifts are drawn from (None: no shift)."""
        p, lead = obs.shape[0], obs.shape[1:-1]
        images = obs.reshape(-1, self.in_channels, SIZE, SIZE)  # (P * N, C, S, S)
        n = images.shape[0] // p
        if noise is not None:
            images = random_shift(images, noise.integers(2 * PAD + 1, n, 2).view(p * n, 2))
        cpu = obs.device.type == "cpu"
        with torch.autocast("cpu", enabled=False) if cpu else contextlib.nullcontext():
            x = images.float() / 255 - 0.5  # not in place: float images may be the caller's
            # (N, P * C, S, S): the workers' images side by side on channels, channels last
            x = x.view(p, n, self.in_channels, SIZE, SIZE).transpose(0, 1)
            x = x.reshape(n, p * self.in_channels, SIZE, SIZE)
            x = x.contiguous(memory_format=torch.channels_last)
            for i, conv in enumerate(self.convs):
                x = conv(x)
                if i < len(self.convs) - 1:
                    x = F.relu(x)
            # each worker's (C, 4, 4) flattened as torch's Flatten does: channel, row, column
            x = x.reshape(n, p, -1).transpose(0, 1)  # (P, N, features)
        if self.project is not None:
            x = self.project(x)
        return simnorm(x, self.simnorm_dim).view(p, *lead, -1)
