"""One worker's Adam state inside a pack's: its slice of the stacked moments read and written as
a lone agent's, and its own step count. Adam counts steps per stacked tensor, one count for the
whole pack; a worker whose count differs (reset alone, or resumed so) keeps the difference as an
offset and moves as an Adam of its own count would (PackState.step_offset)."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch

# How close a worker's own Adam bias correction must come to the pack's before its step count
# is the pack's again: far below float32's resolution of a step.
SETTLED = 1e-8


def settle_updates(optims: Sequence[torch.optim.Optimizer]) -> int:
    """Updates after which a worker's own Adam count no longer changes its step (SETTLED)."""
    betas = [b for optim in optims for group in optim.param_groups for b in group["betas"]]
    return math.ceil(math.log(SETTLED) / math.log(max(betas)))


def saved_steps(saved: dict) -> float | None:
    """The Adam step count of a saved optimiser slice (None: it holds no state)."""
    entries = [e for e in saved.get("state", {}).values() if "step" in e]
    return float(entries[0]["step"]) if entries else None


def adam_move(m: torch.Tensor, v: torch.Tensor, group: dict, steps: torch.Tensor) -> torch.Tensor:
    """The change torch's Adam makes to a parameter of moments m, v at step `steps` (as
    torch/optim/adam.py's _single_tensor_adam computes it)."""
    beta1, beta2 = group["betas"]
    denom = v.sqrt() / (1 - beta2**steps).sqrt() + group["eps"]
    return m / denom * (-group["lr"] / (1 - beta1**steps))


def optim_slice(optim: torch.optim.Optimizer, worker: int, offset: float = 0.0) -> dict:
    """One worker's part of an Adam state dict over stacked weights: a lone agent's (its step
    count the pack's less `offset`, see PackState.step_offset)."""
    full = optim.state_dict()
    state = {
        i: {k: v - offset if k == "step" else v[worker].clone() for k, v in entry.items()}
        for i, entry in full["state"].items()
    }
    return {"state": state, "param_groups": copy.deepcopy(full["param_groups"])}


def load_optim_slice(optim: torch.optim.Optimizer, worker: int, theirs: dict) -> None:
    """Put one worker's Adam state (from _optim_slice) into its slice of the pack's."""
    params = [p for g in optim.param_groups for p in g["params"]]
    full = optim.state_dict()
    for i, param in enumerate(params):
        entry = theirs["state"].get(i)
        if entry is None:
            continue
        own = full["state"].setdefault(
            i,
            {
                "step": torch.zeros(()),
                "exp_avg": torch.zeros_like(param),
                "exp_avg_sq": torch.zeros_like(param),
            },
        )
        # Adam's step is one per stacked tensor: a pack counts the furthest worker's steps
        # (the bias correction is ~1 after a few thousand either way).
        step = entry["step"].cpu().float().clone()  # not the saved tensor: Adam bumps it
        own["step"] = step if param.shape[0] == 1 else torch.maximum(own["step"].cpu(), step)
        for key in ("exp_avg", "exp_avg_sq"):
            moment = own[key].clone()
            moment[worker] = entry[key].to(moment.device).view_as(moment[worker])
            own[key] = moment
    optim.load_state_dict(full)
