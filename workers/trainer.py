"""Online training of one TD-MPC2 agent on (vectorised) environments, logging to a run directory.

The step loop follows the reference: random actions for the seed steps, then as many updates at
once (pretraining), then one update per `steps_per_update` environment steps.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from agent.agent import TDMPC2
from agent.buffer import EpisodeBuffer
from agent.config import Config, knobs_of, to_dict
from agent.envs import make_env, make_vector_env
from workers.progress import Progress
from workers.rundir import RunDir, load_state, save_state


class StopTraining(Exception):
    """Raised by a step hook to end training early, as requested (not an error)."""


@dataclass
class _Episode:
    """One env's episode in progress."""

    obs: list[np.ndarray] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)


def first_update_step(cfg: Config) -> int | None:
    """The agent step of the first update of a fresh run (None: never). Updates begin after
    the seed steps, once the buffer holds a whole episode longer than the horizon (the tasks
    here end on time, so each env's first episode ends after episode_length steps)."""
    if cfg.episode_length < cfg.horizon:
        return None
    n = cfg.num_envs
    ready = max(cfg.resolved_seed_steps, n * cfg.episode_length)
    return -(-ready // n) * n  # steps advance by num_envs


def steps_warning(cfg: Config) -> str | None:
    """A warning line when `cfg.steps` ends before the first update, else None."""
    first = first_update_step(cfg)
    if first is None:
        return (
            f"warning: episodes of {cfg.episode_length} steps are shorter than the horizon "
            f"({cfg.horizon}): the agent will never update"
        )
    if -(-cfg.steps // cfg.num_envs) * cfg.num_envs >= first:
        return None
    return (
        f"warning: {cfg.steps} steps end before the first update, at step {first} (after the "
        f"{cfg.resolved_seed_steps} seed steps, once a whole {cfg.episode_length}-step episode "
        "is in the buffer): the agent will not learn; raise --steps or lower --seed-steps"
    )


def evaluate(
    agent: TDMPC2,
    cfg: Config,
    episodes: int,
    seed: int,
    on_step: Callable[[int], None] | None = None,
) -> list[float]:
    """Returns of `episodes` evaluation episodes (a drawn elite, no exploration noise).
    `on_step(j)` is called after every env step and episode end, j episodes done (an
    evaluation of a big model on a CPU takes minutes: the progress display follows it)."""
    env = make_env(cfg.task, seed, cfg.action_repeat, cfg.episode_length)
    returns = []
    try:
        for i in range(episodes):
            obs, _ = env.reset(seed=seed + i)
            done, total, t0 = False, 0.0, True
            while not done:
                action = agent.act(torch.from_numpy(obs), t0=t0, eval_mode=True)
                obs, reward, terminated, truncated, _ = env.step(action.cpu().numpy())
                total += reward
                done, t0 = terminated or truncated, False
                if on_step is not None and not done:
                    on_step(i)
            returns.append(total)
            if on_step is not None:
                on_step(i + 1)
    finally:
        env.close()
    return returns


class Trainer:
    """Trains one agent for cfg.steps agent steps (summed over envs)."""

    def __init__(
        self,
        cfg: Config,
        run_dir: RunDir | None = None,
        load_weights: str | None = None,
        progress: bool = True,
        log_every_s: float = 10.0,
        step_hook: Callable[[Trainer], None] | None = None,
        write_config: bool = True,
        update_hook: Callable[[Trainer], None] | None = None,
    ):
        self.cfg, self.run_dir = cfg, run_dir
        self.step_hook, self.write_config = step_hook, write_config
        # Called after every update: the 1000s of pretraining updates take minutes on a CPU,
        # and a stop or pause must not wait for them to end.
        self.update_hook = update_hook
        self.env = make_vector_env(
            cfg.task, cfg.num_envs, cfg.seed, cfg.action_repeat, cfg.episode_length
        )
        obs_dim = self.env.single_observation_space.shape[0]
        action_dim = self.env.single_action_space.shape[0]
        self.agent = TDMPC2(cfg, obs_dim, action_dim)
        if load_weights:
            self.agent.load_state_dict(
                load_state(load_weights, self.agent.device), weights_only=True
            )
        # Room for the training steps plus each episode's first row (no transition into it).
        rows = min(cfg.buffer_size, cfg.steps) + cfg.steps // cfg.episode_length + cfg.num_envs
        self.buffer = EpisodeBuffer(
            max(rows, cfg.episode_length + 1),
            obs_dim,
            action_dim,
            cfg.horizon,
            cfg.batch_size,
            self.agent.device,
            seed=cfg.seed,
        )
        self.progress = Progress(cfg.steps, enabled=progress)
        self._pretrain_total = cfg.resolved_seed_steps
        # Called after every evaluation step (a worker stops or pauses there too).
        self.eval_hook: Callable[[Trainer], None] | None = None
        self.log_every_s = log_every_s
        self.step = 0
        self.updates = 0
        self.episode_returns: list[float] = []
        self.eval_returns: list[tuple[int, float]] = []
        self.pretrained = False
        self.pretrain_updates = 0  # done so far; a run stopped while pretraining resumes there
        self.update_credit = 0.0
        self.rng = np.random.default_rng(cfg.seed)

    # resumable state ---------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue: agent, optimisers, buffer, counters, RNG states."""
        return {
            "agent": self.agent.state_dict(),
            "buffer": self.buffer.state_dict(),
            "step": self.step,
            "updates": self.updates,
            "pretrained": self.pretrained,
            "pretrain_updates": self.pretrain_updates,
            "update_credit": self.update_credit,
            "eval_returns": [list(e) for e in self.eval_returns],
            "knobs": knobs_of(self.agent.cfg),
            "numpy_rng": json.dumps(self.rng.bit_generator.state),
            "torch_rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.agent.load_state_dict(state["agent"])
        self.agent.set_knobs(**state["knobs"])
        self.buffer.load_state_dict(state["buffer"])
        self.step, self.updates = int(state["step"]), int(state["updates"])
        self.pretrained, self.update_credit = (
            bool(state["pretrained"]),
            float(state["update_credit"]),
        )
        self.pretrain_updates = int(state.get("pretrain_updates", 0))
        self.eval_returns = [(int(s), float(r)) for s, r in state["eval_returns"]]
        self.rng.bit_generator.state = json.loads(state["numpy_rng"])
        torch.set_rng_state(state["torch_rng"])

    def start_at(self, step: int) -> None:
        """Begin with weights trained elsewhere for `step` agent steps (the merged ones): count
        on from there, with no random seed steps and no pretraining burst; updates begin once
        the first episode is in this trainer's own buffer."""
        self.step, self.pretrained = step, True

    # logging -----------------------------------------------------------------------
    def _log(self, kind: str, **fields: object) -> None:
        if self.run_dir is not None:
            self.run_dir.log(kind, step=self.step, **fields)

    def _evaluate(self) -> None:
        episodes, before = self.cfg.eval_episodes, self.progress.phase_name

        def on_step(done: int) -> None:
            self.progress.phase("evaluating", done, episodes)
            self.progress.show()
            if self.eval_hook is not None:
                self.eval_hook(self)

        on_step(0)
        returns = evaluate(self.agent, self.cfg, episodes, self.cfg.seed + 10_000, on_step)
        mean = float(np.mean(returns))
        self.eval_returns.append((self.step, mean))
        self._log("eval", ret=mean, returns=[round(r, 3) for r in returns])
        self.progress.set(eval_return=mean)
        self.progress.phase(before)

    def _update(self, count: int) -> None:
        info = None
        for _ in range(count):
            info = self.agent.update(self.buffer.sample())
            self.updates += 1
            if not self.pretrained:
                self.pretrain_updates += 1
                self.progress.phase("pretraining", self.pretrain_updates, self._pretrain_total)
                self.progress.show()
            if self.update_hook is not None:
                self.update_hook(self)
        if info is not None and time.monotonic() - self._last_train_log > self.log_every_s:
            self._last_train_log = time.monotonic()
            losses = {k: float(v) for k, v in info.items()}
            self._log("train", updates=self.updates, steps_per_s=self.progress.rate, **losses)

    # the loop ----------------------------------------------------------------------
    def run(self) -> dict:
        """Train; Ctrl+C (KeyboardInterrupt) stops early. Weights are saved either way."""
        cfg = self.cfg
        if self.run_dir is not None and self.write_config:
            self.run_dir.write_config(
                {"config": to_dict(cfg), "device": str(self.agent.device), "knobs": knobs_of(cfg)}
            )
        self._last_train_log = -float("inf")  # the first update is always logged
        interrupted = False
        try:
            self._train()
            if (
                cfg.eval_every == 0
                or not self.eval_returns
                or self.eval_returns[-1][0] != self.step
            ):
                self._evaluate()
        except (KeyboardInterrupt, StopTraining):
            interrupted = True
        finally:
            if self.run_dir is not None:
                self.progress.phase("saving")
                self.progress.show(force=True)
                save_state(self.run_dir.weights_path, self.agent.state_dict())
                self._log("stop", reason="interrupted" if interrupted else "done")
                self.run_dir.close()
            self.progress.phase("stopped" if interrupted else "done")
            self.progress.close()
            self.env.close()
        return {
            "steps": self.step,
            "updates": self.updates,
            "interrupted": interrupted,
            "episode_returns": self.episode_returns,
            "eval_returns": self.eval_returns,
        }

    def _train(self) -> None:
        cfg, env, n = self.cfg, self.env, self.cfg.num_envs
        seed_steps = cfg.resolved_seed_steps
        obs, _ = env.reset(seed=cfg.seed)
        episodes = [_Episode(obs=[o]) for o in obs]
        t0 = torch.ones(n, dtype=torch.bool)
        next_eval = (self.step // cfg.eval_every + 1) * cfg.eval_every if cfg.eval_every else None
        if self.pretrain_updates and not self.pretrained:  # resumed from a stop mid-pretraining
            self._pretrain(seed_steps)
        while self.step < cfg.steps:
            if self.step < seed_steps:
                action = self.rng.uniform(-1, 1, env.action_space.shape)
            else:
                action = self.agent.act(torch.from_numpy(obs), t0=t0).cpu().numpy()
            action = action.astype(np.float32)
            obs, reward, terminated, truncated, info = env.step(action)
            self.step += n
            done = terminated | truncated
            for i, ep in enumerate(episodes):
                ep.actions.append(action[i])
                ep.rewards.append(float(reward[i]))
                if done[i]:
                    ep.obs.append(info["final_obs"][i])
                    self._finish_episode(ep, bool(terminated[i]), i)
                    episodes[i] = _Episode(obs=[obs[i]])
                else:
                    ep.obs.append(obs[i])
            t0 = torch.from_numpy(done)
            if self.step >= seed_steps and self.buffer.can_sample():
                if not self.pretrained:
                    self._pretrain(seed_steps)
                else:
                    self.update_credit += n / self.agent.cfg.steps_per_update
                    count = int(self.update_credit)
                    self.update_credit -= count
                    self._update(count)
            # Until the first update: random seed steps, or (weights from elsewhere, see
            # start_at) acting while the buffer fills.
            self.progress.phase("training" if self.pretrained else "seeding")
            self.progress.show(self.step)
            if next_eval is not None and self.step >= next_eval:
                next_eval += cfg.eval_every
                self._evaluate()
            if self.step_hook is not None:
                self.step_hook(self)

    def _pretrain(self, seed_steps: int) -> None:
        """As many updates as there were seed steps (those a stop interrupted are not redone)."""
        self._pretrain_total = seed_steps
        self.progress.phase("pretraining", self.pretrain_updates, seed_steps)
        self.progress.show(self.step, force=True)
        self._update(seed_steps - self.pretrain_updates)
        self.pretrained = True

    def _finish_episode(self, ep: _Episode, terminated: bool, env_index: int) -> None:
        self.buffer.add_episode(
            torch.from_numpy(np.stack(ep.obs)),
            torch.from_numpy(np.stack(ep.actions)),
            torch.tensor(ep.rewards),
            terminated,
        )
        ret = float(sum(ep.rewards))
        self.episode_returns.append(ret)
        self._log("episode", ret=ret, length=len(ep.rewards), env=env_index)
        self.progress.set(episode_return=ret)
