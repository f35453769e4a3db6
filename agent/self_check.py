"""The start-up self-check's verdict: which fast path a training process may trust.

A fast path is how a process computes TD-MPC2 (compiled with CUDA graphs, compiled without
them, or eager; a pack of workers as one batched model, on threads on a CPU; bf16 or float32).
Before training, the process runs one update and one plan on its fast path and on the plain
path (eager, one agent per worker, float32) with the same weights, batch and random draws
(agent/check_probe.py runs them) and `decide` compares the two. When a fast path raises or
disagrees, the next simpler one is checked: graphs -> compile -> eager, bf16 -> float32, and a
pack -> one process per worker (`split`, which each worker then checks alone). A path chosen
by hand is checked and reported, never replaced. Over 300 lines because the paths, their
tolerances, the comparison and the verdict are one decision, read together.

Tolerances, per number format (measured on this project's 2-core CPU: BENCHMARKS.md,
"Self-check"):
- FLOAT32: the same arithmetic in another order (a pack's batched matmuls, threads, Inductor's
  fused kernels). Measured: losses within 3e-6 relative, weight changes 7e-6, plan 1.5e-6;
  bounds 100x above that, and a loss 1 % off fails.
- TF32: float32 on CUDA, whose matmuls round their inputs to 10 mantissa bits, on both sides
  (agent.py's matmul_precision): the arithmetic in another order changes the last bits of
  some inputs, and with them their rounding. Measured with TF32 emulated on the CPU
  (tests/helpers/tf32.py around bench/self_check.py's gaps; a batched pack of 2 against lone
  agents, 1M at walker's and humanoid's shapes and 5M, 2-4 seeds each): losses within 3e-6
  relative, weight changes 0.12 % (Adam's first step flips few signs: float32's bound holds),
  the plan's mean 5.3e-4 and the drawn action another elite (0.57-1.05 apart, as in bf16). So
  float32's bounds, the action not compared and the mean's 0.01 (a stale input moves it 0.05).
- BF16: matmuls on 8-bit-mantissa inputs (the two-hot decode, cross-entropies, the policy's
  Gaussian and the planner's values stay float32). Measured at 1M and 5M, three task shapes,
  72 cases: losses within 1.4 % relative where they are not near 0 (the policy loss and mean
  Q, differences of terms, came within 0.005 of values ~0.01), weight changes up to 7.6 % apart
  (Adam's first step is about lr x sign(gradient): a sign flips where a gradient is near 0),
  the plan's mean 0.023. The drawn action is not compared: it is one elite drawn by its score,
  and a bf16 rounding reorders near-tied elites (another one was drawn in about half the
  cases); the plan's mean is what the elites agree on. Another batch and observations than the
  plain path's move the weights' change 40-48 % and the plan's mean 0.05-0.85; a loss 10 %
  off, or handed to another worker, fails.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from agent.config import FAST_PATHS

# torch.compile's mode for each compiled path: with CUDA graphs (replayed whole), without.
COMPILE_MODES: dict[str, str | None] = {"graphs": "reduce-overhead", "compile": None}
_MODE_WORDS = {
    "graphs": "compiled with CUDA graphs",
    "compile": "compiled without CUDA graphs",
    "eager": "eager",
}


@dataclass(frozen=True)
class FastPath:
    """How a training process computes: `mode` one of FAST_PATHS but auto; `pack` workers as
    one batched model (on threads where `threads`); bf16 or float32. `split`: one process per
    worker instead (each checks its own path)."""

    mode: str = "eager"
    pack: int = 1
    threads: bool = False
    bf16: bool = False
    split: bool = False

    def __post_init__(self) -> None:
        if self.mode not in FAST_PATHS[1:]:
            raise ValueError(f"no fast path {self.mode!r}")

    @property
    def plain(self) -> bool:
        """The plain path itself: eager, one agent, float32 (nothing to compare it with)."""
        return self.mode == "eager" and self.pack == 1 and not self.bf16 and not self.split

    @property
    def base(self) -> FastPath | None:
        """A compiled path's eager version (its reference for the random draws), else None."""
        return None if self.mode == "eager" else replace(self, mode="eager", threads=False)

    @property
    def label(self) -> str:
        """A short name among a ladder's rungs: graphs, compile, eager bf16, eager float32."""
        if self.split or self.mode != "eager":
            return "one process per worker" if self.split else self.mode
        return "eager bf16" if self.bf16 else "eager float32"

    def describe(self) -> str:
        if self.split:
            return "one process per worker"
        parts = [_MODE_WORDS[self.mode]]
        if self.pack > 1:
            parts.append(f"a pack of {self.pack}" + (" on threads" if self.threads else ""))
        parts.append("bf16" if self.bf16 else "float32")
        return ", ".join(parts)


