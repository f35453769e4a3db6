"""The published TD-MPC2 learning curves (the authors' CSVs: assets/published/ from states,
assets/published-pixels/ from pixels): the reference this project's learning is compared with,
in the window's chart and in `bench --learning`."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from agent.config import Config

PUBLISHED = Path(__file__).resolve().parents[2] / "assets" / "published"
PUBLISHED_PIXELS = PUBLISHED.with_name("published-pixels")  # their obs=rgb runs


def published_curve(task: str, obs: str = "state") -> tuple[np.ndarray, np.ndarray] | None:
    """(environment steps, mean evaluation return over the seeds at each), sorted by step, of
    the authors' runs from `obs` (state or rgb); None when that curve was not published. The
    CSVs count environment steps (agent steps x the action repeat, 2 in the published runs)."""
    path = (PUBLISHED_PIXELS if obs == "rgb" else PUBLISHED) / f"{task}.csv"
    if not path.exists():
        return None
    by_step: dict[int, list[float]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            by_step.setdefault(int(float(row["step"])), []).append(float(row["reward"]))
    steps = np.array(sorted(by_step), dtype=float)
    return steps, np.array([np.mean(by_step[int(s)]) for s in steps])


# The settings of the published runs that a run may change, as (label, value of a config).
PAPER_SETTINGS = (
    ("model", lambda c: f"{c.model_size}M" if c.model_size else "custom"),
    ("replay buffer", lambda c: c.buffer_size),
    ("action repeat", lambda c: c.action_repeat),
    ("episode length", lambda c: c.episode_length),
    ("seed steps", lambda c: c.resolved_seed_steps),
    ("pretraining updates", lambda c: c.resolved_pretrain_updates),
    ("samples", lambda c: c.num_samples),
    ("elites", lambda c: c.num_elites),
    ("policy trajectories", lambda c: c.num_pi_trajs),
    ("iterations", lambda c: c.iterations or 6),
    ("horizon", lambda c: c.horizon),
    ("batch", lambda c: c.batch_size),
    ("steps per update", lambda c: c.steps_per_update),
    ("updates per step", lambda c: c.updates_per_step),
    ("bf16", lambda c: "on" if c.bf16 else "off"),
)


def paper_differences(cfg: Config) -> list[str]:
    """What a run does differently from the published runs of its task (TD-MPC2's defaults,
    5M), as "name ours (paper theirs)"; [] when nothing differs."""
    paper = Config(task=cfg.task, obs=cfg.obs)
    return [
        f"{label} {value(cfg)} (paper {value(paper)})"
        for label, value in PAPER_SETTINGS
        if value(cfg) != value(paper)
    ]
