"""`launch.py bench --learning`: train, then set each evaluation beside the published TD-MPC2
curve (`assets/published/`) at the same environment step."""

from __future__ import annotations

import json

import numpy as np

from agent.config import Config
from agent.envs.published import published_curve
from workers.door import default_run_dir


def compare_with_published(
    task: str, evals: list[tuple[int, float]], action_repeat: int, obs: str = "state"
) -> list[dict]:
    """Each of our evaluations beside the published curve (from `obs`) interpolated at the same
    env step."""
    curve = published_curve(task, obs)
    if curve is None:
        return []
    steps, values = curve
    rows = []
    for agent_step, ret in evals:
        env_step = agent_step * action_repeat
        if env_step > steps[-1]:
            break
        published = float(np.interp(env_step, steps, values))
        rows.append(
            {
                "agent_step": agent_step,
                "env_step": env_step,
                "return": round(ret, 1),
                "published": round(published, 1),
                "ratio": round(ret / published, 2) if published > 0 else None,
            }
        )
    return rows


def learning_benchmark(cfg: Config, run_dir: str | None) -> dict:
    from workers.rundir.directory import RunDir
    from workers.training.trainer import Trainer

    run = RunDir.create(run_dir or default_run_dir(f"learning-{cfg.task}"))
    summary = Trainer(cfg, run).run()
    rows = compare_with_published(cfg.task, summary["eval_returns"], cfg.action_repeat, cfg.obs)
    result = {
        "task": cfg.task,
        "run_dir": str(run.path),
        "evals": summary["eval_returns"],
        "comparison": rows,
    }
    (run.path / "learning.json").write_text(json.dumps(result, indent=2))
    return result
