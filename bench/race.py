"""`bench --race N`: what a race costs and how fast it follows a person's hand, in one live run of
N workers in 2 lanes with the same knobs: the lag of a knob changed for one lane (in agent
steps, the other lane untouched), the lag of a promotion, and the race table's cost in the
window's process while the race runs (its controller rebuilds the table a few times a
second)."""

from __future__ import annotations

import time
from pathlib import Path

from agent.config import Config
from agent.errors import UserError
from viewer.controller import POLL_S
from viewer.model import RunModel
from workers.door import KnobsApplied, Lane, Run, RunSettings, race_of


def race_benchmark(cfg: Config, workers: int, seconds: float, run_dir: str) -> dict:
    settings = RunSettings(workers=workers, merge_every=10**6)
    run = Run.create(run_dir, cfg, settings, lanes=[Lane(), Lane()])
    run.start()
    model = RunModel(workers)

    def steps() -> dict[int, float]:
        return {w["worker"]: w["step"] for w in run.workers.progress()}

    while not all(w["state"] == "training" for w in run.workers.progress()):
        time.sleep(0.5)
        model.ingest(run.new_events())
    lanes = run.race.record().lanes
    changes = []
    for i in range(3):
        time.sleep(seconds / 4)
        changes.append((run.knobs.set(lane=0, horizon=4 if i % 2 == 0 else 3), steps()))
    time.sleep(seconds / 4)
    # The race table as the window's controller builds it, on this run's records so far, while
    # the race runs (after the promotion there would be no lanes left to rank).
    model.ingest(run.new_events())
    record = run.race.record()
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < 2.0:
        table = model.race.table(record, run.workers.progress(), time.time())
        calls += 1
    table_s = (time.perf_counter() - start) / calls
    ranked = 0 if table is None else len(table.rows)
    promoted = run.race.promote(1, weights=False)  # no merge yet: values only
    changes.append((promoted, steps()))
    time.sleep(5)
    events = run.new_events()
    model.ingest(events)
    applied = {(r.worker, r.version): r for r in events if isinstance(r, KnobsApplied)}

    def lags(version: int, at: dict, who: tuple[int, ...]) -> list[int]:
        return [applied[(w, version)].step - at[w] for w in who if (w, version) in applied]

    lane_lags = [lag for v, at in changes[:-1] for lag in lags(v, at, lanes[0])]
    untouched = all(
        applied[(w, v)].values["horizon"] == cfg.horizon
        for v, _ in changes[:-1]
        for w in lanes[1]
        if (w, v) in applied
    )
    promotion_lags = lags(promoted, changes[-1][1], tuple(range(workers)))
    run.stop()
    return {
        "workers": workers,
        "lanes": [list(lane) for lane in lanes],
        "lane_knob_changes": len(changes) - 1,
        "lane_knob_lag_agent_steps_max": max(lane_lags) if lane_lags else None,
        "other_lane_untouched": untouched,
        "promotion_applied_by": len(promotion_lags),
        "promotion_lag_agent_steps_max": max(promotion_lags) if promotion_lags else None,
        "lanes_in_table": ranked,
        "episodes_in_table": sum(len(v) for v in model.race.episodes.values()),
        "race_table_ms": round(table_s * 1000, 3),
        # One rebuild per controller refresh (POLL_S): the share of one core it takes.
        "race_table_core_share": round(table_s / POLL_S, 5),
    }


def race_history(run_dir: str, minutes: list[float]) -> str:
    """`bench --race-table RUN_DIR --at 5,10,20`: the race table of a run as it stood at each
    of those minutes of wall time after the race began, and now, read from its files."""
    path = Path(run_dir)
    run = Run.attach(path)  # reads only
    cfg, record = run.cfg, run.race.record()
    if not record.lanes:
        raise UserError(f"{path} holds no race (its knob record has no lanes)")
    parts = []
    for at in [*minutes, None]:
        title = "at the end" if at is None else f"{at:g} minutes into the race"
        table = race_of(path, record, None, cfg, at_minutes=at)
        parts.append(f"{title}:\n{table or '(no race yet)'}")
    return "\n\n".join(parts)
