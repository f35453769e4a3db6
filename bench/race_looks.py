"""A verdict watched: how often a race of two lanes of one setting (an A/A race, 3 replicas)
shows "leads" at some look over 90 minutes, looked at as the window looks (every 0.25 s) and as
the headless printer does (every 5 minutes and at the end), with the verdict re-evaluated at
every look (the table before issue 54) and given once, at the race's end (since).

    TDMPC2_LIVE_NO_BOOTSTRAP=1 .venv/bin/python -m bench.race_looks [--races 400] [--seed 0]

Synthetic races, so that hundreds run in seconds: each worker's episode returns are a learning
curve shared by every lane, plus a seed effect of its own that wanders slowly (an
Ornstein-Uhlenbeck process), plus one its replica's environments give both lanes alike, plus
episode noise. Each look scores every replica as the race table does (workers/race/scores.py:
the smoothed return, 0 at the race's starting level, averaged over the race's training time,
the last value held since the last episode; tests/workers/test_race_replicas.py checks these
scores against the table's own) and calls a lead as the table does: each replica's 10 episodes
first, then the paired lead across the replicas clear of zero by a 95 % Student's t interval.
Prints a Markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np

from viewer.controller import POLL_S
from workers.door import MIN_EPISODES, RACE_TABLE_S, SMOOTH, t_975

REPLICAS, LANES = 3, 2


@dataclass(frozen=True)
class Model:
    """A synthetic race's settings (returns on the race's scale: 0 start, 1 top)."""

    minutes: float = 90.0
    first_episode_s: float = 180.0  # seeding and pretraining before the first episode
    episode_s: float = 80.0  # the CPU demo's 125-step episodes at ~1.6 agent steps/s a worker
    speed_sd: float = 0.1  # workers' episode periods differ by this fraction
    seed_sd: float = 0.08  # a worker's own seed effect, its stationary sd
    seed_wander_s: float = 900.0  # and how slowly it wanders (the OU process's time constant)
    shared_sd: float = 0.08  # a replica's environments' effect on both lanes alike
    noise_sd: float = 0.15  # episode to episode


def worker_episodes(
    rng: np.random.Generator, m: Model, shared: np.ndarray, grid: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(times, returns) of one worker's episodes in seconds from the race's start."""
    period = m.episode_s * (1 + m.speed_sd * rng.standard_normal())
    times = np.arange(m.first_episode_s, m.minutes * 60, max(period, 1.0))
    own = _wander(rng, grid, m.seed_sd, m.seed_wander_s)
    curve = 1 / (1 + np.exp(-(times - 45 * 60) / 600))  # the lanes' common learning curve
    effects = np.interp(times, grid, own + shared)
    return times, curve + effects + m.noise_sd * rng.standard_normal(len(times))


def _wander(rng: np.random.Generator, grid: np.ndarray, sd: float, tau: float) -> np.ndarray:
    """An Ornstein-Uhlenbeck path on `grid` with stationary sd `sd`, time constant `tau`."""
    step = np.diff(grid, prepend=grid[0])
    keep = np.exp(-step / tau)
    path = np.empty(len(grid))
    path[0] = sd * rng.standard_normal()
    for i in range(1, len(grid)):
        path[i] = keep[i] * path[i - 1] + sd * math.sqrt(1 - keep[i] ** 2) * rng.standard_normal()
    return path


def scores(
    times: np.ndarray, returns: np.ndarray, start: float, looks: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A worker's race score at each look (nan before its first episode), and its episodes by
    then: the smoothed return less the starting level, averaged over the time since the race
    began (0 before the first episode), the last value held until the look."""
    sums = np.cumsum(np.concatenate([[0.0], returns]))
    index = np.arange(1, len(returns) + 1)
    low = np.maximum(index - SMOOTH, 0)
    values = (sums[index] - sums[low]) / (index - low) - start
    area = np.concatenate([[0.0], np.cumsum(values[:-1] * np.diff(times))])
    last = np.searchsorted(times, looks, side="right") - 1
    seen = last >= 0
    at = np.maximum(last, 0)
    held = area[at] + values[at] * (looks - times[at])
    return np.where(seen, held / np.maximum(looks, 1e-9), np.nan), last + 1


def leads_at(race: list[tuple[np.ndarray, np.ndarray]], looks: np.ndarray) -> np.ndarray:
    """Whether the table would say "lane X leads" at each look (the test at every look)."""
    start = float(np.mean([returns[0] for _, returns in race]))  # the first episodes' level
    scored = [scores(times, returns, start, looks) for times, returns in race]
    score = np.array([s for s, _ in scored]).reshape(LANES, REPLICAS, -1)
    episodes = np.array([n for _, n in scored])
    diffs = score[0] - score[1]  # replica by replica (paired)
    mean, sd = diffs.mean(0), diffs.std(0, ddof=1)
    clear = np.abs(mean) - t_975(REPLICAS - 1) * sd / math.sqrt(REPLICAS) > 0
    return clear & (episodes.min(0) >= MIN_EPISODES)


def a_a_race(rng: np.random.Generator, m: Model) -> list[tuple[np.ndarray, np.ndarray]]:
    """Two lanes of one setting, REPLICAS each: lane l's replica r is race[l * REPLICAS + r]."""
    grid = np.arange(0.0, m.minutes * 60 + 60, 30.0)
    shared = [_wander(rng, grid, m.shared_sd, m.seed_wander_s) for _ in range(REPLICAS)]
    return [worker_episodes(rng, m, shared[r], grid) for _ in range(LANES) for r in range(REPLICAS)]


def watched(races: int, seed: int = 0, m: Model = Model()) -> dict:
    """The share of A/A races that show "leads" at some look, for each look frequency: with
    the verdict at every look (`every_look`) and once, at the race's end (`at_the_end`)."""
    rng = np.random.default_rng(seed)
    end = m.minutes * 60
    frequencies = {"window": POLL_S, "headless printer": RACE_TABLE_S}
    looks = {
        name: np.append(np.arange(every, end, every), end) for name, every in frequencies.items()
    }
    counts = {name: 0 for name in frequencies}
    at_end = 0
    for _ in range(races):
        race = a_a_race(rng, m)
        for name, times in looks.items():
            counts[name] += bool(leads_at(race, times).any())
        at_end += bool(leads_at(race, np.array([end]))[0])
    return {
        "races": races,
        "every_look": {name: counts[name] / races for name in frequencies},
        "looks": {name: len(times) for name, times in looks.items()},
        "at_the_end": at_end / races,
    }


def _interval(p: float, n: int) -> str:
    half = 1.96 * math.sqrt(max(p * (1 - p), 1e-12) / n)
    return f"{100 * p:.1f} % (+- {100 * half:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--races", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    began = time.perf_counter()
    found = watched(args.races, args.seed)
    n = found["races"]
    print(
        f"{n} synthetic A/A races of 90 minutes, 3 replicas ({time.perf_counter() - began:.0f} s)"
    )
    print("| looked at as | looks | verdict at every look (before) | verdict at the end (since) |")
    print("|---|---|---|---|")
    for name, rate in found["every_look"].items():
        after = _interval(found["at_the_end"], n)
        print(f"| {name} | {found['looks'][name]} | {_interval(rate, n)} | {after} |")


if __name__ == "__main__":
    main()
