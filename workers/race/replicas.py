"""What a race's replicas say together: a figure's mean and 95 % interval across replicas, the
paired lead of one lane over another (replica r of each lane ran on the same environment
seeds), and a lane's mean curve with the band its replicas span. The replicas are the unit
that varies with the seed, so these intervals are what another seed would do; the episodes of
one run only measure episode noise (scores.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Student's t, 97.5th percentile, by degrees of freedom (replicas - 1): the two-sided 95 %
# interval of a mean from a handful of replicas, whose spread is itself estimated.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}
T_975.update({9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042})


def t_975(df: int) -> float:
    """Student's t 97.5th percentile for `df` >= 1 degrees of freedom (a table: the nearest
    smaller entry, which errs wide; 1.96 from 60 on)."""
    if df >= 60:
        return 1.96
    return T_975[max(k for k in T_975 if k <= df)]


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
