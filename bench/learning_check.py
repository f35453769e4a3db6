"""The CI learning check's curve (tests/workers/test_learning.py): cartpole-balance at the CPU
demo's settings, one agent, with an evaluation every `--eval-every` agent steps. The test and
this command share `check_config`, so the figures in BENCHMARKS.md are the test's setting.

    python -m bench.learning_check --seeds 1,2,3 --steps 2000 --eval-every 250

Each seed trains in a process of its own with one torch thread, all side by side; one JSON line
per seed: its evaluations (agent step, mean return of 2 episodes)."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp

import torch

from agent.config import Config, make_config

# The CPU demo's settings (workers/cli/presets.py), reduced planning.
DEMO = dict(action_repeat=8, episode_length=125, seed_steps=250, pretrain_updates=100)
PLANNING = dict(num_samples=128, num_elites=16, num_pi_trajs=8, iterations=2)


def check_config(seed: int, steps: int, eval_every: int = 0) -> Config:
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
    )


def curve(seed: int, steps: int, eval_every: int) -> dict:
    from workers.training.trainer import Trainer

    torch.set_num_threads(1)
    summary = Trainer(check_config(seed, steps, eval_every), progress=False).run()
    return {"seed": seed, "evals": [[int(s), round(r, 1)] for s, r in summary["eval_returns"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    parser.add_argument("--steps", type=int, default=2000, help="agent steps per seed")
    parser.add_argument("--eval-every", type=int, default=250, help="agent steps")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    with mp.get_context("spawn").Pool(len(seeds)) as pool:
        jobs = [pool.apply_async(curve, (s, args.steps, args.eval_every)) for s in seeds]
        for job in jobs:
            print(json.dumps(job.get()), flush=True)


if __name__ == "__main__":
    main()
