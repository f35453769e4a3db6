"""The outer step's state (agent/pack/merge_rule.py) as the merge pool's: merge/[lane-L/]outer.pt.

Every process of a pool computes the same mean in a round, but the outer step depends on what
came before (its anchor and momentum): a process left out of a round, restarted or added would
step from another anchor. So the state is kept once, for the pool, in a file: under its lock,
the first process through a round steps the pool's state and writes it (atomically); the others
take what it wrote. The file is the checkpoint: a resumed run, a restarted or added worker goes
on from it.

A round follows on the state only in the same pool, at the same merge frequency, with the round
before: a new pool (a race, a promotion), a changed frequency or a rule turned on after rounds
without it starts again from the mean (no stale anchor to step from).
"""

from __future__ import annotations

from pathlib import Path

from agent.errors import WeightsError
from agent.pack.merge_rule import OuterState, State, outer_step
from workers.rundir.directory import DirLock, load_state, save_state
from workers.rundir.paths import OUTER


class PoolOuterStep:
    """The outer step of one pool, kept in `folder` (the pool's merge folder)."""

    def __init__(self, folder: Path, pool: int, timeout_s: float = 30.0):
        self.path, self.pool, self.timeout_s = Path(folder) / OUTER, pool, timeout_s

    def __call__(
        self, mean: State, round_: int, merge_every: int, lr: float, momentum: float
    ) -> State:
        """The weights the pool takes in round `round_` for its `mean`."""
        with DirLock(str(self.path) + ".lock", timeout=self.timeout_s):
            saved = self._read(merge_every)
            if saved is not None and saved[0] >= round_:  # this round's step is made
                return {**mean, **saved[1].anchor}
            state = saved[1] if saved is not None and saved[0] == round_ - 1 else None
            merged, state = outer_step(mean, state, lr, momentum)
            payload = {"pool": self.pool, "round": round_, "merge_every": merge_every}
            payload.update(anchor=_cpu(state.anchor), momentum=_cpu(state.momentum))
            save_state(self.path, payload)
            return merged

    def _read(self, merge_every: int) -> tuple[int, OuterState] | None:
        """(round, state) of this pool at this frequency, or None (none, another's, damaged)."""
        if not self.path.exists():
            return None
        try:
            payload = load_state(self.path)
            key = (int(payload["pool"]), int(payload["merge_every"]))
            state = OuterState(dict(payload["anchor"]), dict(payload["momentum"]))
            round_ = int(payload["round"])
        except (WeightsError, KeyError, TypeError, ValueError):
            return None  # damaged: the pool starts its outer step again from the mean
        return (round_, state) if key == (self.pool, merge_every) else None


def _cpu(state: State) -> State:
    return {k: v.detach().cpu() for k, v in state.items()}