PLAIN = FastPath()


def ladder(start: FastPath, by_hand: bool = False, can_split: bool = True) -> list[FastPath]:
    """The paths to try, fastest first: `start`, then graphs -> compile -> eager, bf16 ->
    float32, and for a pack one process per worker. By hand: `start` alone."""
    if by_hand:
        return [start]
    rungs, path = [start], start
    if path.mode == "graphs":
        path = replace(path, mode="compile")
        rungs.append(path)
    if path.mode == "compile":
        path = replace(path, mode="eager")
        rungs.append(path)
    if path.bf16:
        path = replace(path, bf16=False)
        rungs.append(path)
    if path.pack > 1 and can_split:
        rungs.append(FastPath(pack=path.pack, split=True))
    return rungs


@dataclass(frozen=True)
class Tolerance:
    """How far a fast path's results may be from the plain path's. Losses: |fast - plain| <=
    loss_atol + loss_rtol |plain|; weights: each worker's change in the update, the L2 norm
    of the difference over that of the plain change; mean: the plan's final mean, largest
    difference; action: the planned action, largest difference (None: not compared)."""

    loss_rtol: float
    loss_atol: float
    weights: float
    mean: float
    action: float | None


FLOAT32 = Tolerance(loss_rtol=1e-3, loss_atol=1e-5, weights=1e-2, mean=1e-3, action=1e-3)
TF32 = replace(FLOAT32, mean=1e-2, action=None)
BF16 = Tolerance(loss_rtol=0.05, loss_atol=0.02, weights=0.25, mean=0.05, action=None)


def tolerance(path: FastPath, tf32: bool = False) -> Tolerance:
    """`tf32`: float32 matmuls run in TF32 (on CUDA), on both sides."""
    if path.bf16:
        return BF16
    return TF32 if tf32 else FLOAT32


@dataclass
class Outputs:
    """What one update and one plan gave, per worker: each loss and norm the update reports
    (P,), each weight's change in the update (P, ...), the planned action (P, N, A) and the
    plan's final mean (P, N, H, A)."""

    losses: dict[str, torch.Tensor]
    delta: dict[str, torch.Tensor]
    action: torch.Tensor
    mean: torch.Tensor

    @staticmethod
    def join(parts: Sequence[Outputs]) -> Outputs:
        """Lone workers' outputs, in worker order, as one pack's."""
        return Outputs(
            {k: torch.cat([p.losses[k] for p in parts]) for k in parts[0].losses},
            {k: torch.cat([p.delta[k] for p in parts]) for k in parts[0].delta},
            torch.cat([p.action for p in parts]),
            torch.cat([p.mean for p in parts]),
        )


@dataclass(frozen=True)
class Comparison:
    """`worst`: the largest gap as a fraction of what its tolerance allows (above 1: they
    disagree; inf: a value is not finite, or missing); `detail` names it."""

    worst: float
    detail: str

    @property
    def agrees(self) -> bool:
        return self.worst <= 1.0


def _ratio(gap: float, allowed: float) -> float:
    return gap / allowed if math.isfinite(gap) else math.inf


def compare(fast: Outputs, plain: Outputs, tol: Tolerance) -> Comparison:
    """The largest gap between a fast path's outputs and the plain path's, against `tol`."""
    found = [Comparison(0.0, "no gap")]
    for name, ref in plain.losses.items():
        got = fast.losses.get(name)
        if got is None or got.shape != ref.shape:
            return Comparison(math.inf, f"{name} is missing from the fast path's results")
        for k, (g, r) in enumerate(zip(got.double().tolist(), ref.double().tolist())):
            allowed = tol.loss_atol + tol.loss_rtol * abs(r)
            found.append(
                Comparison(
                    _ratio(abs(g - r), allowed),
                    f"{name} of worker {k}: {g:.6g} against {r:.6g} (allowed +-{allowed:.2g})",
                )
            )
    workers = plain.action.shape[0]
    for k in range(workers):
        gap = change = 0.0
        for name, ref in plain.delta.items():
            diff = (fast.delta[name][k].double() - ref[k].double()).norm().item()
            gap, change = gap + diff**2, change + ref[k].double().norm().item() ** 2
        rel = math.sqrt(gap) / max(math.sqrt(change), 1e-30)
        found.append(
            Comparison(
                _ratio(rel, tol.weights),
                f"weights' change of worker {k}: {rel:.3g} of it apart (allowed {tol.weights:g})",
            )
        )
    parts = [("plan mean", fast.mean, plain.mean, tol.mean)]
    if tol.action is not None:
        parts.append(("action", fast.action, plain.action, tol.action))
    for name, got, ref, allowed in parts:
        for k in range(workers):
            gap = (got[k].double() - ref[k].double()).abs().max().item()
            found.append(
                Comparison(
                    _ratio(gap, allowed),
                    f"{name} of worker {k}: {gap:.3g} apart (allowed {allowed:g})",
                )
            )
    return max(found, key=lambda c: c.worst)


