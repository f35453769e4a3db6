"""The race table as text: the command line's table and its summary lines, the cells the
window draws, and a run's race read from its files."""

from __future__ import annotations

import time
from pathlib import Path

from agent.envs.published import published_curve
from workers.race.table import Gain, LaneRow, RaceTable, RaceTracker
from workers.rundir.paths import metrics_name
from workers.rundir.records import KnobRecord, Train, parse_records


def race_text(table: RaceTable) -> str:
    """The table as plain text (the command line's, BENCHMARKS.md)."""
    levels = table.thresholds
    head = ["lane", "knobs", "workers", "steps/worker", "steps/s", "return", "eval (n)"]
    head += ["score", *(f"to {level_text(level)}" for level in levels), ""]
    lines = [head]
    for row in table.rows:
        cells = row_cells(row) + [reached_text(row, level) for level in levels]
        cells.append("leads" if row.leader else "")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    text += [f"  {line}" for line in summary_lines(table)]
    return "\n".join(text)


def row_cells(row: LaneRow) -> list[str]:
    """A row's cells up to its thresholds: lane, knobs, workers, steps and steps/s per worker,
    return, evaluation (episodes), score."""
    return [
        str(row.lane),
        lane_knobs(row),
        str(len(row.workers)),
        f"{row.steps:,.0f}",
        f"{row.steps_per_s:.2f}",
        "-" if row.ret is None else f"{row.ret:.1f}",
        "-" if row.eval_ret is None else f"{row.eval_ret:.1f} ({row.eval_episodes})",
        score_text(row),
    ]


def lane_knobs(row: LaneRow) -> str:
    parts = [f"{k}={v}" for k, v in row.knobs.items()] + ([] if row.merges else ["merge=off"])
    return ",".join(parts) or "-"


def score_text(row: LaneRow) -> str:
    return "-" if row.score is None else f"{row.score:.2f} +- {row.spread:.2f}"


def reached_text(row: LaneRow, level: float, unit: str = " steps") -> str:
    """When the lane first reached `level`, "m:ss, N steps" ("-": not yet)."""
    reached = row.reached.get(level)
    if reached is None:
        return "-"
    return f"{clock_text(reached[0])}, {reached[1]:.0f}{unit}"


def level_text(level: float) -> str:
    """A threshold as a column's name: whole numbers from 100 up (returns of hundreds)."""
    return f"{level:.0f}" if abs(level) >= 100 else f"{level:g}"


def gain_text(gain: Gain | None) -> str:
    if gain is None:
        return "not yet"
    more = ">" if gain.at_least else ""
    return f"{more}{gain.steps:.1f}x steps, {more}{gain.time:.1f}x time"


def summary_lines(table: RaceTable, short: bool = False) -> list[str]:
    """The verdict, what the score means (`short`: in brief, as the window says it beside a
    tooltip), seeding and pretraining, lanes of different sizes and the merge gain, a line
    each."""
    lines = [table.verdict]
    if table.start_level is not None and table.top is not None:
        top = "published final" if table.top_from == "published" else "best lane"
        scale = f"0 = start {table.start_level:.1f}, 1 = {table.top:.1f} ({top})"
        if short:
            lines.append(f"score: {scale}; mean over {clock_text(table.clock)} of training")
        else:
            lines.append(
                f"score: the smoothed training return, {scale}, averaged over "
                f"{clock_text(table.clock)} of training (pauses and stops left out); +- about "
                "95 % of a bootstrap over episodes; to X: training time, agent steps per worker"
            )
    if table.warmup is not None:
        lines.append(f"of which seeding and pretraining: {clock_text(table.warmup)}, every lane")
    if table.note:
        lines.append(table.note)
    if table.control is not None:
        for row in table.rows:
            if row.merges and row.gain:
                gains = "; ".join(
                    f"to {level_text(level)}: {gain_text(gain)}" for level, gain in row.gain.items()
                )
                lines.append(f"merge gain of lane {row.lane} over lane {table.control}: {gains}")
    return lines


def clock_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def race_of(
    path: Path,
    record: KnobRecord,
    progress: list[dict] | None,
    task: str,
    seed_steps: int | None = None,
    at_minutes: float | None = None,
) -> str:
    """The race table of the run in `path` as text, read from its files ("" outside a race).
    `at_minutes`: as it stood that many minutes of wall time after the race began (only the
    records written by then; steps and steps/s from them when `progress` is None)."""
    if not record.lanes:
        return ""
    curve = published_curve(task)
    published = float(curve[1][-1]) if curve is not None else None
    records = []
    for worker in sorted({w for lane in record.lanes for w in lane}):
        try:
            records += parse_records((path / metrics_name(worker)).read_bytes(), worker)[0]
        except OSError:
            continue  # a worker without a file yet: no row data
    now = time.time()
    if at_minutes is not None:
        everything = RaceTracker(published, seed_steps)
        everything.ingest(records)
        start = everything.start_time(record)
        if start is None:
            return ""
        now = start + 60 * at_minutes
        records = [r for r in records if r.time <= now]
    tracker = RaceTracker(published, seed_steps)
    tracker.ingest(records)
    table = tracker.table(record, progress or progress_of(records), now)
    return "" if table is None else race_text(table)


def progress_of(records: list) -> list[dict]:
    """Each worker's step and steps/s as its records last said (for a table read later)."""
    last: dict[int, dict] = {}
    for r in records:
        row = last.setdefault(r.worker, {"worker": r.worker, "step": 0.0, "steps_per_s": 0.0})
        row["step"] = max(row["step"], float(r.step or 0))
        if isinstance(r, Train):
            row["steps_per_s"] = r.steps_per_s
    return list(last.values())
