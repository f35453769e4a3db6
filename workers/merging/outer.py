"""The outer step's state (agent/pack/merge_rule.py) as the merge pool's: merge/[lane-L/]outer.pt.

The outer step depends on what came before (its anchor and momentum), and a round's step must
count every worker of the round. The processes of a pool reach a round at different times, and
the file merge waits at most its timeout for the others: the first through may have found only
itself (a partner evaluating, say). So the pool's file keeps, for its newest round, the state
before that round's step and the sum of the round's weights with the workers it holds. Under the
file's lock each process adds the workers of this round that the sum lacks (its own, and any
round-r file it found), and the round's step is made again from the state before it with the
fuller mean: the last worker through a round takes an anchor that counts every worker of the
round, the late one too. (One that went on earlier took the anchor as it stood; the next round's
outer gradient takes up the difference.) A process behind the pool by a whole round cannot add
to a round already stepped past: it takes the pool's newest anchor, and its record says so.
The file keeps the round's own outer_lr and outer_momentum too: a round made again in a later
one (after a change of either) is stepped as its workers took it, not with the later rule.

The file is the checkpoint: a resumed run, a restarted or added worker goes on from it. It starts
again from the mean, and the merge record says why, in a new pool (a race, a promotion), at a
changed frequency (rounds are counted in another unit), when damaged, and after rounds without
the rule (workers/merging/pool_rule.py keeps each round's rule); rounds a step skipped over
(more envs than merge_every) follow on. A lock held past the timeout leaves this round to the
mean (said too), never a crash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from agent.errors import WeightsError
from agent.knobs import knobs
from agent.pack.merge_rule import RUNNING_STATS, OuterState, State, outer_step
from workers.merging.pool_rule import RuleHistory
from workers.rundir.directory import LOCK_TIMEOUT_S, DirLock, load_state, save_state
from workers.rundir.paths import OUTER


@dataclass(frozen=True)
class Part:
    """One file's worth of a round: the mean of `workers`' weights, of merge round `round`."""

    workers: tuple[int, ...]
    state: State
    round: int


@dataclass
class OuterRound:
    """The weights the workers take this round, and what a merge record should say of it."""

    weights: State
    note: str = ""


@dataclass
class _Saved:
    """The pool's file: the state before round `round`'s step and that round's sum so far."""

    round: int
    before: OuterState | None  # None: the round restarts from the mean
    total: State
    counted: set[int] = field(default_factory=set)
    rule: tuple[float, float] | None = None  # the round's (lr, momentum); None: a file before it


