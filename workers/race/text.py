"""The race table as text: the command line's table and its summary lines, the cells the
window draws, and a run's race read from its files."""

from __future__ import annotations

import time
from pathlib import Path

from agent.config import Config
from agent.envs.published import published_curve
from agent.knobs import knob_text
from workers.race.rows import Gain, LaneRow, RaceTable
from workers.race.table import RaceTracker
from workers.rundir.paths import metrics_name
from workers.rundir.records import KnobRecord, Train, parse_records


def race_text(table: RaceTable) -> str:
    """The table as plain text (the command line's, BENCHMARKS.md)."""
    levels = table.thresholds
    head = ["lane", "knobs", "workers", "steps/worker", "steps/s", "return", "eval (n)"]
    head += ["score", *(f"to {level_text(level)}" for level in levels)]
    head += ["replicas' scores"] * (table.replicas > 1) + [""]
    lines = [head]
    for row in table.rows:
        cells = row_cells(row) + [reached_text(row, level) for level in levels]
        cells += [replica_text(row)] * (table.replicas > 1)
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
    parts = [f"{k}={knob_text(v)}" for k, v in row.knobs.items()] + (
        [] if row.merges else ["merge=off"]
    )
    return ",".join(parts) or "-"


def score_text(row: LaneRow) -> str:
    return "-" if row.score is None else f"{row.score:.2f} +- {row.spread:.2f}"


def replica_text(row: LaneRow) -> str:
    """Each replica's score, "0.41 0.55 0.60" ("-" for one not scored yet)."""
    return " ".join("-" if s is None else f"{s:.2f}" for s in row.replica_scores)


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
    steps = f" +- {gain.steps_spread:.2f}" if gain.steps_spread else ""
    time_ = f" +- {gain.time_spread:.2f}" if gain.time_spread else ""
    if steps or time_:
        return f"{more}{gain.steps:.2f}{steps}x steps, {more}{gain.time:.2f}{time_}x time"
    return f"{more}{gain.steps:.1f}x steps, {more}{gain.time:.1f}x time"


def summary_lines(table: RaceTable, short: bool = False) -> list[str]:
    """The verdict, what the score means (`short`: in brief, as the window says it beside a
    tooltip), seeding and pretraining, lanes of different sizes and the merge gain, a line
    each."""
    lines = [table.verdict]
    if table.ended and table.replicas > 1:
        lines.append(
            f"the race ended at {clock_text(table.clock)} of training (its length, or every "
            "lane's steps): the table as it stood then"
        )
    if table.start_level is not None and table.top is not None:
        top = "published final" if table.top_from == "published" else "best lane"
        if table.top_note and not short:
            top += f"; {table.top_note}"
        scale = f"0 = start {table.start_level:.1f}, 1 = {table.top:.1f} ({top})"
        spread = (
            f"the mean over {table.replicas} replicas +- its 95 % interval (Student's t)"
            if table.replicas > 1
            else "+- about 95 % of a bootstrap over one run's episodes (not over seeds)"
        )
        if short:
            lines.append(f"score: {scale}; mean over {clock_text(table.clock)} of training")
        else:
            lines.append(
                f"score: the smoothed training return, {scale}, averaged over "
                f"{clock_text(table.clock)} of training (pauses and stops left out); {spread}; "
                "to X: training time, agent steps per worker"
            )
    if table.warmup is not None:
        lines.append(f"of which seeding and pretraining: {clock_text(table.warmup)}, every lane")
    if table.note:
        lines.append(table.note)
    if table.replicas > 1 and not short:  # the figures behind each mean "to X"
        for row in sorted(table.rows, key=lambda r: r.lane):
            each = "; ".join(
                f"to {level_text(level)}: "
                + ", ".join(_reach(reached.get(level)) for reached in row.replica_reached)
                for level in table.thresholds
            )
            lines.append(f"lane {row.lane}, replica by replica: {each}")
    if table.control is not None:
        for row in table.rows:
            if row.merges and row.gain:
                gains = "; ".join(
                    f"to {level_text(level)}: {gain_text(gain)}" for level, gain in row.gain.items()
                )
                lines.append(f"merge gain of lane {row.lane} over lane {table.control}: {gains}")
    return lines


def _reach(reached: tuple[float, float] | None) -> str:
    return "-" if reached is None else f"{clock_text(reached[0])} ({reached[1]:.0f} steps)"


def clock_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


# The published runs' episodes: 500 agent steps at action repeat 2, the task's 1000 control
# steps. A return sums the rewards of every control step (rewards add up across a repeat), so
# the published final is reachable in any run whose episodes span as many control steps.
PUBLISHED_ACTION_REPEAT, PUBLISHED_EPISODE = 2, 500


def race_top(cfg: Config) -> tuple[float | None, str]:
    """The top of a race's scale from the task's published final return, when the run's
    episodes span the published ones' control steps (else None: the best lane's level), and
    why it is not used when the task has one."""
    curve = published_curve(cfg.task, cfg.obs)
    if curve is None:
        return None, ""
    final = float(curve[1][-1])
    published = PUBLISHED_ACTION_REPEAT * PUBLISHED_EPISODE
    if cfg.action_repeat * cfg.episode_length == published:
        return final, ""
    return None, (
        f"the published final {final:.1f} is for episodes of {published} control steps; this "
        f"run's are {cfg.action_repeat * cfg.episode_length} ({cfg.episode_length} agent steps at "
        f"action repeat {cfg.action_repeat})"
    )


def race_of(
    path: Path,
    record: KnobRecord,
    progress: list[dict] | None,
    cfg: Config,
    at_minutes: float | None = None,
) -> str:
    """The race table of the run in `path` (config `cfg`) as text, read from its files (""
    outside a race). `at_minutes`: as it stood that many minutes of wall time after the race
    began (only the records written by then; steps and steps/s from them when `progress` is
    None)."""
    if not record.lanes:
        return ""
    published, note = race_top(cfg)
    seed_steps = cfg.resolved_seed_steps
    records = []
    for worker in sorted({w for lane in record.lanes for w in lane}):
        try:
            records += parse_records((path / metrics_name(worker)).read_bytes(), worker)[0]
        except OSError:
            continue  # a worker without a file yet: no row data
    now = time.time()
    if at_minutes is not None:
        everything = RaceTracker(published, seed_steps, note)
        everything.ingest(records)
        start = everything.start_time(record)
        if start is None:
            return ""
        now = start + 60 * at_minutes
        records = [r for r in records if r.time <= now]
    tracker = RaceTracker(published, seed_steps, note)
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
