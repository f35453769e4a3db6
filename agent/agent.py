"""The TD-MPC2 agent, or a pack of P workers as one batched agent: acting by MPPI, one
gradient update, live knobs; merging inside the pack and saving one worker at a time are its
PackState's (agent/pack/state.py).

A pack holds P workers' networks stacked on a leading dimension (agent/layers.py). Each worker
keeps its own seed and random stream (agent/noise.py), Adam moments (Adam is element-wise, so
one Adam over stacked weights is P Adams), running Q scale, warm-start mean and gradient clip
(the norm of its own gradient). P = 1 is one agent, and its saved state is the same. The losses
are agent/losses.py's; on a CPU each worker computes them and plans on a thread of its own
(agent/pack/threads.py), on a GPU the pack's plan and update are one compiled graph each.
Over 300 lines because act and update share the pack's compiled graphs and their set-up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch

from agent.config import Config, knobs_of, with_knobs
from agent.cpu.bf16 import cpu_bf16, native_bf16
from agent.errors import ConfigError
from agent.knobs import KnobValues, knobs
from agent.losses import policy_loss, world_model_loss
from agent.math import TwoHot
from agent.noise import PackNoise
from agent.optim_step import adam_step, init_adam_state
from agent.pack.state import PackState
from agent.pack.threads import WorkerThreads
from agent.planner import PlanKnobs, plan
from agent.self_check import COMPILE_MODES, FastPath
from agent.world_model import WorldModel

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
COMPILE_CACHE = Path.home() / ".cache" / "tdmpc2-live" / "torch-compile"


def resolve_device(name: str) -> torch.device:
    """'auto' -> CUDA when available, else CPU; 'cuda' without a GPU is a user error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device cuda was asked for, but no CUDA GPU is available")
    return torch.device(name)


def matmul_precision(device: torch.device) -> None:
    """On CUDA, float32 matmuls in TF32 as the authors run them (about 3x the tensor-core rate
    for a 10-bit mantissa in the products, accumulation in float32); CPUs have no TF32."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")


def clip_per_worker(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """As clip_grad_norm_, but for each worker of a pack on its own: worker k's gradient is
    scaled by its own norm, whatever the others' are. Returns the (P,) norms before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    if grads[0].shape[0] == 1:  # one worker: torch's own (one fused pass)
        return torch.nn.utils.clip_grad_norm_(params, max_norm).view(1)
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads]).norm(dim=0)
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.view(-1, *(1,) * (g.dim() - 1)))
    return norms


