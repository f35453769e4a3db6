"""The merge rule: what each worker takes from its pool's mean at a merge.

The plain mean (every worker takes it) is the default. Three knobs change it, and at their
defaults the arithmetic is skipped rather than run with ones and zeros, so learning stays the
plain mean's bit for bit:
- An outer step (DiLoCo, arXiv 2311.08105; SlowMo, arXiv 1910.00643): from the pool's last
  merged weights `a` (the anchor) the mean `m` gives the outer gradient g = a - m; Nesterov
  momentum mu and an outer learning rate lr move the anchor: b <- mu b + g, a <- a - lr (g + mu b),
  as torch.optim.SGD(nesterov=True) does. The new anchor is what the workers take. lr 1, mu 0 is
  the mean. The anchor and b are the pool's (workers/merging/outer.py keeps them).
- A pull (PAPA, arXiv 2304.03094): each worker moves part of the way, w <- w + alpha (t - w).
  Not together with the outer step (agent/config.py refuses it): neither method defines it.
- A local policy: the policy prior's tensors stay as each worker has them, and the outer step
  leaves them out (they are not the pool's).
The target Qs are weights like the Qs: the same rule moves them. The Q scale is not a weight but
a running statistic (a lerp toward a 5-95 % spread of at least 1): it takes the plain mean under
every rule, as SlowMo averages BatchNorm's statistics instead of stepping them, so it stays a
spread of at least 1 (an outer step of lr 2 would put it at 2m - a, below 1 or negative). A pull
moves it part of the way, which keeps it between the two. Each worker's Adam moments stay its
own, whatever the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from agent.config import Config

State = dict[str, torch.Tensor]
POLICY_PREFIX = "pi."  # the policy prior's tensors in the model's state (WorldModel.pi)
RUNNING_STATS = frozenset({"q_scale"})  # statistics, not weights: the plain mean, never stepped


@dataclass(frozen=True)
class MergeRule:
    """A config's merge rule (its merge_pull, outer_lr, outer_momentum, merge_policy)."""

    pull: float = 1.0
    outer_lr: float = 1.0
    outer_momentum: float = 0.0
    policy: bool = True

    @classmethod
    def of(cls, cfg: Config) -> MergeRule:
        return cls(cfg.merge_pull, cfg.outer_lr, cfg.outer_momentum, cfg.merge_policy)

    @property
    def outer(self) -> bool:
        """Whether the outer step differs from the plain mean."""
        return self.outer_lr != 1.0 or self.outer_momentum != 0.0

    def kept(self, names: list[str]) -> frozenset[str]:
        """The tensors each worker keeps as its own at a merge."""
        return frozenset() if self.policy else frozenset(n for n in names if is_policy(n))

    def stepped(self, state: State) -> list[str]:
        """The tensors the outer step moves: the pool's weights (not a kept policy, not a
        running statistic)."""
        kept = self.kept(list(state))
        return [
            k
            for k, v in state.items()
            if v.is_floating_point() and k not in kept and k not in RUNNING_STATS
        ]


def taken(own: State, target: State, rule: MergeRule) -> State:
    """What a worker holding `own` holds after a merge whose rule gives `target`: its kept
    tensors, the others `pull` of the way (PackState.assign does it on a pack's workers)."""
    kept = rule.kept(list(target))
    out = {}
    for name, value in target.items():
        mine = own[name].detach().to(value.device, value.dtype)
        if name in kept:
            out[name] = mine.clone()
        elif rule.pull == 1.0 or not value.is_floating_point():
            out[name] = value
        else:
            out[name] = mine.lerp(value, rule.pull)
    return out


def collective_refusal(values: Mapping[str, object]) -> str | None:
    """Why a torchrun job cannot take these knob values, if it cannot: its ranks merge in a
    collective, with no pool folder to keep the outer step's state in."""
    if values.get("outer_lr", 1.0) != 1.0 or values.get("outer_momentum", 0.0) != 0.0:
        return (
            "the outer step is not for a torchrun job yet (its state is kept in the run "
            "directory's merge pool): outer_lr stays 1 and outer_momentum 0"
        )
    return None


def is_policy(name: str) -> bool:
    return name.startswith(POLICY_PREFIX)


@dataclass
class OuterState:
    """The pool's outer optimizer: the last merged weights and the Nesterov momentum buffer
    (empty until the first step with momentum)."""

    anchor: State
    momentum: State = field(default_factory=dict)


@torch.no_grad()
def outer_step(
    mean: State, state: OuterState | None, lr: float, momentum: float, names: list[str]
) -> tuple[State, OuterState]:
    """(the weights the workers take, the new outer state) for the pool's `mean`, stepping the
    tensors `names` (MergeRule.stepped) and taking the others from the mean. A pool's first
    merge under the rule (`state` None) has no anchor to step from: the mean is taken and
    becomes the anchor; so is a tensor the anchor lacks (the policy, merged again)."""
    fresh = names if state is None else [k for k in names if k not in state.anchor]
    start = {k: mean[k].detach().clone() for k in fresh}
    if state is None:
        return dict(mean), OuterState(start)
    names = [k for k in names if k in state.anchor]
    if not names:
        return dict(mean), OuterState(start)
    anchor = [state.anchor[k].to(mean[k].device, mean[k].dtype) for k in names]
    grad = torch._foreach_sub(anchor, [mean[k] for k in names])
    buffers: dict[str, torch.Tensor] = {}
    step = grad
    if momentum:
        old = [state.momentum.get(k) for k in names]
        bufs = [
            g.clone() if b is None else b.to(g.device, g.dtype) * momentum + g
            for g, b in zip(grad, old)
        ]
        step = torch._foreach_add(grad, bufs, alpha=momentum)  # Nesterov: g + mu b
        buffers = dict(zip(names, bufs))
    new = torch._foreach_sub(anchor, step, alpha=lr)
    merged = {**mean, **dict(zip(names, new))}
    return merged, OuterState({**start, **{k: v.clone() for k, v in zip(names, new)}}, buffers)
