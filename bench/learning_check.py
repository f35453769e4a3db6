"""The CI learning check's curve (tests/workers/test_learning.py): cartpole-balance at the CPU
demo's settings, one agent, with an evaluation every `--eval-every` agent steps. The test and
this command share `check_config`, so the figures in BENCHMARKS.md are the test's setting.

    python -m bench.learning_check --seeds 1,2,3 --steps 2000 --eval-every 250
    python -m bench.learning_check --seeds 1,2 --steps 3000 --eval-every 250 --obs rgb

Each seed trains in a process of its own with one torch thread, all side by side; one JSON line
per seed: its evaluations (agent step, mean return of 2 episodes, minutes since it started),
each also printed as it comes.
`--obs rgb`: the same from pixels (64x64 frames, the last 3 stacked)."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time

import torch

from agent.config import Config, make_config

# The CPU demo's settings (workers/cli/presets.py), reduced planning.
DEMO = dict(action_repeat=8, episode_length=125, seed_steps=250, pretrain_updates=100)
PLANNING = dict(num_samples=128, num_elites=16, num_pi_trajs=8, iterations=2)


def check_config(seed: int, steps: int, eval_every: int = 0, obs: str = "state") -> Config:
    """The learning check's configuration; `eval_every` 0: one evaluation, at the end."""
    return make_config(
        1,
        task="cartpole-balance",
        device="cpu",
        seed=seed,
        steps=steps,
        **DEMO,
        **PLANNING,
        eval_every=eval_every,
        eval_episodes=2,
        obs=obs,
    )


class EvalClock:
    """Training hooks that note the minutes since the start at each evaluation, and print it
    as it comes (a run of hours keeps what it measured if it is stopped)."""

    def __init__(self, seed: int) -> None:
        self.seed, self.start, self.minutes = seed, time.monotonic(), []

    def after_step(self, trainer) -> None:
        while len(self.minutes) < len(trainer.eval_returns):
            self.minutes.append(round((time.monotonic() - self.start) / 60, 1))
            step, ret = trainer.eval_returns[len(self.minutes) - 1]
            line = {"seed": self.seed, "eval": [int(step), round(ret, 1), self.minutes[-1]]}
            print(json.dumps(line), flush=True)

    def after_update(self, trainer) -> None:
        pass

    def during_evaluation(self, trainer) -> None:
        pass


def curve(seed: int, steps: int, eval_every: int, obs: str = "state") -> dict:
    from workers.training.trainer import Trainer

    torch.set_num_threads(1)
    clock = EvalClock(seed)
    trainer = Trainer(check_config(seed, steps, eval_every, obs), progress=False)
    summary = trainer.run(clock)
    clock.after_step(trainer)  # the last evaluation, after the last step
    evals = [
        [int(s), round(r, 1), m]
        for (s, r), m in zip(summary["eval_returns"], clock.minutes, strict=True)
    ]
    return {"seed": seed, "obs": obs, "evals": evals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    parser.add_argument("--steps", type=int, default=2000, help="agent steps per seed")
    parser.add_argument("--eval-every", type=int, default=250, help="agent steps")
    parser.add_argument("--obs", default="state", choices=("state", "rgb"))
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    with mp.get_context("spawn").Pool(len(seeds)) as pool:
        jobs = [pool.apply_async(curve, (s, args.steps, args.eval_every, args.obs)) for s in seeds]
        for job in jobs:
            print(json.dumps(job.get()), flush=True)


if __name__ == "__main__":
    main()