class Probe(Protocol):
    """Runs the check's update and plan; agent/check_probe.py's AgentProbe on a real agent."""

    compile_seconds: float  # of the time spent in pair(), compiling (the first compiled call)

    def pair(self, path: FastPath) -> tuple[Outputs, Outputs]:
        """(the outputs on `path`, its reference's on the same weights, batch and draws): the
        plain path's for an eager path, the same pack's eager ones for a compiled path."""
        ...


@dataclass(frozen=True)
class Trial:
    """One path tried: `outcome` "agrees", "disagrees", "raised", "plain" (nothing to
    compare) or "split" (each worker checks in a process of its own)."""

    path: FastPath
    outcome: str
    detail: str = ""
    worst: float = 0.0

    def describe(self) -> str:
        name = self.path.label
        if self.outcome == "agrees":
            return f"{name} agrees with the plain path (largest gap {self.worst:.0%} of allowed)"
        if self.outcome == "plain":
            return f"{name} is the plain path (nothing to compare)"
        if self.outcome == "split":
            return "each worker goes on in a process of its own and checks its own path"
        if self.outcome == "raised":
            return f"{name} raised {self.detail}"
        return f"{name} {self.outcome}: {self.detail}"


@dataclass(frozen=True)
class Verdict:
    """The path a process trains on, each path tried on the way (in order), and the time the
    check took (compile_seconds of it compiling)."""

    path: FastPath
    trials: tuple[Trial, ...]
    by_hand: bool = False
    seconds: float = 0.0
    compile_seconds: float = 0.0
    asked: str = "auto"

    @property
    def sound(self) -> bool:
        """The path trained on agrees with the plain path (or is it, or is a split)."""
        return self.trials[-1].outcome in ("agrees", "plain", "split")

    def line(self) -> str:
        """One line: what runs, and why."""
        chosen = "chosen by hand" if self.by_hand else "the self-check's choice"
        text = f"fast path: {self.path.describe()} ({chosen}): " + "; ".join(
            t.describe() for t in self.trials
        )
        if self.by_hand and not self.sound:
            text += "; kept as asked (--fast-path auto lets the check fall back)"
        elif not self.sound:
            text += "; nothing simpler to fall back to"
        timing = f"self-check {self.seconds:.1f} s"
        if self.compile_seconds:
            timing += f", {self.compile_seconds:.1f} s of it compiling"
        return f"{text} ({timing})"


def _try(probe: Probe, path: FastPath, tf32: bool) -> Trial:
    try:
        fast, reference = probe.pair(path)
    except Exception as err:  # a fast path that throws is one to leave, whatever it threw
        first = (str(err).strip().splitlines() or [""])[0][:200]
        detail = type(err).__name__ + (f": {first}" if first else "")
        return Trial(path, "raised", detail, math.inf)
    found = compare(fast, reference, tolerance(path, tf32))
    if found.agrees:
        return Trial(path, "agrees", worst=found.worst)
    return Trial(path, "disagrees", found.detail, found.worst)


def decide(
    rungs: Sequence[FastPath],
    probe: Probe,
    by_hand: bool = False,
    asked: str = "auto",
    clock: Callable[[], float] = time.perf_counter,
    tf32: bool = False,
) -> Verdict:
    """The first of `rungs` that agrees with the plain path (by hand: the one rung, whatever
    the check found). A compiled path's eager version is checked against the plain path
    first: its draws are the compiled path's reference. When none agrees, the last rung.
    `tf32`: the probe's float32 matmuls run in TF32 (see TF32)."""
    start = clock()
    trials: list[Trial] = []
    bases: dict[FastPath, Trial] = {}
    for path in rungs:
        if path.split or path.plain:
            trials.append(Trial(path, "split" if path.split else "plain"))
            break
        base = path.base
        if base is not None and not base.plain:
            if base not in bases:
                bases[base] = _try(probe, base, tf32)
            found = bases[base]
            if found.outcome != "agrees":
                why = f"its eager version: {found.detail}"
                trials.append(Trial(path, found.outcome, why, found.worst))
                if by_hand:
                    break
                continue
        trials.append(bases[path] if path in bases else _try(probe, path, tf32))
        if trials[-1].outcome == "agrees" or by_hand:
            break
    return Verdict(
        trials[-1].path,
        tuple(trials),
        by_hand,
        clock() - start,
        probe.compile_seconds,
        asked,
    )