class PoolOuterStep:
    """The outer step of one pool, kept in `folder` (the pool's merge folder)."""

    def __init__(self, folder: Path, pool: int, timeout_s: float = LOCK_TIMEOUT_S):
        self.path, self.pool, self.timeout_s = Path(folder) / OUTER, pool, timeout_s

    def __call__(
        self,
        mean: State,
        parts: list[Part],
        round_: int,
        merge_every: int,
        lr: float,
        momentum: float,
        names: list[str],
        history: RuleHistory | None = None,
    ) -> OuterRound:
        """The weights the pool takes in round `round_`, stepping `names`: `mean` is what this
        process averaged, `parts` what it averaged (its own and the files it found);
        `history`: the pool's rules of the rounds before (pool_rule.py), whether its state
        is still an anchor to go on from (None: it is)."""
        try:
            with DirLock(str(self.path) + ".lock", timeout=self.timeout_s):
                saved, why = self._read(merge_every)
                if saved is not None and saved.round < round_ and history is not None:
                    stale = history.breaks(saved.round)
                    saved, why = (None, stale) if stale else (saved, why)
                return self._step(saved, why, mean, parts, round_, merge_every, lr, momentum, names)
        except TimeoutError:
            why = f"the pool's outer state stayed locked for {self.timeout_s:g} s"
            return OuterRound(dict(mean), f"{why}: this round took the mean")

    def _step(self, saved, why, mean, parts, round_, merge_every, lr, momentum, names):
        note = ""
        if saved is not None and saved.round > round_:
            newest = _stepped(saved, (lr, momentum), names)
            behind = (
                f"a round behind the pool's outer step (round {saved.round}): took the pool's "
                f"anchor; this process's round {round_} is in no anchor"
            )
            return OuterRound({**mean, **newest.anchor}, behind)
        if saved is None:
            saved, note = _Saved(round_, None, {}), f"the outer step started from the mean: {why}"
        elif saved.round < round_:  # the round before (or several a step skipped over)
            before = _stepped(saved, (lr, momentum), names)
            saved = _Saved(round_, before, {})
        saved.rule = (lr, momentum)  # this round's, as the pool's rule record has it
        added = False
        pooled = set(names) | RUNNING_STATS  # not a kept policy: it is no pool's
        for part in parts:
            if part.round != round_ or saved.counted & set(part.workers):
                continue  # another round's weights, or workers already in the sum
            shared = {k: v for k, v in part.state.items() if k in pooled}
            _add(saved.total, shared, len(part.workers))
            saved.counted |= set(part.workers)
            added = True
        if added:
            payload = {"pool": self.pool, "round": round_, "merge_every": merge_every}
            payload.update(lr=float(lr), outer_momentum=float(momentum))
            payload.update(
                total=_cpu(saved.total),
                counted=sorted(saved.counted),
                anchor=None if saved.before is None else _cpu(saved.before.anchor),
                momentum=None if saved.before is None else _cpu(saved.before.momentum),
            )
            save_state(self.path, payload)
        if not saved.counted:  # nothing of this round brought (never from a merge round)
            return OuterRound(dict(mean), note)
        full = _divided(saved)
        if saved.before is None:
            return OuterRound({**mean, **full}, note)
        merged, _ = outer_step(full, saved.before, lr, momentum, names)
        return OuterRound({**mean, **merged}, note)

    def _read(self, merge_every: int) -> tuple[_Saved | None, str]:
        """This pool's saved round at this frequency, or None and why there is none."""
        if not self.path.exists():
            return None, "the pool's first round under it (or the first after rounds without it)"
        try:
            payload = load_state(self.path)
            key = (int(payload["pool"]), int(payload["merge_every"]))
            anchor = payload["anchor"]
            before = None if anchor is None else OuterState(dict(anchor), dict(payload["momentum"]))
            saved = _Saved(
                int(payload["round"]),
                before,
                dict(payload["total"]),
                {int(w) for w in payload["counted"]},
                _rule(payload),
            )
        except (WeightsError, KeyError, TypeError, ValueError) as err:
            return None, f"the pool's outer state was unreadable ({type(err).__name__})"
        parts = [saved.total, *((saved.before.anchor, saved.before.momentum) if before else ())]
        if not all(_finite(part) for part in parts):
            return None, "the pool's outer state held values that are not finite tensors"
        if key[0] != self.pool:
            return None, f"a new merge pool ({self.pool}; the state was pool {key[0]}'s)"
        if key[1] != merge_every:
            return None, f"the merge frequency changed ({key[1]} -> {merge_every} steps)"
        return saved, ""


def _stepped(saved: _Saved, now: tuple[float, float], names: list[str]) -> OuterState:
    """The state after `saved`'s round: its step made with the mean of every worker counted,
    with the lr and momentum of that round (`now`'s only for a file that does not keep them)."""
    mean = _divided(saved)
    lr, momentum = saved.rule or now
    return outer_step(mean, saved.before, lr, momentum, [k for k in names if k in mean])[1]


def _rule(payload: dict) -> tuple[float, float] | None:
    """The (lr, momentum) a saved round was stepped with, each in its knob's range (a damaged
    file: ConfigError, a ValueError); None from a file written before they were kept."""
    if "lr" not in payload:
        return None
    table = knobs()
    lr = table["outer_lr"].check(float(payload["lr"]))
    return lr, table["outer_momentum"].check(float(payload["outer_momentum"]))


def _finite(state: State) -> bool:
    """Every value a tensor, every float one finite (a damaged file's are not)."""
    return all(
        isinstance(v, torch.Tensor) and (not v.is_floating_point() or bool(v.isfinite().all()))
        for v in state.values()
    )


def _add(total: State, state: State, count: int) -> None:
    for name, value in state.items():
        if value.is_floating_point():
            value = value.detach().to("cpu", torch.float32) * count
            if name in total:
                total[name] += value
            else:
                total[name] = value


def _divided(saved: _Saved) -> State:
    return {k: v / len(saved.counted) for k, v in saved.total.items()}


def _cpu(state: State) -> State:
    return {k: v.detach().cpu() for k, v in state.items()}