class TDMPC2(PackState):
    """One TD-MPC2 agent, or a pack of len(seeds) workers. Its live knobs (agent/knobs.py, the
    agent's layer: `set_knobs`) may change between any two calls; they apply to every worker
    of the pack at once."""

    # A pack on a CPU runs each worker's update and plan on a thread of its own; tests turn it
    # off to check that the batched path, the one a GPU takes, gives the same values.
    cpu_threads = True
    _mode: str | None = None  # torch.compile's mode, once compiled

    def __init__(
        self, cfg: Config, obs_dim: int, action_dim: int, seeds: Sequence[int] | None = None
    ):
        self.device = resolve_device(cfg.device)
        matmul_precision(self.device)
        # bf16 matmuls in hardware where the CPU has them, else emulated at float32's speed
        self.native_bf16 = native_bf16() is not None
        self.seeds = list(seeds) if seeds else [cfg.seed]
        self.pack = len(self.seeds)
        self.step_offset, self.offset_updates = None, 0  # see PackState.step_offset
        self.cfg, self.obs_dim, self.action_dim = cfg, obs_dim, action_dim
        self.model = self._build_model().to(self.device)
        self.two_hot = TwoHot(cfg.num_bins, cfg.vmin, cfg.vmax, self.device)
        self.compiled = cfg.compile and self.device.type == "cuda"
        self.noise = PackNoise(self.seeds, self.device, shared=self.compiled)
        self.threads: WorkerThreads | None = None
        if self.pack > 1 and self.device.type == "cpu" and self.cpu_threads:
            self.threads = WorkerThreads(self.model, self.noise, torch.get_num_threads())
        m = self.model
        self.optim = torch.optim.Adam(
            [
                {"params": list(m.encoder.parameters()), "lr": cfg.lr * cfg.enc_lr_scale},
                {"params": m.model_parameters()},
            ],
            lr=cfg.lr,
            capturable=self.compiled,
        )
        self.pi_optim = torch.optim.Adam(
            m.pi.parameters(), lr=cfg.lr, eps=1e-5, capturable=self.compiled
        )
        self._warm_mean: torch.Tensor | None = None  # training's last plan mean
        self._eval_warm_mean: torch.Tensor | None = None  # evaluation's
        self._update_fn = self._update
        self._plan_fn = plan
        self.fused_update = False  # the update as one graph (see _compile)
        if self.compiled:
            # Compiled graphs are cached across runs (torch's FX graph cache) in the user's
            # cache folder, which outlives /tmp: a second run skips most of the compiling.
            os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(COMPILE_CACHE))
            self._compile("reduce-overhead")

    def _compile(self, mode: str | None) -> None:
        """Compile the plan and the update for the whole pack (P workers, one set of launches),
        each as one graph: the update's backward calls are traced into it (trace_autograd_ops)
        and its Adam steps are adam_step's, on state made now (agent/optim_step.py). Should the
        update not compile whole, update() falls back to the graph-broken one."""
        self.compiled, self.fused_update, self._mode = True, True, mode
        init_adam_state(self.optim)
        init_adam_state(self.pi_optim)
        # Random numbers from PyTorch's own kernels, not Inductor's, in whatever this process
        # compiles: the start-up self-check (agent/check_probe.py) replays a compiled call's
        # draws eagerly to compare them.
        torch._inductor.config.fallback_random = True
        update = torch.compile(self._update, mode=mode, fullgraph=True)
        self._update_fn = torch._dynamo.config.patch(trace_autograd_ops=True)(update)
        self._plan_fn = torch.compile(plan, mode=mode, fullgraph=True)

    @property
    def path(self) -> FastPath:
        """The fast path this agent computes on now (agent/self_check.py)."""
        if not self.compiled:
            mode = "eager"
        else:
            mode = "graphs" if self._mode == COMPILE_MODES["graphs"] else "compile"
        bf16 = self.cfg.bf16 and self.device.type == "cpu"
        return FastPath(mode, self.pack, self.threads is not None, bf16)

    def use_path(self, path: FastPath) -> None:
        """Compute on `path` from now on: compiled (with or without CUDA graphs; compiling
        again only for another mode) or eager, a CPU pack on threads or batched, bf16 or
        float32. A path's `split` is the run's to make (one process per worker)."""
        if path.pack != self.pack or path.split:
            raise ValueError(f"a pack of {self.pack} cannot compute as {path.describe()}")
        if path.mode == "eager":
            self.compiled = self.fused_update = False
            self._update_fn, self._plan_fn = self._update, plan
        elif not self.compiled or self._mode != COMPILE_MODES[path.mode]:
            self._compile(COMPILE_MODES[path.mode])
        if not path.threads:
            self.threads = None
        elif self.threads is None:
            self.threads = WorkerThreads(self.model, self.noise, torch.get_num_threads())
        self.cfg = dataclasses.replace(self.cfg, bf16=path.bf16)

    def _build_model(self) -> WorldModel:
        """Worker k's networks start as those of a lone agent seeded seeds[k]."""
        cfg, dims = self.cfg, (self.obs_dim, self.action_dim)
        torch.manual_seed(self.seeds[0])
        if self.pack == 1:
            return WorldModel(cfg, *dims)
        model = WorldModel(cfg, *dims, pack=self.pack)
        with torch.no_grad():
            for k, seed in enumerate(self.seeds):
                torch.manual_seed(seed)
                alone = WorldModel(cfg, *dims).state_dict()
                for name, tensor in model.state_dict().items():
                    tensor[k].copy_(alone[name][0])
        torch.manual_seed(self.seeds[0])
        return model

    # knobs -------------------------------------------------------------------------
    @property
    def knobs(self) -> dict[str, float]:
        return knobs_of(self.cfg)

    def set_knobs(self, values: KnobValues | None = None, **changes: float) -> None:
        """Change live knobs; on error nothing changes. Keywords are checked here; a run's
        KnobValues were checked where they entered it and are taken as they are (their agent
        layer: the merge frequency is the worker's). The config checks across fields either way."""
        cfg = self.cfg
        if values is not None:
            mine = {name: v for name, v in values.items() if name in knobs("agent")}
            cfg = dataclasses.replace(cfg, **mine)
        self.cfg = with_knobs(cfg, **changes) if changes else cfg

    def plan_knobs(self) -> PlanKnobs:
        """The planner's values, each the config's field of the same name (so a planner knob
        is a table row, a Config field and a PlanKnobs field); iterations as resolved."""
        values = {f.name: getattr(self.cfg, f.name) for f in dataclasses.fields(PlanKnobs)}
        return PlanKnobs(**{**values, "iterations": self.cfg.resolved_iterations(self.action_dim)})

    # acting ------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.cfg.bf16 and self.device.type == "cpu":
            return cpu_bf16(self.native_bf16)
        return contextlib.nullcontext()

    def _shifted_warm_mean(self, n: int, t0: torch.Tensor, eval_mode: bool = False) -> torch.Tensor:
        """Previous plan means (P, N, H, A) shifted one step, zeros where an episode starts.
        Evaluation keeps a warm start of its own: it runs in the middle of a training episode,
        which then goes on from its own last plan, not from the evaluation's."""
        h = self.cfg.horizon
        fresh = torch.zeros(self.pack, n, h, self.action_dim, device=self.device)
        prev = self._eval_warm_mean if eval_mode else self._warm_mean
        if prev is None or prev.shape[1] != n:
            return fresh
        keep = min(h, prev.shape[2] - 1)
        fresh[:, :, :keep] = prev[:, :, 1 : keep + 1]
        return torch.where(t0.view(self.pack, n, 1, 1), 0.0, fresh)

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, t0: bool | torch.Tensor = False, eval_mode: bool = False
    ) -> torch.Tensor:
        """Actions in [-1, 1] for observations (P, N, obs_dim); one agent (P = 1) also takes
        (obs_dim,) or (N, obs_dim) and answers in the same shape."""
        packed = obs.dim() == 3
        if (packed and obs.shape[0] != self.pack) or (not packed and self.pack != 1):
            raise ValueError(
                f"a pack of {self.pack} acts on ({self.pack}, N, obs_dim) observations, "
                f"got {tuple(obs.shape)}"
            )
        if obs.shape[-1] != self.obs_dim:
            raise ValueError(f"observations have {obs.shape[-1]} values, expected {self.obs_dim}")
        obs = obs.to(self.device, torch.float32).reshape(self.pack, -1, self.obs_dim)
        n = obs.shape[1]
        t0 = torch.as_tensor(t0, device=self.device).reshape(-1).expand(self.pack * n)
        t0 = t0.view(self.pack, n)
        self.model.eval()
        with self._autocast():
            if self.cfg.mpc:
                warm = self._shifted_warm_mean(n, t0, eval_mode)
                if self.compiled:
                    torch.compiler.cudagraph_mark_step_begin()
                action, mean = self._plan(obs, warm, eval_mode)
                if eval_mode:
                    self._eval_warm_mean = mean.clone()
                else:
                    self._warm_mean = mean.clone()
            else:
                eps = self.noise.normal(n, self.action_dim)
                sample = self.model.policy(self.model.encode(obs, self.noise), eps)
                action = sample.mean if eval_mode else sample.action
        action = action.float().clone()
        if packed:
            return action
        return action.view(-1, self.action_dim).squeeze(0) if n == 1 else action[0]

    def _plan(
        self, obs: torch.Tensor, warm: torch.Tensor, eval_mode: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        knobs = self.plan_knobs()
        if self.threads is None:
            return self._plan_fn(self.model, self.two_hot, obs, warm, knobs, eval_mode, self.noise)

        def part(model: WorldModel, noise: PackNoise, obs: torch.Tensor, warm: torch.Tensor):
            return plan(model, self.two_hot, obs, warm, knobs, eval_mode, noise)

        return self.threads.map(part, obs, warm, context=self._autocast)

    # learning ----------------------------------------------------------------------
    def _update(self, obs, action, reward, terminated) -> dict[str, torch.Tensor]:
        """Worker-first batch: obs (P, H+1, B, D), action (P, H, B, A), reward and terminated
        (P, H, B, 1). Each loss is per worker, (P,); their sum is differentiated, which gives
        each worker the gradient of its own loss."""
        model_loss = partial(world_model_loss, self.cfg, self.two_hot)
        total, out, zs = self._learn(model_loss, obs, action, reward, terminated)
        grad_norm = self._step(self.optim)
        pi_loss, pi_entropy, q_mean = self._learn(partial(policy_loss, self.cfg, self.two_hot), zs)
        pi_grad_norm = self._step(self.pi_optim)
        self.model.update_targets(self.cfg.tau)
        out.update(
            total_loss=total,
            pi_loss=pi_loss,
            grad_norm=grad_norm,
            pi_grad_norm=pi_grad_norm,
            pi_entropy=pi_entropy,
            q_mean=q_mean,
            q_scale=self.model.q_scale,
        )
        return {k: v.detach() for k, v in out.items()}

    def _learn(self, loss_fn, *inputs: torch.Tensor):
        """loss_fn(model, noise, *inputs) -> (loss (P,), *rest) for the whole pack, its loss
        differentiated; on a CPU each worker runs on a thread of its own
        (agent/pack/threads.py). The gradient is left in the pack's .grad either way; returns
        (loss, *rest) detached."""

        def part(model: WorldModel, noise: PackNoise, *xs: torch.Tensor):
            loss, *rest = loss_fn(model, noise, *xs)
            loss.sum().backward()
            return (loss.detach(), *rest)

        if self.threads is None:
            return part(self.model, self.noise, *inputs)
        results = self.threads.map(part, *inputs, context=self._autocast)
        self.threads.gather_grads()
        return results

    def _step(self, optim: torch.optim.Optimizer) -> torch.Tensor:
        """Clip each worker's gradient and take one Adam step; the (P,) norms before clipping."""
        params = [p for g in optim.param_groups for p in g["params"]]
        norms = clip_per_worker(params, self.cfg.grad_clip_norm)
        if self.fused_update:
            adam_step(optim)  # in the update's one graph (torch.optim breaks it at each step)
        else:
            optim.step()
        if self.step_offset is not None:  # a worker reset alone: its own bias correction
            self.offset_adam_step(optim)
        for p in params:  # zero_grad(set_to_none=True), which torch.compile will not trace
            p.grad = None
        return norms

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One gradient step for every worker. batch: obs (P, H+1, B, D), action (P, H, B, A),
        reward and terminated (P, H, B, 1), worker k's from its own buffer; the losses come
        back as (P,) tensors. One agent also takes (H+1, B, D), ... (a buffer's sample) and
        answers with 0-d losses."""
        packed = batch[0].dim() == 4
        if (packed and batch[0].shape[0] != self.pack) or (not packed and self.pack != 1):
            raise ValueError(
                f"a pack of {self.pack} updates on batches shaped ({self.pack}, H+1, B, "
                f"obs_dim), got {tuple(batch[0].shape)}"
            )
        if not packed:
            batch = tuple(x.unsqueeze(0) for x in batch)
        self.model.train()
        with self._autocast():
            if self.compiled:
                torch.compiler.cudagraph_mark_step_begin()
            try:
                info = self._update_fn(*batch)
            except torch._dynamo.exc.TorchDynamoException as err:
                # Raised while compiling, before anything ran: fall back to the update with
                # graph breaks at backward and at torch.optim's steps (slower, the same math).
                if not self.fused_update:
                    raise
                first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
                warnings.warn(
                    f"the update does not compile as one graph ({first}); "
                    "compiling it with graph breaks instead",
                    stacklevel=2,
                )
                self.fused_update = False
                self._update_fn = torch.compile(self._update, mode=self._mode)
                info = self._update_fn(*batch)
        info = {k: v.clone() for k, v in info.items()} if self.compiled else info
        self.count_offset_update()
        return info if packed else {k: v[0] for k, v in info.items()}
