"""A lane's score in a race, and how sure it is: its smoothed training return normalised
between the race's starting level (0) and the top (1), averaged over the race's training time,
in the episodes as they were and in bootstrap replicas of them (table.py ranks by it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

SMOOTH = 5  # a worker's return now: the mean of its last SMOOTH episodes
REPLICAS = 100  # bootstrap replicas of each lane's episodes


class LaneEpisodes:
    """One lane's episodes in the race: its smoothed curve and, once normalised, the area under
    it in every bootstrap replica (replica 0: the episodes as they were)."""

    def __init__(
        self,
        workers: tuple[int, ...],
        own: dict[int, list[tuple[float, float, float]]],
        start: float,
        clock: Callable[[np.ndarray], np.ndarray],
    ) -> None:
        """`own`: each worker's (time, step, return) of its episodes in this lane since the
        race's `start`; `clock`: race training seconds at wall times."""
        self.workers = tuple(w for w in workers if own.get(w))
        self.episodes = sum(len(own.get(w, ())) for w in workers)
        events = sorted((t, w, s) for w in self.workers for t, s, _ in own[w])
        order = np.array([w for _, w, _ in events], dtype=int)
        self.times = np.array([t for t, _, _ in events], dtype=float)
        self.clock = clock(self.times) if events else np.zeros(0)
        self.rets = {w: np.array([r for *_, r in own[w]], dtype=float) for w in self.workers}
        # Each worker's newest episode at each of the lane's episodes (-1: none yet).
        self.position = {w: np.cumsum(order == w) - 1 for w in self.workers}
        own_steps = {w: np.array([s for _, s, _ in own[w]], dtype=float) for w in self.workers}
        self.steps = self._mean_over_workers({w: own_steps[w][None, :] for w in self.workers})[0]
        values = self._values(None)
        self.curve = [
            (float(t - start), float(s), float(v))
            for t, s, v in zip(self.times, self.steps, values[0])
        ]
        self.reached: dict[float, tuple[float, float] | None] = {}
        self.area: np.ndarray | None = None  # per replica, up to the last episode
        self.last = np.zeros(1)
        self.last_clock = 0.0

    def _mean_over_workers(self, per_worker: dict[int, np.ndarray]) -> np.ndarray:
        """(R, E): at each lane episode, the mean over the workers seen so far of each one's
        newest value in `per_worker` ((R, n_w) each)."""
        count = next(iter(per_worker.values())).shape[0] if per_worker else 1
        total = np.zeros((count, len(self.times)))
        seen = np.zeros(len(self.times))
        for w, values in per_worker.items():
            position = self.position[w]
            has = position >= 0
            total[:, has] += values[:, position[has]]
            seen += has
        return total / np.maximum(seen, 1)

    def _values(self, rng: np.random.Generator | None) -> np.ndarray:
        """(R, E) the lane's smoothed return at each of its episodes: as they were (rng None),
        or that and REPLICAS residual-bootstrap replicas."""
        return self._mean_over_workers(
            {w: _smoothed(_replicas(self.rets[w], rng)) for w in self.workers}
        )

    def normalise(self, start_level: float, span: float, thresholds: list[float]) -> None:
        """The bootstrap areas under the normalised curve (0: the starting level, 1: the top)
        and the first crossing of each threshold."""
        if not len(self.times):
            self.reached = {level: None for level in thresholds}
            return
        values = (self._values(np.random.default_rng(0)) - start_level) / span
        self.area = (values[:, :-1] * np.diff(self.clock)).sum(axis=1)
        self.last, self.last_clock = values[:, -1], float(self.clock[-1])
        for level in thresholds:
            crossed = next((i for i, (*_, v) in enumerate(self.curve) if v >= level), None)
            self.reached[level] = (
                None
                if crossed is None
                else (float(self.clock[crossed]), float(self.steps[crossed]))
            )

    def score(self, clock: float) -> tuple[float | None, float]:
        """(the mean normalised return over `clock` seconds of race training, its spread:
        twice the bootstrap replicas' standard deviation). Before the lane's first episode it
        is at the starting level, 0."""
        if self.area is None or clock <= 0:
            return None, 0.0
        scores = (self.area + self.last * max(clock - self.last_clock, 0.0)) / clock
        return float(scores[0]), 2 * float(np.std(scores[1:]))


def _replicas(rets: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    """(R, n) a worker's returns: as they were, then (rng given) REPLICAS residual-bootstrap
    replicas: each episode's local trend (the mean of the 5 around it) plus a residual drawn
    from the worker's own, so that learning stays and the episode-to-episode noise is redrawn.
    A residual is taken against the mean of the 4 others (not counting the episode itself,
    which would shrink it), scaled to one episode's noise."""
    if rng is None:
        return rets[None, :]
    window = np.convolve(np.pad(rets, 2, mode="edge"), np.ones(5), mode="valid")
    residuals = (rets - (window - rets) / 4) * np.sqrt(4 / 5)
    trend = window / 5
    draws = trend + residuals[rng.integers(0, len(rets), size=(REPLICAS, len(rets)))]
    return np.vstack([rets[None, :], draws])


def _smoothed(returns: np.ndarray) -> np.ndarray:
    """(R, n) each episode's trailing mean of the last SMOOTH returns (fewer at the start)."""
    sums = np.cumsum(np.pad(returns, ((0, 0), (1, 0))), axis=1)
    index = np.arange(1, returns.shape[1] + 1)
    low = np.maximum(index - SMOOTH, 0)
    return (sums[:, index] - sums[:, low]) / (index - low)


def training_spans(
    onoff: dict[int, list[tuple[float, bool]]], workers: Iterable[int], start: float, now: float
) -> np.ndarray:
    """(K, 2) the stretches of wall time after `start` in which some worker of the race
    trained: a pause or stop of the whole run is left out."""
    spans = []
    for w in workers:
        on, since = True, start
        for t, training in sorted(onoff[w]):
            if t <= start:
                on = training
                continue
            if on and not training:
                spans.append((since, min(t, now)))
            elif training and not on:
                since = t
            on = training
        if on:
            spans.append((since, now))
    merged: list[list[float]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return np.array(merged, dtype=float).reshape(-1, 2)


def wall_at(spans: np.ndarray, seconds: float) -> float | None:
    """The wall time at which the race's training time (race_clock) reached `seconds`, or None
    before it has."""
    total = 0.0
    for a, b in spans:
        if total + (b - a) >= seconds:
            return float(a + (seconds - total))
        total += b - a
    return None


def race_clock(spans: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Seconds of training time from the race's start to each of `times`."""
    if not len(spans):
        return np.zeros_like(times, dtype=float)
    inside = np.clip(times[:, None], spans[:, 0], spans[:, 1]) - spans[:, 0]
    return inside.sum(axis=1)
