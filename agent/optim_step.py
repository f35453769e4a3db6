"""Adam's step inside one compiled graph.

torch.optim puts a graph break before and after every step (torch/optim/optimizer.py, so that a
step compiled alone is seen as an inference graph), which splits a compiled update at each of
its two optimisers; and its `_init_group`, which TorchDynamo would run outside the graph, breaks
it too once the traced backward has given the parameters gradients. So the update's Adam is
torch's functional Adam (torch.optim.adam.adam) on the optimiser's own state, made beforehand by
`init_adam_state` and marked static, so that CUDA graphs replay the steps in place.
"""

from __future__ import annotations

import torch
from torch.optim.adam import adam


def init_adam_state(optim: torch.optim.Adam) -> None:
    """Make the state Adam makes at its first step (step 0, zero moments, laid out as Adam lays
    it out), where there is none yet, and mark all of it static for CUDA graphs. Called again
    after the optimiser loads a state, which replaces the tensors."""
    for group in optim.param_groups:
        assert not group["amsgrad"] and not group["fused"], "plain Adam"
        device_step = group["capturable"]
        for p in group["params"]:
            if not optim.state[p]:
                optim.state[p] = {
                    "step": torch.zeros(
                        (), dtype=torch.float32, device=p.device if device_step else "cpu"
                    ),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }
            for tensor in optim.state[p].values():
                torch._dynamo.mark_static_address(tensor)


@torch.no_grad()
def adam_step(optim: torch.optim.Adam) -> None:
    """optim.step() for an Adam whose state exists (init_adam_state), without graph breaks."""
    for group in optim.param_groups:
        params = [p for p in group["params"] if p.grad is not None]
        states = [optim.state[p] for p in params]
        beta1, beta2 = group["betas"]
        adam(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],
            foreach=group["foreach"],
            capturable=group["capturable"],
            differentiable=False,
            fused=None,
            decoupled_weight_decay=group["decoupled_weight_decay"],
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=group["maximize"],
        )
