"""The start-up self-check run on a real agent: one update and one plan on a fast path and on its
reference, with the same weights, batch and random draws, leaving the agent as it was found
(networks, Adam state, random streams, warm starts, knobs, torch's global generators).

The check brings its own weights (every tensor drawn at random, the zero-initialised heads
too, so that values and Qs differ), Adam state (as at a run's first update), batch and
observations; `check_fast_path` runs agent/self_check.py's `decide` with them and puts the
agent on the path it chose. Over 300 lines because how each path is set up to be compared and
how the agent is put back are one procedure, read together.

- An eager path runs on small shapes (a batch of at most 32, a plan of at most 64 samples, a
  quarter of them elites, so that the top-k is compared) with random streams of the check's
  seeds and dropout off (a pack draws its masks over all workers at once), against one eager
  float32 agent per worker with the same seeds. Where the path rounds its matmuls (bf16, TF32
  on CUDA) all samples are elites: a near-tie at the k-th value, settled by the rounding, would
  swap an elite and jump the plan's mean (by 0.1-0.6 under bf16, up to 0.2 under TF32).
- A compiled path runs on the training shapes and knobs, so the check's compile is the one
  training uses: a graph is compiled for its shapes, and compiling takes minutes. Its draws are
  the agent's own (dropout on), replayed eagerly from the same generator state (the agent
  compiles with Inductor's fallback_random for this); its reference is the same pack's eager
  update and plan. With CUDA graphs it runs three times with other inputs (warm-up, record,
  replay) and the replay is compared, the call where a graph could read a stale tensor. Its
  plan has training's elites, so under TF32 it may meet such a near-tie (not measured on a GPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator

import torch

from agent.agent import TDMPC2, Batch
from agent.config import Config
from agent.layers import Layer
from agent.noise import PackNoise
from agent.self_check import PLAIN, FastPath, Outputs, Verdict, decide, ladder

CHECK_SEED = 20_241_130  # the check's weights, batch and streams (any fixed number)
EAGER_BATCH, EAGER_SAMPLES, EAGER_ENVS = 32, 64, 2
EAGER_ELITES = 1 / 4  # of the samples, where both sides compute in float32
GRAPH_CALLS = 3  # CUDA graphs: warm-up, record, replay


State = dict[str, torch.Tensor]


def tf32_matmuls(agent: TDMPC2) -> bool:
    """Whether the agent's float32 matmuls run in TF32 (on CUDA: agent.py's matmul_precision)."""
    return agent.device.type == "cuda" and torch.get_float32_matmul_precision() != "highest"


def check_weights(state: State, seed: int = CHECK_SEED) -> State:
    """Weights for the check, shaped as `state`'s floating tensors: matrices and convolutions
    with unit-scale outputs (std 1/sqrt(fan-in)), LayerNorm gains about 1, biases about 0.1,
    Q scales in [1, 2)."""
    generator = torch.Generator().manual_seed(seed)
    drawn = {}
    for name, tensor in state.items():
        if not tensor.is_floating_point():
            continue
        leaf = name.rsplit(".", 1)[-1]
        noise = torch.randn(tensor.shape, generator=generator)
        if leaf == "weight" and name.startswith("encoder.convs."):  # ([P], out, in, k, k)
            value = noise / math.sqrt(math.prod(tensor.shape[-3:]))
        elif leaf == "weight":
            value = noise / math.sqrt(tensor.shape[-2])
        elif leaf == "ln_weight":
            value = 1 + 0.1 * noise
        elif name == "q_scale":
            value = 1 + torch.rand(tensor.shape, generator=generator)
        else:
            value = 0.1 * noise
        drawn[name] = value.to(tensor.device, tensor.dtype)
    return drawn


@dataclasses.dataclass(frozen=True)
class Inputs:
    """One update's batch and one plan's observations and previous plan mean, for P workers."""

    batch: Batch
    obs: torch.Tensor  # (P, N, obs_dim)
    warm: torch.Tensor  # (P, N, H + 1, A): the previous plan's mean, shifted by act()

    def worker(self, k: int) -> Inputs:
        return Inputs(
            tuple(x[k : k + 1] for x in self.batch), self.obs[k : k + 1], self.warm[k : k + 1]
        )


def observations(cfg: Config, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Observations as the run's envs give them: normal numbers for states, uint8 pixels."""
    if cfg.obs == "rgb":
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
    return torch.randn(shape, generator=g)


def check_inputs(agent: TDMPC2, batch: int, envs: int, seed: int) -> Inputs:
    cfg, p, h = agent.cfg, agent.pack, agent.cfg.horizon
    g = torch.Generator().manual_seed(seed)
    terminated = torch.zeros(p, h, batch, 1)
    if cfg.episodic:
        terminated = (torch.rand(p, h, batch, 1, generator=g) < 0.1).float()
    parts = (
        observations(cfg, (p, h + 1, batch, agent.obs_dim), g),
        torch.rand(p, h, batch, agent.action_dim, generator=g) * 2 - 1,
        # each worker's rewards in a range of its own: a loss handed to another worker shows
        torch.rand(p, h, batch, 1, generator=g) * 5 + 5 * torch.arange(p).view(p, 1, 1, 1),
        terminated,
    )
    obs = observations(cfg, (p, envs, agent.obs_dim), g)
    warm = (torch.rand(p, envs, h + 1, agent.action_dim, generator=g) * 2 - 1) * 0.5
    device = agent.device
    return Inputs(tuple(x.to(device) for x in parts), obs.to(device), warm.to(device))


