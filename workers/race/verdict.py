"""What a race's rows say: who leads (a paired lead across replicas clear of zero; with one
replica, nobody), and each merging lane's gain over the lane that never merges, replica by
replica, then their mean and spread."""

from __future__ import annotations

import math

import numpy as np

from workers.race.replicas import across, paired_lead
from workers.race.rows import Gain, LaneRow

MIN_EPISODES = 10  # each lane's, before a leader is named: a spread from fewer is not trusted


def mean_reached(reached: list[dict], level: float) -> tuple[float, float] | None:
    """When a lane first reached `level`: the mean over its replicas once every one has."""
    each = [own.get(level) for own in reached]
    if not each or None in each:
        return None
    return float(np.mean([t for t, _ in each])), float(np.mean([s for _, s in each]))


def gains(rows: list[LaneRow], control: int, thresholds: list[float], clock: float) -> None:
    """Each merging lane's gain over the never-merging lane `control` at each threshold:
    replica r against the control's replica r, then the mean and spread across replicas."""
    reference = rows[control]  # rows are in lane order until ranked
    for row in rows:
        if not row.merges:
            continue
        for level in thresholds:
            each = [
                _gain(mine.get(level), theirs.get(level), steps, clock)
                for mine, theirs, steps in zip(
                    row.replica_reached, reference.replica_reached, reference.replica_steps
                )
            ]
            if not each or None in each:
                row.gain[level] = None
                continue
            steps, steps_spread = across([g.steps for g in each])
            time, time_spread = across([g.time for g in each])
            at_least = any(g.at_least for g in each)
            row.gain[level] = Gain(steps, time, at_least, steps_spread, time_spread)


def _gain(
    mine: tuple[float, float] | None,
    theirs: tuple[float, float] | None,
    their_steps: float,
    clock: float,
) -> Gain | None:
    """One replica's gain: its (seconds, steps) to a level against the control's."""
    if mine is None:
        return None
    seconds, steps = mine
    if theirs is not None:
        return Gain(theirs[1] / max(steps, 1.0), theirs[0] / max(seconds, 1e-9))
    # Not there yet: the control has needed at least what it has done so far.
    return Gain(their_steps / max(steps, 1.0), clock / max(seconds, 1e-9), at_least=True)


def verdict(
    rows: list[LaneRow], replicas: int, ended: bool = True, end: str = ""
) -> tuple[str, tuple[float, float] | None]:
    """Who leads, or why nobody does, and the first lane's lead over the second. With
    replicas a lane leads when its lead, replica by replica, is clear of zero at 95 %
    (Student's t across replicas); one run's episodes only measure episode noise, so with one
    replica no lane leads. The verdict is given once, at the race's end (`ended`): a 95 % test
    looked at every few seconds would call a race of equal lanes at some look far more often
    than 5 % (BENCHMARKS.md, "A verdict watched"); before it, the first lane is only ahead so
    far, and `end` says when the verdict comes."""
    ranked = [row for row in rows if row.score is not None]
    if len(rows) < 2:
        return "one lane: nothing to race against", None
    few = any(min(row.replica_episodes, default=0) < MIN_EPISODES for row in rows)
    if len(ranked) < len(rows) or few:
        each = " each replica" if replicas > 1 else ""
        return f"too early to call: {MIN_EPISODES} episodes a lane{each} first", None
    first, second = ranked[0], ranked[1]
    if replicas == 1:
        lead = (first.score - second.score, math.hypot(first.spread, second.spread))
        return (
            f"lane {first.lane} ahead by {lead[0]:.2f} +- {lead[1]:.2f} (one run's episode "
            "noise): seeds decide, race replicas to name a leader (--replicas 3)",
            lead,
        )
    lead = paired_lead(first.replica_scores, second.replica_scores)
    paired = f"{lead[0]:+.2f} +- {lead[1]:.2f} over lane {second.lane}, paired across {replicas}"
    if not ended:
        return f"lane {first.lane} ahead so far: {paired} replicas; {end}", lead
    if lead[0] - lead[1] > 0:
        first.leader = True
        return f"lane {first.lane} leads: {paired} replicas", lead
    return f"too close to call: lane {first.lane}'s lead, {paired} replicas, includes 0", lead
