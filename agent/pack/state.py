"""A pack's networks as state: merging inside the pack, and one worker's networks, Adam moments
and random stream read and written as a lone agent's (the checkpoint format does not depend on
the pack). TDMPC2 (agent/agent.py) is a PackState; this holds what is not acting or learning."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from agent.config import Config
from agent.errors import WeightsError
from agent.noise import PackNoise
from agent.optim_step import init_adam_state
from agent.pack.adam_state import (
    adam_move,
    load_optim_slice,
    optim_slice,
    saved_steps,
    settle_updates,
)
from agent.world_model import WorldModel

State = dict[str, torch.Tensor]
FORMAT = "tdmpc2-live/agent/1"


@dataclass
class PackMerge:
    """A merge inside a pack: the mean, who is in it, who is left out and why."""

    mean: State
    participants: list[int]
    left_out: dict[int, str] = field(default_factory=dict)
    distances: dict[int, float] = field(default_factory=dict)


class PackState:
    """Merging and saving for an agent of `pack` workers (set up by TDMPC2.__init__)."""

    cfg: Config
    model: WorldModel
    optim: torch.optim.Optimizer
    pi_optim: torch.optim.Optimizer
    noise: PackNoise
    device: torch.device
    obs_dim: int
    action_dim: int
    pack: int
    compiled: bool
    # Adam counts steps per stacked tensor, one count for the pack. A worker reset alone has a
    # count of its own: the pack's less its `step_offset` (the pack's count at its reset, 0 for
    # the others); None when every worker's count is the pack's. `offset_updates`: updates
    # left until the offsets no longer change a step (then None again).
    step_offset: torch.Tensor | None
    offset_updates: int

    @torch.no_grad()
    def merge_workers(self, workers: Sequence[int]) -> PackMerge | None:
        """Average the networks of `workers` over the worker dimension, in place on the
        device. A worker with non-finite weights is left out of the mean and reset from it
        (a new Adam for it). None when no worker is finite."""
        found = self.pack_mean(workers)
        if found is None:
            return None
        mean, good, left_out = found
        distances = self.assign(mean, workers, reset=list(left_out))
        return PackMerge(mean, good, left_out, distances)

    @torch.no_grad()
    def pack_mean(self, workers: Sequence[int]) -> tuple[State, list[int], dict[int, str]] | None:
        """(mean of the finite ones among `workers`, those, {left out: why}); None when none
        is finite. Changes nothing."""
        floats = {k: t for k, t in self.model.state_dict().items() if t.is_floating_point()}
        index = torch.tensor(list(workers), device=self.device)
        # One sum per tensor and worker: NaN and inf propagate, far cheaper than isfinite.
        sums = torch.stack(
            [t[index].reshape(len(index), -1).sum(1, dtype=torch.float64) for t in floats.values()]
        )
        finite = torch.isfinite(sums).all(0).tolist()
        good = [w for w, ok in zip(workers, finite) if ok]
        if not good:
            return None
        left_out = {w: "non-finite weights" for w, ok in zip(workers, finite) if not ok}
        return {k: t[good].mean(0) for k, t in floats.items()}, good, left_out

    @torch.no_grad()
    def assign(
        self,
        state: State,
        workers: Sequence[int],
        reset: Sequence[int] = (),
        pull: float = 1.0,
        kept: frozenset[str] = frozenset(),
    ) -> dict[int, float]:
        """Give `workers` the networks `state` (the merged ones); `reset` of them also get a
        new Adam (moments and step count zero). The others move `pull` of the way, and keep
        the tensors `kept` (agent/pack/merge_rule.py). Returns each other worker's L2 distance
        from `state` before, over the tensors it takes."""
        own = self.model.state_dict()
        names = [k for k in state if k not in kept]
        distances = {}
        for w in workers:
            if w not in reset:
                diffs = [own[k][w] - state[k].to(self.device) for k in names]
                distances[w] = float(torch.stack([d.norm() for d in diffs]).norm())
        taking = [w for w in workers if w not in reset] if pull != 1.0 or kept else []
        if len(taking) < len(workers):
            self.load_model_state(state, [w for w in workers if w not in taking])
        if taking:  # all of `state` but `kept`, or part of the way (the plain mean skips this)
            self._pull({k: state[k] for k in names}, taking, pull)
        if reset:
            self._reset_adam(list(reset))
        return distances

    def _pull(self, state: State, workers: list[int], pull: float) -> None:
        """Move `workers`' tensors `pull` of the way to `state` (PAPA's pull; 1: take them)."""
        if pull == 1.0:
            return self.load_model_state(state, workers)
        own = self.model.state_dict()
        index = torch.tensor(workers, device=self.device)
        for name, tensor in state.items():
            target = own[name]
            value = tensor.to(self.device, target.dtype)
            value = value.unsqueeze(0).expand(len(workers), *value.shape)
            target.index_copy_(0, index, target[index].lerp_(value, pull))

    def _reset_adam(self, workers: list[int]) -> None:
        """Zero `workers`' Adam moments and step counts. Zeroed moments under the pack's bias
        correction (about 1 after some thousand steps) would make their next updates about 3x
        a new Adam's."""
        optims = (self.optim, self.pi_optim)
        states = [state for optim in optims for state in optim.state.values() if state]
        for state in states:
            for key in ("exp_avg", "exp_avg_sq"):
                state[key][workers] = 0
        if set(workers) >= set(range(self.pack)):
            for state in states:  # in place: a compiled update's CUDA graphs hold it
                state["step"].zero_()
            self.step_offset = None
            return
        pack_steps = float(states[0]["step"]) if states else 0.0
        if pack_steps == 0:  # no step yet: the pack's count is a new Adam's
            return
        if self.step_offset is None:
            self.step_offset = torch.zeros(self.pack, device=self.device)
        self.step_offset[workers] = pack_steps
        self.offset_updates = settle_updates((self.optim, self.pi_optim))

    @torch.no_grad()
    def offset_adam_step(self, optim: torch.optim.Optimizer) -> None:
        """Right after `optim`'s step on the pack: move each worker as an Adam of its own step
        count would have (see step_offset). Both started their moments at zero and saw the
        same gradients, so only the bias correction differs, and the difference of the two
        moves is added (torch's Adam takes one step count per tensor). Tensor ops only, no
        host sync: it runs inside a compiled update's graph too."""
        offset = self.step_offset
        assert offset is not None
        for group in optim.param_groups:
            for param in group["params"]:
                state = optim.state[param]
                if "step" not in state:
                    continue
                pack_steps = state["step"].to(offset.device)
                own = (pack_steps - offset).view(-1, *(1,) * (param.dim() - 1))
                m, v = state["exp_avg"], state["exp_avg_sq"]
                param.add_(adam_move(m, v, group, own) - adam_move(m, v, group, pack_steps))

    def count_offset_update(self) -> None:
        """After an update: the offsets are dropped once they no longer change a step."""
        if self.step_offset is not None:
            self.offset_updates -= 1
            if self.offset_updates <= 0:
                self.step_offset = None

    @torch.no_grad()
    def load_model_state(self, state: State, workers: Sequence[int]) -> None:
        """Copy one worker's networks (a state of model_state's shapes) into `workers`."""
        own = self.model.state_dict()
        index = torch.tensor(list(workers), device=self.device)
        for name, tensor in state.items():
            target = own[name]
            value = tensor.to(self.device, target.dtype)
            target.index_copy_(0, index, value.unsqueeze(0).expand(len(workers), *value.shape))

    def model_state(self, worker: int = 0) -> State:
        """Worker `worker`'s networks, shaped as a lone agent's (no worker dimension)."""
        return {k: v[worker] for k, v in self.model.state_dict().items()}

    # weights -----------------------------------------------------------------------
    def state_dict(self, worker: int = 0) -> dict:
        """Worker `worker`'s networks, Adam moments and random stream, as a lone agent's."""
        return {
            "format": FORMAT,
            "obs_dim": self.obs_dim,
            "action_dim": self.action_dim,
            "model": {k: v.clone() for k, v in self.model_state(worker).items()},
            "optim": optim_slice(self.optim, worker, self._offset(worker)),
            "pi_optim": optim_slice(self.pi_optim, worker, self._offset(worker)),
            "noise": self.noise.get_state(worker),
        }

    def load_state_dict(self, state: dict, weights_only: bool = False, worker: int = 0) -> None:
        """Load a state from state_dict() into one worker; a mismatch raises WeightsError,
        changing nothing."""
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise WeightsError("not a TD-MPC2 Live agent state (missing or unknown format tag)")
        dims = (state.get("obs_dim"), state.get("action_dim"))
        if dims != (self.obs_dim, self.action_dim):
            raise WeightsError(
                f"weights are for obs/action dims {dims}, this task has "
                f"{(self.obs_dim, self.action_dim)}"
            )
        theirs = self.checked_model_state(state.get("model", {}))
        self.load_model_state(theirs, [worker])
        if not weights_only:
            before = self._adam_steps()
            for optim, saved in ((self.optim, state["optim"]), (self.pi_optim, state["pi_optim"])):
                load_optim_slice(optim, worker, saved)
                if self.compiled:  # new state tensors: static again for the CUDA graphs
                    init_adam_state(optim)
            self._keep_own_steps(worker, before, saved_steps(state["optim"]))
            if "noise" in state:
                self.noise.set_state(worker, state["noise"])

    def _adam_steps(self) -> float:
        """The pack's Adam step count (0: no step yet)."""
        states = [st for optim in (self.optim, self.pi_optim) for st in optim.state.values() if st]
        return float(states[0]["step"]) if states else 0.0

    def _keep_own_steps(self, worker: int, before: float, own: float | None) -> None:
        """After `worker` took a saved Adam state of `own` steps (None: none yet): the pack
        counts its furthest worker's steps, so each worker whose own count is below it keeps
        that count as an offset (step_offset), as a worker reset alone does. Without this a
        worker reset before a checkpoint would resume under the pack's bias correction (3.2x
        too large a step 100 updates after its reset)."""
        if self.pack == 1:
            return
        own = 0.0 if own is None else own  # saved before its first update: a new Adam's
        after = self._adam_steps()
        offset = torch.zeros(self.pack, device=self.device)
        if self.step_offset is not None:
            offset += self.step_offset
        offset += after - before  # the others' own counts stay what they were
        offset[worker] = after - own
        offset.clamp_(min=0)
        owns = [after - float(o) for o in offset if o > 0]
        left = settle_updates((self.optim, self.pi_optim)) - min(owns, default=math.inf)
        if left <= 0:  # every offset worker is past where the counts change a step
            self.step_offset, self.offset_updates = None, 0
            return
        self.step_offset, self.offset_updates = offset, math.ceil(left)

    def _offset(self, worker: int) -> float:
        return 0.0 if self.step_offset is None else float(self.step_offset[worker])

    def checked_model_state(self, theirs: State) -> State:
        """`theirs` if it is one worker's networks of this model (shapes as model_state's),
        else WeightsError. Q biases saved as (E, 1, out) before packs are read as (E, out)."""
        own = self.model_state(0)
        missing, extra = sorted(set(own) - set(theirs)), sorted(set(theirs) - set(own))
        if missing or extra:
            raise WeightsError(
                f"weights do not match this model (missing {missing[:3]}, unexpected {extra[:3]})"
            )
        fitted = {}
        for name, tensor in own.items():
            value = theirs[name]
            if value.shape != tensor.shape and value.squeeze().shape == tensor.squeeze().shape:
                value = value.reshape(tensor.shape)
            if value.shape != tensor.shape:
                raise WeightsError(
                    f"weights do not match this model size: {name} has shape "
                    f"{tuple(value.shape)}, expected {tuple(tensor.shape)}"
                )
            if value.is_floating_point() and not torch.isfinite(value).all():
                raise WeightsError(f"weights contain non-finite values in {name}")
            fitted[name] = value
        return fitted