def step(agent: TDMPC2, inputs: Inputs) -> Outputs:
    """One update on the batch, then one plan from the observations (warm-started from
    `inputs.warm`), as training makes them; what each gave."""
    params = dict(agent.model.named_parameters())
    before = {name: p.detach().clone() for name, p in params.items()}
    losses = agent.update(inputs.batch)
    delta = {name: p.detach() - before[name] for name, p in params.items()}
    agent._warm_mean, agent._eval_warm_mean = inputs.warm, None
    action = agent.act(inputs.obs)
    return Outputs(
        {k: v.detach().float().clone() for k, v in losses.items()},
        delta,
        action,
        agent._warm_mean.float().clone(),
    )


class AgentProbe:
    """agent/self_check.py's Probe on a TDMPC2 agent (a pack or one worker)."""

    def __init__(self, agent: TDMPC2, seed: int = CHECK_SEED):
        self.agent, self.seed = agent, seed
        self.weights = check_weights(agent.model.state_dict(), seed)
        self.compile_seconds = 0.0
        self.tf32 = tf32_matmuls(agent)
        self._plain: dict[int, Outputs] = {}  # by the number of elites

    # the agent as it was ----------------------------------------------------------------
    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        """Whatever the check changes in the agent (and in torch's global generators) is as
        it was afterwards, in the same tensors (CUDA graphs replay from their addresses)."""
        a = self.agent
        model = {k: v.clone() for k, v in a.model.state_dict().items()}
        optims = [_optim_state(o) for o in (a.optim, a.pi_optim)]
        rng = _rng_state(a)
        kept = (a.noise, a.threads, a.cfg, a._warm_mean, a._eval_warm_mean, a.model.training)
        functions = (a.compiled, a.fused_update, a._update_fn, a._plan_fn)
        members = None if a.threads is None else list(a.threads.noises)
        dropouts = _dropouts(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for name, value in a.model.state_dict().items():
                    value.copy_(model[name])
            for optim, saved in zip((a.optim, a.pi_optim), optims):
                _restore_optim(optim, saved)
            a.noise, a.threads, a.cfg, a._warm_mean, a._eval_warm_mean, training = kept
            a.model.train(training)
            a.compiled, a.fused_update, a._update_fn, a._plan_fn = functions
            if members is not None:
                a.threads.noises = members
            for layer, p in dropouts.items():
                layer.dropout = p
            _set_rng(a, rng)

    def _load(self, agent: TDMPC2, worker: int | None = None) -> None:
        """The check's weights (worker `worker`'s alone, for a lone agent) and a first
        update's Adam state."""
        with torch.no_grad():
            for name, value in agent.model.state_dict().items():
                if name in self.weights:
                    mine = self.weights[name]
                    value.copy_(mine if worker is None else mine[worker : worker + 1])
        for optim in (agent.optim, agent.pi_optim):
            for state in optim.state.values():
                for tensor in state.values():
                    tensor.zero_()  # step 0, no moments: as before the first update

    def _draws(self, agent: TDMPC2, seeds: list[int]) -> None:
        """Random streams of the check's seeds, and no dropout: the same numbers for a pack's
        worker k and a lone agent."""
        agent.noise = PackNoise(seeds, agent.device)
        if agent.threads is not None:
            agent.threads.noises = [agent.noise.member(k) for k in range(agent.pack)]
        for layer in _dropouts(agent):
            layer.dropout = 0.0

    def _seeds(self) -> list[int]:
        return [self.seed + 1 + k for k in range(self.agent.pack)]

    def _elites(self, path: FastPath) -> int:
        """The eager check's elites for `path` (see the module's docstring)."""
        samples = min(self.agent.cfg.num_samples, EAGER_SAMPLES)
        if path.bf16 or self.tf32:
            return samples
        return max(1, round(samples * EAGER_ELITES))

    def _small(self, agent: TDMPC2, elites: int) -> None:
        """The eager check's plan: few samples, `elites` of them elites, half of them the
        policy's (the mean moves with the observations and the networks), drawn within 0.5 of
        the previous mean (it moves with that too; at the usual 2 most draws are clamped to
        +-1)."""
        samples = min(agent.cfg.num_samples, EAGER_SAMPLES)
        agent.set_knobs(num_samples=samples, num_elites=elites, num_pi_trajs=samples // 2)
        agent.cfg = dataclasses.replace(agent.cfg, max_std=max(agent.cfg.min_std, 0.5))

    # the probe ---------------------------------------------------------------------------
    def pair(self, path: FastPath) -> tuple[Outputs, Outputs]:
        if path.mode == "eager":
            return self._eager(path), self.plain(path)
        return self._compiled(path)

    def _eager(self, path: FastPath) -> Outputs:
        a = self.agent
        batch = min(a.cfg.batch_size, EAGER_BATCH)
        inputs = check_inputs(a, batch, EAGER_ENVS, self.seed)
        with self.kept():
            a.use_path(path)
            self._load(a)
            self._draws(a, self._seeds())
            self._small(a, self._elites(path))
            return step(a, inputs)

    def plain(self, path: FastPath = PLAIN) -> Outputs:
        """The plain path's outputs to compare `path`'s with: one eager float32 agent per
        worker, planning with `path`'s elites (made once for each number of elites)."""
        elites = self._elites(path)
        if elites not in self._plain:
            a = self.agent
            inputs = check_inputs(a, min(a.cfg.batch_size, EAGER_BATCH), EAGER_ENVS, self.seed)
            with self.kept():  # its construction seeds torch's global generator
                cfg = dataclasses.replace(a.cfg, bf16=False, compile=False)
                lone = TDMPC2(cfg, a.obs_dim, a.action_dim, seeds=[self.seed])
                parts = []
                for k, seed in enumerate(self._seeds()):
                    lone.optim.state.clear()
                    lone.pi_optim.state.clear()
                    self._load(lone, worker=k)
                    self._draws(lone, [seed])
                    self._small(lone, elites)
                    parts.append(step(lone, inputs.worker(k)))
                    lone.cfg = cfg
            self._plain[elites] = Outputs.join(parts)
        return self._plain[elites]

    def _compiled(self, path: FastPath) -> tuple[Outputs, Outputs]:
        a = self.agent
        a.use_path(path)  # compiled from here on (lazily: the first call compiles)
        calls = GRAPH_CALLS if path.mode == "graphs" else 1
        inputs = [
            check_inputs(a, a.cfg.batch_size, a.cfg.num_envs, self.seed + 100 * (i + 1))
            for i in range(calls)
        ]
        with self.kept():
            for i, call in enumerate(inputs):
                self._load(a)
                rng = _rng_state(a)
                start = time.perf_counter()
                fast = step(a, call)
                if i == 0:
                    self.compile_seconds += time.perf_counter() - start
            self._load(a)
            _set_rng(a, rng)
            a.use_path(path.base)  # the same pack, eager (kept() puts the compiled one back)
            return fast, step(a, inputs[-1])


def check_fast_path(agent: TDMPC2, asked: str = "auto", can_split: bool = True) -> Verdict:
    """Check the agent's fast path (or the one asked for by hand) and put the agent on the
    path the check chose; a `split` verdict leaves it on its own (the run splits the pack)."""
    start = agent.path if asked == "auto" else dataclasses.replace(agent.path, mode=asked)
    if asked not in ("auto", "eager"):
        start = dataclasses.replace(start, threads=False)  # a compiled pack is batched
    probe = AgentProbe(agent)
    by_hand = asked != "auto"
    verdict = decide(ladder(start, by_hand, can_split), probe, by_hand, tf32=probe.tf32)
    verdict = dataclasses.replace(verdict, asked=asked)
    if not verdict.path.split:
        agent.use_path(verdict.path)
    return verdict


def check_switch(agent: TDMPC2, path: FastPath, by_hand: bool = False) -> Verdict:
    """The self-check of a path the agent is switched to while it trains (bf16 turned on by a
    knob, in a process that started in float32): `path`, then the path it is on now, which
    the start-up check chose; the agent is put on the first that agrees (by hand: on `path`,
    whatever the check finds)."""
    probe = AgentProbe(agent)
    rungs = [path] if by_hand else [path, agent.path]
    verdict = decide(rungs, probe, by_hand, "auto" if not by_hand else path.mode, tf32=probe.tf32)
    agent.use_path(verdict.path)
    return verdict


# helpers -------------------------------------------------------------------------------
def _dropouts(agent: TDMPC2) -> dict[Layer, float]:
    models = [agent.model] + ([] if agent.threads is None else agent.threads.members)
    return {m: m.dropout for model in models for m in model.modules() if isinstance(m, Layer)}


def _optim_state(optim: torch.optim.Optimizer) -> dict:
    return {p: {k: v.clone() for k, v in s.items()} for p, s in optim.state.items()}


def _restore_optim(optim: torch.optim.Optimizer, saved: dict) -> None:
    for param in [p for p in optim.state if p not in saved]:
        del optim.state[param]  # made by the check's update
    for param, values in saved.items():
        state = optim.state.setdefault(param, {})
        for key, value in values.items():
            if key in state and state[key].shape == value.shape:
                state[key].copy_(value)
            else:
                state[key] = value


def _rng_state(agent: TDMPC2) -> tuple:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda, [g.get_state() for g in agent.noise.generators]


def _set_rng(agent: TDMPC2, state: tuple) -> None:
    cpu, cuda, streams = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
    for generator, saved in zip(agent.noise.generators, streams):
        generator.set_state(saved)
