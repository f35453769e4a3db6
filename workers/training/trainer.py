"""Online training of one TD-MPC2 agent, or of a pack of workers in lockstep, on (vectorised)
environments, logging to run directories.

The step loop follows the reference: random actions for the seed steps, then as many updates at
once (pretraining), then `updates_per_step` updates per `steps_per_update` environment steps. A
pack of P workers (agent/agent.py) steps all their envs as one vector env, plans for all of them
in one call and updates all of them in one call; each worker keeps its own envs, buffer, random
actions, episodes and metrics file. P = 1 is one agent. Over 300 lines because the step loop
and the counters it advances (step, updates, pretraining, update credit) are one state, which
state_dict must save whole.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from agent.agent import TDMPC2
from agent.buffer import EpisodeBuffer, buffer_rows, frame_storage
from agent.config import Config, knobs_of, to_dict
from agent.envs import make_vector_env, start_step
from workers.rundir.directory import RunDir, save_state
from workers.rundir.records import Episode, Eval, Record, Stop, Train
from workers.training.evaluation import evaluate
from workers.training.member import EpisodeSoFar, Member, state_at
from workers.training.progress import Progress
from workers.training.stop_training import StopTraining


class TrainingHooks(Protocol):
    """What the trainer calls while it runs (the worker process's: hooks.py); any of them may
    raise StopTraining."""

    def after_step(self, trainer: Trainer) -> None:
        """After every agent step (summed over envs)."""

    def after_update(self, trainer: Trainer) -> None:
        """After every update: pretraining's thousands take minutes on a CPU, and a pause or
        stop must not wait for them."""

    def during_evaluation(self, trainer: Trainer) -> None:
        """After every step of an evaluation (minutes on a CPU, too)."""


class NoHooks:
    """A trainer on its own: nothing runs between its steps."""

    def after_step(self, trainer: Trainer) -> None:
        pass

    def after_update(self, trainer: Trainer) -> None:
        pass

    def during_evaluation(self, trainer: Trainer) -> None:
        pass


class Trainer:
    """Trains one agent, or a pack of len(seeds) workers in lockstep, for cfg.steps agent steps
    each (summed over envs). `run_dir`: one per worker (a single one for one worker)."""

    def __init__(
        self,
        cfg: Config,
        run_dir: RunDir | Sequence[RunDir | None] | None = None,
        progress: bool = True,
        log_every_s: float = 10.0,
        write_config: bool = True,
        seeds: Sequence[int] | None = None,
        env_seeds: Sequence[int | None] | None = None,
    ):
        """`seeds`: each worker's (its agent, buffer and random actions); `env_seeds`: each
        one's environments' first seed where it is not its own seed (a race's replicas pair
        their lanes' environments)."""
        self.cfg = cfg
        seeds = list(seeds) if seeds else [cfg.seed]
        firsts = [s if e is None else e for s, e in zip(seeds, env_seeds or [None] * len(seeds))]
        run_dirs = list(run_dir) if isinstance(run_dir, (list, tuple)) else [run_dir] * len(seeds)
        self.write_config = write_config
        self.hooks: TrainingHooks = NoHooks()  # run(hooks) sets them
        n = cfg.num_envs
        # All workers' envs in one vector env (asynchronous where cores allow), worker k's
        # seeded as its own would be: firsts[k], firsts[k] + 1, ...
        self.env_seeds = [seed + i for seed in firsts for i in range(n)]
        self.eval_seeds = [seed + 10_000 for seed in firsts]  # evaluation's own episodes
        self.env = make_vector_env(
            cfg.task,
            len(self.env_seeds),
            0,
            cfg.action_repeat,
            cfg.episode_length,
            seeds=self.env_seeds,
            env_kwargs=cfg.env_options,
            obs=cfg.obs,
        )
        obs_dim = self.env.single_observation_space.shape[0]
        self.step_seconds = float(self.env.get_attr("control_timestep")[0])  # for replays
        action_dim = self.env.single_action_space.shape[0]
        self.agent = TDMPC2(cfg, obs_dim, action_dim, seeds=seeds)
        self.members = [
            Member(
                seed,
                EpisodeBuffer(
                    buffer_rows(cfg),
                    obs_dim,
                    action_dim,
                    cfg.horizon,
                    cfg.batch_size,
                    self.agent.device,
                    seed=seed,
                    **frame_storage(cfg),
                ),
                run_dirs[k],
                np.random.default_rng(seed),
            )
            for k, seed in enumerate(seeds)
        ]
        self.progress = Progress(cfg.steps, enabled=progress)
        self._pretrain_total = cfg.resolved_pretrain_updates
        self.log_every_s = log_every_s
        self.step = 0
        self.updates = 0
        self.pretrained = False
        self.pretrain_updates = 0  # done so far; a run stopped while pretraining resumes there
        self.update_credit = 0.0

    # the first worker's parts, as a lone agent's trainer has them
    @property
    def buffer(self) -> EpisodeBuffer:
        return self.members[0].buffer

    @property
    def run_dir(self) -> RunDir | None:
        return self.members[0].run_dir

    @property
    def episode_returns(self) -> list[float]:
        return self.members[0].episode_returns

    @property
    def eval_returns(self) -> list[tuple[int, float]]:
        return self.members[0].eval_returns

    # resumable state ---------------------------------------------------------------
    def state_dict(self, worker: int = 0) -> dict:
        """Everything one worker needs to continue: agent, optimisers, buffer, counters, RNG
        states."""
        m = self.members[worker]
        return {
            "agent": self.agent.state_dict(worker),
            "buffer": m.buffer.state_dict(),
            "step": self.step,
            "updates": self.updates,
            "pretrained": self.pretrained,
            "pretrain_updates": self.pretrain_updates,
            "update_credit": self.update_credit,
            "eval_returns": [list(e) for e in m.eval_returns],
            "knobs": knobs_of(self.agent.cfg),
            "numpy_rng": json.dumps(m.rng.bit_generator.state),
            "torch_rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict, worker: int = 0) -> None:
        """Load one worker's state (the counters are the pack's: its workers step together)."""
        m = self.members[worker]
        self.agent.load_state_dict(state["agent"], worker=worker)
        self.agent.set_knobs(**state["knobs"])
        m.buffer.load_state_dict(state["buffer"])
        self.step, self.updates = int(state["step"]), int(state["updates"])
        self.pretrained, self.update_credit = (
            bool(state["pretrained"]),
            float(state["update_credit"]),
        )
        self.pretrain_updates = int(state.get("pretrain_updates", 0))
        m.eval_returns[:] = [(int(s), float(r)) for s, r in state["eval_returns"]]
        m.forget_album_after(self.step)
        m.rng.bit_generator.state = json.loads(state["numpy_rng"])
        torch.set_rng_state(state["torch_rng"])

    def start_at(self, step: int) -> None:
        """Begin with weights trained elsewhere for `step` agent steps (the merged ones): count
        on from there, with no random seed steps and no pretraining burst; updates begin once
        the first episode is in this trainer's own buffer."""
        self.step, self.pretrained = step, True

    # logging -----------------------------------------------------------------------
    def log_all(self, record: Record) -> None:
        """The same record in every worker's metrics."""
        for m in self.members:
            m.log(record)

    def _evaluate(self) -> None:
        episodes, before = self.cfg.eval_episodes, self.progress.phase_name

        def on_step(done: int) -> None:
            self.progress.phase("evaluating", done, episodes)
            self.progress.show()
            self.hooks.during_evaluation(self)

        on_step(0)
        last: list[tuple] = []  # each worker's last evaluation episode (poses, rewards)
        runs = evaluate(self.agent, self.cfg, episodes, self.eval_seeds, on_step, last)
        for m, returns, (states, rewards) in zip(self.members, runs, last):
            mean = float(np.mean(returns))
            m.eval_returns.append((self.step, mean))
            m.log(Eval(step=self.step, ret=mean, returns=tuple(round(r, 3) for r in returns)))
            m.keep_replay(states, rewards, "eval", self.step, self.step_seconds)
        self.progress.set(eval_return=float(np.mean([m.eval_returns[-1][1] for m in self.members])))
        self.progress.phase(before)

    def _sample(self) -> tuple[torch.Tensor, ...]:
        """One batch per worker, each from its own buffer, stacked on the worker dimension."""
        if len(self.members) == 1:
            return self.buffer.sample()
        parts = [m.buffer.sample() for m in self.members]
        return tuple(torch.stack(tensors) for tensors in zip(*parts))

    def _update(self, count: int) -> None:
        info = None
        for _ in range(count):
            info = self.agent.update(self._sample())
            self.updates += 1
            if not self.pretrained:
                self.pretrain_updates += 1
                self.progress.phase("pretraining", self.pretrain_updates, self._pretrain_total)
                self.progress.show()
            self.hooks.after_update(self)
        if info is not None and time.monotonic() - self._last_train_log > self.log_every_s:
            self._last_train_log = time.monotonic()
            for k, m in enumerate(self.members):
                losses = {name: float(v.view(-1)[k]) for name, v in info.items()}
                rate = self.progress.rate
                m.log(Train(step=self.step, updates=self.updates, steps_per_s=rate, losses=losses))

    # the loop ----------------------------------------------------------------------
    def run(self, hooks: TrainingHooks | None = None) -> dict:
        """Train, calling `hooks` between steps; Ctrl+C (KeyboardInterrupt) or StopTraining
        from a hook stops early. Weights are saved either way."""
        self.hooks = hooks or NoHooks()
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
            if any(m.run_dir is not None for m in self.members):
                self.progress.phase("saving")
                self.progress.show(force=True)
                for k, m in enumerate(self.members):
                    if m.run_dir is not None:
                        save_state(m.run_dir.weights_path, self.agent.state_dict(k))
                self.log_all(Stop(step=self.step, reason="interrupted" if interrupted else "done"))
                for m in self.members:
                    if m.run_dir is not None:
                        m.run_dir.close()
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

    def _act(self, obs: np.ndarray, t0: torch.Tensor) -> np.ndarray:
        """Actions for all envs (P * N, A): random during the seed steps (each worker from its
        own generator), else one plan for every worker."""
        p, n = len(self.members), self.cfg.num_envs
        if self.step < self.cfg.resolved_seed_steps:
            shape = (n, *self.env.single_action_space.shape)
            return np.concatenate([m.rng.uniform(-1, 1, shape) for m in self.members])
        packed = torch.from_numpy(obs).view(p, n, -1)
        return self.agent.act(packed, t0=t0.view(p, n)).reshape(p * n, -1).cpu().numpy()

    def _train(self) -> None:
        cfg, env, n = self.cfg, self.env, self.cfg.num_envs
        seed_steps = cfg.resolved_seed_steps
        obs, info = env.reset(seed=self.env_seeds)
        for k, m in enumerate(self.members):
            m.episodes = [self._new_episode(obs, info, k * n + i) for i in range(n)]
        t0 = torch.ones(len(self.env_seeds), dtype=torch.bool)
        next_eval = (self.step // cfg.eval_every + 1) * cfg.eval_every if cfg.eval_every else None
        if self.pretrain_updates and not self.pretrained:  # resumed from a stop mid-pretraining
            self._pretrain()
        while self.step < cfg.steps:
            action = self._act(obs, t0).astype(np.float32)
            # The envs step (in their processes, where cores allow) while this step's update
            # runs: the reference's order too, whose update does not yet see an episode that
            # ends in this step. Pretraining waits for the step: it sees every seed episode.
            finish_step = start_step(env, action)
            self.step += n
            ready = self.step >= seed_steps and all(m.buffer.can_sample() for m in self.members)
            if ready and self.pretrained:
                knobs = self.agent.cfg  # (n * 1) / s: exactly the one-update credit
                self.update_credit += n * knobs.updates_per_step / knobs.steps_per_update
                count = int(self.update_credit)
                self.update_credit -= count
                self._update(count)
            obs, reward, terminated, truncated, info = finish_step()
            done = terminated | truncated
            for k, m in enumerate(self.members):
                for i, ep in enumerate(m.episodes):
                    j = k * n + i
                    ep.actions.append(action[j])
                    ep.rewards.append(float(reward[j]))
                    if done[j]:
                        ep.obs.append(info["final_obs"][j])
                        ep.add_state(state_at(info.get("final_info", {}), j))
                        self._finish_episode(m, ep, bool(terminated[j]), i)
                        m.episodes[i] = self._new_episode(obs, info, j)
                    else:
                        ep.obs.append(obs[j])
                        ep.add_state(state_at(info, j))
            t0 = torch.from_numpy(done)
            if not self.pretrained and self.step >= seed_steps:
                if all(m.buffer.can_sample() for m in self.members):
                    self._pretrain()
            # Until the first update: random seed steps, or (weights from elsewhere, see
            # start_at) acting while the buffer fills.
            self.progress.phase("training" if self.pretrained else "seeding")
            self.progress.show(self.step)
            if next_eval is not None and self.step >= next_eval:
                next_eval += cfg.eval_every
                self._evaluate()
            self.hooks.after_step(self)

    def _pretrain(self) -> None:
        """The pretraining updates (by default as many as seed steps; those done before a stop
        are not redone)."""
        total = self._pretrain_total = self.cfg.resolved_pretrain_updates
        self.progress.phase("pretraining", self.pretrain_updates, total)
        self.progress.show(self.step, force=True)
        self._update(max(0, total - self.pretrain_updates))
        self.pretrained = True

    @staticmethod
    def _new_episode(obs: np.ndarray, info: dict, j: int) -> EpisodeSoFar:
        """Env j's episode from its first observation (and pose, kept for a replay)."""
        state = state_at(info, j)
        return EpisodeSoFar(obs=[obs[j]], states=None if state is None else [state])

    def _finish_episode(
        self, m: Member, ep: EpisodeSoFar, terminated: bool, env_index: int
    ) -> None:
        m.buffer.add_episode(
            torch.from_numpy(np.stack(ep.obs)),
            torch.from_numpy(np.stack(ep.actions)),
            torch.tensor(ep.rewards),
            terminated,
        )
        ret = float(sum(ep.rewards))
        m.episode_returns.append(ret)
        m.log(
            Episode(
                step=self.step,
                ret=ret,
                length=len(ep.rewards),
                env=env_index,
                terminated=terminated,
            )
        )
        m.keep_replay(ep.replay_states(), ep.rewards, "train", self.step, self.step_seconds)
        self.progress.set(episode_return=ret)
