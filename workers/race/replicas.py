"""What a race's replicas say together: a figure's mean and 95 % interval across replicas, the
paired lead of one lane over another (replica r of each lane ran on the same environment
seeds), and a lane's mean curve with the band its replicas span. The replicas are the unit
that varies with the seed, so these intervals are what another seed would do; the episodes of
one run only measure episode noise (scores.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Student's t, 97.5th percentile, by degrees of freedom (replicas - 1): the two-sided 95 %
# interval of a mean from a handful of replicas, whose spread is itself estimated. Below 10
# from the table; from 10 on the Cornish-Fisher expansion (Abramowitz and Stegun 26.7.5), within
# 1e-4 of the table there and tending to the normal's 1.96 only as the freedom grows.
T_975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646}
T_975.update({8: 2.3060, 9: 2.2622})
Z_975 = 1.959963984540054


def t_975(df: int) -> float:
    """Student's t 97.5th percentile for `df` >= 1 degrees of freedom."""
    if df < 1:
        raise ValueError(f"Student's t needs at least 1 degree of freedom, got {df}")
    if df in T_975:
        return T_975[df]
    z = Z_975
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(g / df ** (n + 1) for n, g in enumerate(terms))


def across(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of its 95 % t interval) over replicas' values; 0 for one value."""
    array = np.asarray(values, dtype=float)
    if len(array) < 2:
        return float(array.mean()), 0.0
    return float(array.mean()), t_975(len(array) - 1) * float(array.std(ddof=1)) / len(array) ** 0.5


def paired_lead(first: Sequence[float], second: Sequence[float]) -> tuple[float, float]:
    """(mean, 95 % half-width) of replica r's score of `first` less replica r's of `second`:
    pairing takes out what the replicas' environment seeds add to both lanes alike."""
    return across([a - b for a, b in zip(first, second, strict=True)])


def mean_curve(
    curves: Sequence[list[tuple[float, float, float]]],
) -> tuple[list[tuple[float, float, float]], list[tuple[float, float, float]]]:
    """The replicas' mean curve and band from their curves of (seconds, step, value): at every
    time any replica finished an episode (once every replica has one), the mean of each one's
    latest step and value; the band (seconds, lowest, highest) of those values."""
    if not curves or any(not c for c in curves):
        return [], []
    times = np.unique(np.concatenate([[t for t, _, _ in c] for c in curves]))
    times = times[times >= max(c[0][0] for c in curves)]
    steps, values = [], []
    for c in curves:
        own = np.array([t for t, _, _ in c])
        at = np.searchsorted(own, times, side="right") - 1  # each replica's latest episode
        steps.append(np.array([s for _, s, _ in c])[at])
        values.append(np.array([v for _, _, v in c])[at])
    step, value = np.mean(steps, axis=0), np.array(values)
    curve = [(float(t), float(s), float(v)) for t, s, v in zip(times, step, value.mean(axis=0))]
    low, high = value.min(axis=0), value.max(axis=0)
    band = [(float(t), float(lo), float(hi)) for t, lo, hi in zip(times, low, high)]
    return curve, band
