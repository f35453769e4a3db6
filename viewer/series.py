"""Chart data without a display: growing series, smoothing, downsampling, published curves.

Charts must stay fast for runs of millions of steps, so what reaches a plot is at most a few
thousand points per line: smoothed on the full data first (so smoothing is honest), then
reduced by min/max buckets (so spikes stay visible).
"""

from __future__ import annotations

import numpy as np

from agent.config import Config
from agent.envs.published import paper_differences
from agent.envs.published import published_curve as read_published

ACTION_REPEAT = 2  # the published CSVs count environment steps


class Series:
    """An append-only (step, wall time, value) series, kept as growing numpy arrays."""

    def __init__(self) -> None:
        self._data = np.empty((64, 3))
        self.size = 0

    def append(self, step: float, wall: float, value: float) -> None:
        if self.size == len(self._data):
            self._data = np.concatenate([self._data, np.empty_like(self._data)])
        self._data[self.size] = (step, wall, value)
        self.size += 1

    def __len__(self) -> int:
        return self.size

    @property
    def steps(self) -> np.ndarray:
        return self._data[: self.size, 0]

    @property
    def walls(self) -> np.ndarray:
        return self._data[: self.size, 1]

    @property
    def values(self) -> np.ndarray:
        return self._data[: self.size, 2]

    def last(self) -> float | None:
        return float(self._data[self.size - 1, 2]) if self.size else None


def smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """Exponential moving average with TensorBoard's debiasing (weight 0: unchanged)."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    if weight == 0.0 or len(values) == 0:
        return np.asarray(values, dtype=float)
    out = np.empty(len(values))
    average, norm = 0.0, 0.0
    for i, v in enumerate(values):
        average = weight * average + (1.0 - weight) * v
        norm = weight * norm + (1.0 - weight)
        out[i] = average / norm
    return out


def downsample(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `max_points` points: the min and the max of equal buckets, in x order."""
    n = len(x)
    if n <= max_points:
        return np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    buckets = max(1, max_points // 2)
    edges = np.linspace(0, n, buckets + 1).astype(int)
    starts = edges[:-1]
    low = np.minimum.reduceat(y, starts)
    high = np.maximum.reduceat(y, starts)
    first_x = x[starts]
    last_x = x[edges[1:] - 1]
    # The min and max of a bucket are drawn at its two ends, in the order they occurred.
    low_first = _argmin_before_argmax(y, edges)
    xs = np.column_stack([first_x, last_x]).ravel()
    ys = np.where(low_first[:, None], np.column_stack([low, high]), np.column_stack([high, low]))
    return xs, ys.ravel()


def _argmin_before_argmax(y: np.ndarray, edges: np.ndarray) -> np.ndarray:
    out = np.empty(len(edges) - 1, dtype=bool)
    for i, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        chunk = y[a:b]
        out[i] = np.argmin(chunk) <= np.argmax(chunk)
    return out


def chart_line(
    series: Series, wall_axis: bool, weight: float, max_points: int, start_time: float = 0.0
) -> tuple[list[float], list[float]]:
    """What a plot line gets: x (agent steps or seconds since start), smoothed, downsampled."""
    x = series.walls - start_time if wall_axis else series.steps
    x, y = downsample(x, smooth(series.values, weight), max_points)
    return x.tolist(), y.tolist()


def published_curve(
    task: str, action_repeat: int = ACTION_REPEAT, obs: str = "state"
) -> tuple[np.ndarray, np.ndarray] | None:
    """The authors' mean evaluation return over seeds from `obs` (state or rgb), if published,
    against the agent steps of a run with this action repeat (the same environment steps)."""
    curve = read_published(task, obs)
    return None if curve is None else (curve[0] / action_repeat, curve[1])


def published_note(cfg: Config, published: bool) -> str:
    """The line under the return chart: what the reference line is and how this run's settings
    differ from those of the published runs."""
    if not published:
        return "no published curve for this task" + (" from pixels" if cfg.obs == "rgb" else "")
    differs = paper_differences(cfg)
    source = " from pixels" if cfg.obs == "rgb" else ""
    text = (
        f"published line: the authors' TD-MPC2 runs{source} (5M, 3 seeds, evaluations, same "
        "env steps)"
    )
    return text + (f"; this run differs: {', '.join(differs)}" if differs else "")
