"""The CI learning check: a small agent must clearly learn cartpole-balance within a bounded
number of steps. Thresholds come from measurements (BENCHMARKS.md "The CI learning check"): a
random policy scores about 300-390 on this task and the untrained planner 300-450. At step 4500,
where the check used to look, the return is mid-climb and swings from seed to seed (420-736 in
six runs); at step 6000 the three runs measured scored 701 (this test's own run), 824 and 871, so
the check trains 6000 steps and the bar sits at 550: 100 above anything an untrained agent
scored, 150 below the lowest learned score."""

import numpy as np
import pytest

from agent.config import make_config
from agent.envs import make_env
from workers.training.trainer import Trainer

STEPS = 6000
THRESHOLD = 550.0


def random_policy_return(episodes: int = 3) -> float:
    env = make_env("cartpole-balance", seed=123)
    rng = np.random.default_rng(0)
    returns = []
    for i in range(episodes):
        env.reset(seed=123 + i)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(rng.uniform(-1, 1, 1))
            total, done = total + reward, terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


@pytest.mark.slow
def test_agent_learns_cartpole_balance(tmp_path):
    assert random_policy_return() < THRESHOLD - 100, (
        "the threshold must be out of a random policy's reach"
    )
    cfg = make_config(
        1,
        task="cartpole-balance",
        device="cpu",
        seed=1,
        steps=STEPS,
        seed_steps=1000,
        num_samples=128,
        num_elites=16,
        num_pi_trajs=8,
        iterations=2,
        eval_every=0,
        eval_episodes=2,
    )
    summary = Trainer(cfg, run_dir=None, progress=False).run()
    seeded = cfg.resolved_seed_steps
    # The reference's schedule: as many updates as seed steps at once, then one per
    # steps_per_update agent steps.
    assert summary["steps"] == STEPS
    assert summary["updates"] == seeded + (STEPS - seeded) // cfg.steps_per_update
    final_return = summary["eval_returns"][-1][1]
    assert final_return > THRESHOLD, f"eval return {final_return:.1f} after {STEPS} steps"
