"""The TD-MPC2 agent: acting by MPPI, one gradient update, live knobs, saving and loading."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from agent.config import Config, knobs_of, with_knobs
from agent.errors import ConfigError, WeightsError
from agent.math import TwoHot, percentile_range
from agent.planner import PlanKnobs, plan
from agent.world_model import WorldModel

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def resolve_device(name: str) -> torch.device:
    """'auto' -> CUDA when available, else CPU; 'cuda' without a GPU is a user error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device cuda was asked for, but no CUDA GPU is available")
    return torch.device(name)


class TDMPC2:
    """One TD-MPC2 agent. Knobs in KNOB_RANGES may change between any two calls."""

    def __init__(self, cfg: Config, obs_dim: int, action_dim: int):
        self.device = resolve_device(cfg.device)
        torch.manual_seed(cfg.seed)
        self.cfg, self.obs_dim, self.action_dim = cfg, obs_dim, action_dim
        self.train_horizon = cfg.horizon
        self.model = WorldModel(cfg, obs_dim, action_dim).to(self.device)
        self.two_hot = TwoHot(cfg.num_bins, cfg.vmin, cfg.vmax, self.device)
        self.compiled = cfg.compile and self.device.type == "cuda"
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
        self._warm_mean: torch.Tensor | None = None
        self._update_fn = self._update
        self._plan_fn = plan
        if self.compiled:
            self._update_fn = torch.compile(self._update, mode="reduce-overhead")
            self._plan_fn = torch.compile(plan, mode="reduce-overhead")

    # knobs -------------------------------------------------------------------------
    @property
    def knobs(self) -> dict[str, float]:
        return knobs_of(self.cfg)

    def set_knobs(self, **knobs: float) -> None:
        """Change live knobs (validated as a whole; on error nothing changes)."""
        self.cfg = with_knobs(self.cfg, **knobs)

    def plan_knobs(self) -> PlanKnobs:
        c = self.cfg
        return PlanKnobs(
            horizon=c.horizon,
            iterations=c.resolved_iterations(self.action_dim),
            num_samples=c.num_samples,
            num_elites=c.num_elites,
            num_pi_trajs=c.num_pi_trajs,
            temperature=c.temperature,
            min_std=c.min_std,
            max_std=c.max_std,
            gamma=c.gamma,
        )

    # acting ------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.cfg.bf16 and self.device.type == "cpu":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _shifted_warm_mean(self, n: int, t0: torch.Tensor) -> torch.Tensor:
        """Previous plan means shifted one step, zeros where an episode starts."""
        h = self.cfg.horizon
        fresh = torch.zeros(n, h, self.action_dim, device=self.device)
        prev = self._warm_mean
        if prev is None or prev.shape[0] != n:
            return fresh
        keep = min(h, prev.shape[1] - 1)
        fresh[:, :keep] = prev[:, 1 : keep + 1]
        return torch.where(t0.view(n, 1, 1), 0.0, fresh)

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, t0: bool | torch.Tensor = False, eval_mode: bool = False
    ) -> torch.Tensor:
        """Actions in [-1, 1] for observations (obs_dim,) or (N, obs_dim)."""
        single = obs.dim() == 1
        obs = obs.to(self.device, torch.float32).view(-1, self.obs_dim)
        n = obs.shape[0]
        t0 = torch.as_tensor(t0, device=self.device).expand(n)
        self.model.eval()
        with self._autocast():
            if self.cfg.mpc:
                warm = self._shifted_warm_mean(n, t0)
                if self.compiled:
                    torch.compiler.cudagraph_mark_step_begin()
                action, mean = self._plan_fn(
                    self.model, self.two_hot, obs, warm, self.plan_knobs(), eval_mode
                )
                self._warm_mean = mean.clone()
            else:
                sample = self.model.policy(self.model.encode(obs))
                action = sample.mean if eval_mode else sample.action
        action = action.float().clone()
        return action[0] if single else action

    # learning ----------------------------------------------------------------------
    def _rho_weights(self, horizon: int) -> torch.Tensor:
        return self.cfg.rho ** torch.arange(horizon, device=self.device, dtype=torch.float32)

    def _update(self, obs, action, reward, terminated) -> dict[str, torch.Tensor]:
        cfg, m, two_hot = self.cfg, self.model, self.two_hot
        horizon, batch = action.shape[:2]
        rho = self._rho_weights(horizon)
        with torch.no_grad():
            next_z = m.encode(obs[1:])
            flat_next = next_z.flatten(0, 1)
            next_action = m.policy(flat_next).action
            target_q = two_hot.decode(
                m.q_logits((flat_next, next_action), m.random_q_pair(), target=True)
            )
            next_value = target_q.min(0).values.view(horizon, batch, 1)
            td_target = reward + cfg.gamma * (1 - terminated) * next_value

        z = m.encode(obs[0])
        zs = [z]
        consistency = 0.0
        for t in range(horizon):
            z = m.next(z, action[t])
            consistency = consistency + rho[t] * F.mse_loss(z, next_z[t])
            zs.append(z)
        zs = torch.stack(zs)
        flat_z, flat_a = zs[:-1].flatten(0, 1), action.flatten(0, 1)
        reward_ce = two_hot.cross_entropy(m.reward_logits(flat_z, flat_a), reward.flatten(0, 1))
        q_ce = two_hot.cross_entropy(m.q_logits((flat_z, flat_a)), td_target.flatten(0, 1))
        reward_loss = (reward_ce.view(horizon, batch).mean(1) * rho).sum() / horizon
        value_loss = (q_ce.view(-1, horizon, batch).mean(2) * rho).sum() / (horizon * cfg.num_q)
        consistency = consistency / horizon
        total = (
            cfg.consistency_coef * consistency
            + cfg.reward_coef * reward_loss
            + cfg.value_coef * value_loss
        )
        out = {"consistency_loss": consistency, "reward_loss": reward_loss}
        if m.termination is not None:
            logits = m.termination_logit(zs[1:])
            termination_loss = F.binary_cross_entropy_with_logits(logits, terminated)
            total = total + cfg.termination_coef * termination_loss
            out["termination_loss"] = termination_loss
        total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for g in self.optim.param_groups for p in g["params"]], cfg.grad_clip_norm
        )
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)

        # Policy: maximise the scaled mean of two random Qs on the detached rollout latents.
        pi_z = zs.detach().flatten(0, 1)
        sample = m.policy(pi_z)
        q = two_hot.decode(m.q_logits((pi_z, sample.action), m.random_q_pair(), detach=True))
        q = q.mean(0)
        q = q.view(horizon + 1, batch)
        with torch.no_grad():
            spread = percentile_range(q[0]).clamp_min(1.0)
            m.q_scale.lerp_(spread, cfg.tau)
        scaled_entropy = sample.scaled_entropy.view(horizon + 1, batch)
        objective = cfg.entropy_coef * scaled_entropy + q / m.q_scale
        pi_rho = self._rho_weights(horizon + 1)
        pi_loss = -(objective.mean(1) * pi_rho).mean()
        pi_loss.backward()
        pi_grad_norm = torch.nn.utils.clip_grad_norm_(m.pi.parameters(), cfg.grad_clip_norm)
        self.pi_optim.step()
        self.pi_optim.zero_grad(set_to_none=True)
        m.update_targets(cfg.tau)
        out.update(
            value_loss=value_loss,
            total_loss=total,
            pi_loss=pi_loss,
            grad_norm=grad_norm,
            pi_grad_norm=pi_grad_norm,
            pi_entropy=-sample.log_prob.mean(),
            q_scale=m.q_scale,
        )
        return {k: v.detach() for k, v in out.items()}

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One gradient step on a batch (obs (H+1,B,D), action (H,B,A), reward, terminated)."""
        self.model.train()
        with self._autocast():
            if self.compiled:
                torch.compiler.cudagraph_mark_step_begin()
            info = self._update_fn(*batch)
        return {k: v.clone() for k, v in info.items()} if self.compiled else info

    # weights -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "format": "tdmpc2-live/agent/1",
            "obs_dim": self.obs_dim,
            "action_dim": self.action_dim,
            "model": self.model.state_dict(),
            "optim": self.optim.state_dict(),
            "pi_optim": self.pi_optim.state_dict(),
        }

    def load_state_dict(self, state: dict, weights_only: bool = False) -> None:
        """Load a state from state_dict(); a mismatch raises WeightsError, changing nothing."""
        if not isinstance(state, dict) or state.get("format") != "tdmpc2-live/agent/1":
            raise WeightsError("not a TD-MPC2 Live agent state (missing or unknown format tag)")
        dims = (state.get("obs_dim"), state.get("action_dim"))
        if dims != (self.obs_dim, self.action_dim):
            raise WeightsError(
                f"weights are for obs/action dims {dims}, this task has "
                f"{(self.obs_dim, self.action_dim)}"
            )
        own = self.model.state_dict()
        theirs = state.get("model", {})
        missing, extra = sorted(set(own) - set(theirs)), sorted(set(theirs) - set(own))
        if missing or extra:
            raise WeightsError(
                f"weights do not match this model (missing {missing[:3]}, unexpected {extra[:3]})"
            )
        for name, tensor in own.items():
            if theirs[name].shape != tensor.shape:
                raise WeightsError(
                    f"weights do not match this model size: {name} has shape "
                    f"{tuple(theirs[name].shape)}, expected {tuple(tensor.shape)}"
                )
            if not torch.isfinite(theirs[name]).all():
                raise WeightsError(f"weights contain non-finite values in {name}")
        self.model.load_state_dict(theirs)
        if not weights_only:
            self.optim.load_state_dict(state["optim"])
            self.pi_optim.load_state_dict(state["pi_optim"])
