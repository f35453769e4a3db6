"""A pack on a CPU: each worker's share of an update or a plan runs on a thread of its own, as a
lone agent's networks over that worker's slice of the pack's stacked weights.

Why threads: on a CPU a bmm over the pack costs more than its workers' plain matmuls, and one
worker after another gets the second core only through torch's intra-op threads (2 threads
worth 1.5-1.8x one). Torch releases the GIL inside its kernels and a CPU backward runs on the
thread that calls it, so workers on threads use every core; what they still share is the GIL
for the Python between the ops, whose hand-offs make that Python run about 4x slower on two
threads than in one. On 2 cores a pack of 2 went from 0.70x to 0.87x the speed of 2 processes
(1M; 5M: 0.84x to 0.91x; BENCHMARKS.md "Packs"), short of processes: the CPU default.

A member's networks are views of slice k of the pack's tensors: the pack's Adam steps, merges
and loads (all in place) are what the members see, with nothing copied. Each member's gradient
is its own leaf's; `gather_grads` stacks them into the pack's .grad, where clipping per worker
and the one Adam over stacked weights take over as on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.nn as nn

from agent.layers import Layer
from agent.noise import PackNoise
from agent.world_model import WorldModel


def member_model(pack_model: WorldModel, worker: int, generator: torch.Generator) -> WorldModel:
    """A lone WorldModel whose parameters and buffers are views of `worker`'s slice of
    `pack_model`'s, and whose dropout draws from `generator` (torch's global stream, drawn
    from by every thread, would make a run's numbers depend on the threads' timing). Built on
    the meta device, so it allocates nothing and draws no random numbers."""
    with torch.device("meta"):
        lone = WorldModel(pack_model.cfg, pack_model.obs_dim, pack_model.action_dim)
    pack_modules = dict(pack_model.named_modules())
    for name, module in lone.named_modules():
        source = pack_modules[name]
        for key, param in source._parameters.items():
            if param is not None:
                view = param.detach()[worker : worker + 1]
                module._parameters[key] = nn.Parameter(view, requires_grad=param.requires_grad)
        for key, buffer in source._buffers.items():
            if buffer is not None:
                module._buffers[key] = buffer[worker : worker + 1]
        if isinstance(module, Layer):
            module.generator = generator
    return lone.train(pack_model.training)  # its targets in eval mode, as WorldModel.train sets


def cat_results(parts: Sequence[Any]) -> Any:
    """Per-worker results (tensors with a leading worker dimension of 1, or tuples and dicts of
    them) joined along that dimension, in worker order."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if isinstance(first, dict):
        return {key: cat_results([p[key] for p in parts]) for key in first}
    if isinstance(first, tuple):
        return tuple(cat_results(column) for column in zip(*parts))
    raise TypeError(f"cannot join per-worker results of type {type(first).__name__}")


class WorkerThreads:
    """The members of a CPU pack and the threads they run on (at most `cores`, each with
    cores // threads intra-op threads)."""

    def __init__(self, pack_model: WorldModel, noise: PackNoise, cores: int):
        self.pack_model = pack_model
        self.noises = [noise.member(k) for k in range(pack_model.pack)]
        self.members = [
            member_model(pack_model, k, self.noises[k].generators[0])
            for k in range(pack_model.pack)
        ]
        pack_params = list(pack_model.parameters())
        member_params = [list(m.parameters()) for m in self.members]
        self._grads = [(p, [mine[i] for mine in member_params]) for i, p in enumerate(pack_params)]
        threads = max(1, min(pack_model.pack, cores))
        self.pool = ThreadPoolExecutor(
            threads,
            thread_name_prefix="pack-worker",
            initializer=torch.set_num_threads,  # per thread: the caller keeps its own count
            initargs=(max(1, cores // threads),),
        )

    def map(
        self,
        fn: Callable[..., Any],
        *inputs: torch.Tensor,
        context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ) -> Any:
        """fn(model, noise, *inputs) for every worker on its thread, with that worker's member
        networks, random stream and slice of each input (P, ...) -> (1, ...); the results
        joined (cat_results). Grad mode, train/eval mode and `context` (autocast) are the
        caller's: torch keeps the first and last per thread."""
        grad, training = torch.is_grad_enabled(), self.pack_model.training

        def run(k: int) -> Any:
            member = self.members[k]
            if member.training != training:  # train() walks every submodule: only on a change
                member.train(training)
            with torch.set_grad_enabled(grad), context():
                return fn(member, self.noises[k], *(x[k : k + 1] for x in inputs))

        return cat_results(list(self.pool.map(run, range(len(self.members)))))

    def gather_grads(self) -> None:
        """Move the members' gradients into the pack's .grad, stacked in worker order."""
        for pack_param, mine in self._grads:
            if mine[0].grad is not None:
                pack_param.grad = torch.cat([p.grad for p in mine])
                for p in mine:
                    p.grad = None
