"""The published TD-MPC2 learning curves (assets/published/, the authors' CSVs): the reference
this project's learning is compared with, in the window's chart and in `bench --learning`."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

PUBLISHED = Path(__file__).resolve().parent.parent / "assets" / "published"


def published_curve(task: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(environment steps, mean evaluation return over the seeds at each), sorted by step;
    None when the task's curve was not published. The CSVs count environment steps (agent
    steps x the action repeat, 2 in the published runs)."""
    path = PUBLISHED / f"{task}.csv"
    if not path.exists():
        return None
    by_step: dict[int, list[float]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            by_step.setdefault(int(float(row["step"])), []).append(float(row["reward"]))
    steps = np.array(sorted(by_step), dtype=float)
    return steps, np.array([np.mean(by_step[int(s)]) for s in steps])
