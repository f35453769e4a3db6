"""Random numbers for a pack of workers: each worker draws from its own stream.

Worker k of a pack draws exactly what an agent of its own seed would draw alone, so a pack and
separate agents of the same seeds make the same updates and plans (tests/agent/test_pack.py);
dropout masks are the exception: a lone agent draws them from torch's global generator, a CPU
pack's worker from its own stream (agent/pack/threads.py), a GPU pack for all workers at once.
Inside a captured CUDA graph one call per draw matters more than separate streams: there the pack
draws (P, ...) at once from the device's generator (`shared`), still independent per worker,
but no longer the same numbers as a lone agent of the same seed. Its saved state is then that
generator's, so a resumed compiled pack goes on with the numbers it would have drawn.

A state saved on another kind of device (a run started on a GPU, resumed on a CPU) cannot be
loaded into this device's generator (each kind has its own algorithm): the stream is then
seeded from the saved state's bytes, the same way every time, and the run goes on.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence

import torch


class PackNoise:
    def __init__(self, seeds: Sequence[int], device: torch.device, shared: bool = False):
        self.device, self.pack, self.shared = torch.device(device), len(seeds), shared
        self.generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        if shared:
            torch.manual_seed(seeds[0])

    def normal(self, *shape: int) -> torch.Tensor:
        """(P, *shape) standard normal numbers, row k from worker k's stream."""
        if self.shared:
            return torch.randn(self.pack, *shape, device=self.device)
        if self.pack == 1:
            return torch.randn(shape, generator=self.generators[0], device=self.device)[None]
        return torch.stack(
            [torch.randn(shape, generator=g, device=self.device) for g in self.generators]
        )

    def uniform(self, *shape: int) -> torch.Tensor:
        """(P, *shape) numbers uniform in [0, 1)."""
        if self.shared:
            return torch.rand(self.pack, *shape, device=self.device)
        if self.pack == 1:
            return torch.rand(shape, generator=self.generators[0], device=self.device)[None]
        return torch.stack(
            [torch.rand(shape, generator=g, device=self.device) for g in self.generators]
        )

    def integers(self, high: int, *shape: int) -> torch.Tensor:
        """(P, *shape) integers uniform in [0, high), as torch.randint draws them."""
        if self.shared:
            return torch.randint(high, (self.pack, *shape), device=self.device)
        if self.pack == 1:
            g = self.generators[0]
            return torch.randint(high, shape, generator=g, device=self.device)[None]
        return torch.stack(
            [torch.randint(high, shape, generator=g, device=self.device) for g in self.generators]
        )

    def q_pair(self, num_q: int) -> torch.Tensor:
        """(P, 2): two distinct Q indices per worker, drawn on the device (no host sync)."""
        return self.uniform(num_q).argsort(-1)[:, :2]

    def member(self, worker: int) -> PackNoise:
        """Worker `worker`'s stream alone, as a pack of one (the generator is shared, not
        copied: what the member draws, the pack's worker has drawn)."""
        one = copy.copy(self)
        one.pack, one.generators = 1, [self.generators[worker]]
        return one

    def _generator(self, worker: int) -> torch.Generator:
        """Where worker `worker`'s numbers come from: its own stream, or the device's (shared)."""
        if not self.shared:
            return self.generators[worker]
        if self.device.type == "cuda":
            torch.cuda.init()  # fills default_generators (a no-op once CUDA is up)
            index = self.device.index
            return torch.cuda.default_generators[
                torch.cuda.current_device() if index is None else index
            ]
        return torch.default_generator

    def get_state(self, worker: int) -> torch.Tensor:
        return self._generator(worker).get_state()

    def set_state(self, worker: int, state: torch.Tensor) -> None:
        set_generator_state(self._generator(worker), state)


def set_generator_state(generator: torch.Generator, state: torch.Tensor) -> None:
    """generator.set_state(state); a state saved by another kind of device's generator (which
    this one cannot take) seeds it from the state's bytes instead, the same way every time."""
    state = state.cpu()  # generators take their states only from the CPU
    if state.numel() == generator.get_state().numel():
        generator.set_state(state)
    else:
        digest = hashlib.sha256(state.numpy().tobytes()).digest()
        generator.manual_seed(int.from_bytes(digest[:8], "little") >> 1)
