"""The race: its table (one row per lane, best first: knobs that differ, workers, agent steps
and steps/s per worker, the smoothed return now, the latest evaluation, the score with its
spread, and for each threshold the training time and agent steps per worker a lane needed, with
a merging lane's gain over a lane that never merges), the verdict and what the numbers mean,
the promote action, and the dialog that starts a race from a running run.
The table comes ranked in the view (workers/race/table.py); nothing here computes it.
"""

from __future__ import annotations

from collections.abc import Callable

import dearpygui.dearpygui as dpg

from agent.errors import ConfigError
from viewer.controller import Controller
from viewer.panels import TextStyles, data_table
from viewer.view import View
from workers.door import (
    MAX_LANES,
    Promote,
    RaceTable,
    StartRace,
    level_text,
    parse_lane,
    reached_text,
    row_cells,
    summary_lines,
)

COLUMNS = ("", "lane", "knobs", "workers", "steps", "steps/s", "return", "eval (n)", "score")
THRESHOLDS = 3  # the race table's threshold columns (workers/race/table.py FRACTIONS)


class RacePanel:
    def __init__(
        self, controller: Controller, styles: TextStyles, relayout: Callable[[], None]
    ) -> None:
        self.controller = controller
        self.styles = styles
        self.relayout = relayout  # the table's height steers the charts' heights
        self.rows = 0  # table rows built (lanes)
        self.lines = 0  # text lines the race takes below the charts (for the layout)
        self.shown = False
        self.table: RaceTable | None = None  # the last shown (promotion takes its best replica)

    def build(self) -> None:
        with dpg.group(tag="race", show=False):
            dpg.add_spacer(height=4)
            with dpg.group(horizontal=True):
                dpg.add_text("Race", tag="race_title")
                self.styles.bind("race_title", "accent")
                dpg.add_text("", tag="race_sharing", wrap=0)
                self.styles.bind("race_sharing", "muted")
            data_table("race_table", COLUMNS, fit=True)  # the knobs and score whole
            for n in range(THRESHOLDS):
                dpg.add_table_column(label="", tag=f"race_threshold_{n}", parent="race_table")
            with dpg.group(horizontal=True):
                dpg.add_combo([], tag="promote_lane", width=90)
                dpg.add_button(label="Promote lane", tag="promote", callback=self._promote)
                dpg.add_checkbox(
                    label="with its weights", tag="promote_weights", default_value=True
                )
                with dpg.tooltip("promote"):
                    dpg.add_text(
                        "The lane's knob values for every worker, and (with its weights) its\n"
                        "merged weights, or a lane that never merged its first worker's, in\n"
                        "place of every other worker's (with replicas: its best-scoring\n"
                        "replica's). The lanes become one merge pool again; without its\n"
                        "weights the next merge averages every worker's."
                    )
                dpg.add_text("", tag="race_verdict")
                self.styles.bind("race_verdict", "accent")
                with dpg.tooltip("race_verdict"):
                    dpg.add_text(
                        "score: each lane's smoothed training return, 0 at the race's starting\n"
                        "level and 1 at the top (the task's published final return, else the\n"
                        "best lane's), averaged over the race's training time (pauses and stops\n"
                        "left out; before its first episode a lane is at 0). With replicas: the\n"
                        "mean over them +- a 95 % interval, and a lane leads when its lead over\n"
                        "the second, replica by replica, is clear of 0 (paired t). One replica:\n"
                        "+- a bootstrap over its episodes, and no lane leads (seeds decide).\n"
                        "to X: the training time and agent steps per worker a lane needed to\n"
                        "first reach X."
                    )
            dpg.add_text("", tag="race_summary", wrap=0)
            self.styles.bind("race_summary", "muted")

    def build_dialog(self) -> None:
        """The window that starts a race from the running run (outside the main window)."""
        with dpg.window(
            label="Start a race", tag="race_dialog", show=False, modal=True, pos=(380, 200)
        ):
            dpg.add_text(
                "The run's workers are split into lanes (workers=N gives a lane its size; the\n"
                "others share the rest evenly); each lane starts from the merged weights,\n"
                "merges only with itself (merge=off: its workers never merge, the control of\n"
                "a merging experiment) and runs its own knobs.",
            )
            dpg.add_combo(
                [str(n) for n in range(2, MAX_LANES + 1)],
                label="lanes",
                tag="race_lanes",
                default_value="2",
                callback=self._show_lane_fields,
                width=60,
            )
            for n in range(MAX_LANES):
                dpg.add_input_text(
                    label=f"lane {n}",
                    tag=f"race_lane_{n}",
                    hint="e.g. workers=3,iterations=2 or workers=1,merge=off (empty: as the run)",
                    show=n < 2,
                    width=380,
                )
            dpg.add_input_int(
                label="replicas",
                tag="race_replicas",
                default_value=1,
                width=100,
            )
            with dpg.tooltip("race_replicas"):
                dpg.add_text(
                    "Every lane this many times, each copy its own workers and merge pool: a\n"
                    "lane leads only when its lead holds across the replicas (the workers must\n"
                    "be the lanes' sizes times the replicas)."
                )
            dpg.add_input_float(
                label="verdict at (min)",
                tag="race_minutes",
                default_value=90.0,
                format="%.0f",
                step=0,
                width=100,
            )
            with dpg.tooltip("race_minutes"):
                dpg.add_text(
                    "The race's length in training time. Until then the table says which lane\n"
                    "is ahead so far; then it gives its verdict once (a lane leads, or too close\n"
                    "to call): re-judged at every look, a race of equal lanes would be called\n"
                    "far more often than 5 % of the time."
                )
            dpg.add_text("", tag="race_error", wrap=480)
            self.styles.bind("race_error", "danger")
            with dpg.group(horizontal=True):
                dpg.add_button(label="Start race", tag="race_start", callback=self._start)
                dpg.add_button(label="Cancel", callback=lambda: dpg.hide_item("race_dialog"))

    def show_dialog(self, *_) -> None:
        dpg.set_value("race_error", "")
        dpg.show_item("race_dialog")

    def typing(self) -> bool:
        return dpg.is_item_shown("race_dialog")

    def _show_lane_fields(self, *_) -> None:
        count = int(dpg.get_value("race_lanes"))
        for n in range(MAX_LANES):
            dpg.configure_item(f"race_lane_{n}", show=n < count)

    def _start(self, *_) -> None:
        count = int(dpg.get_value("race_lanes"))
        try:
            lanes = [parse_lane(dpg.get_value(f"race_lane_{n}")) for n in range(count)]
            replicas = int(dpg.get_value("race_replicas"))
            minutes = float(dpg.get_value("race_minutes"))  # RaceControl.start refuses <= 0
            problem = self.controller.race_problem(lanes, replicas)
        except ConfigError as err:
            dpg.set_value("race_error", str(err))
            return
        if problem:  # refused before anything is written: the split the run cannot make
            dpg.set_value("race_error", problem)
            return
        dpg.hide_item("race_dialog")
        self.controller.send(StartRace(tuple(lanes), replicas, minutes))

    def _promote(self, *_) -> None:
        chosen = dpg.get_value("promote_lane")
        if chosen:
            weights = bool(dpg.get_value("promote_weights"))
            lane = int(chosen.split()[-1])
            row = next((r for r in self.table.rows if r.lane == lane), None) if self.table else None
            replica = row.best_replica() if row is not None else 0
            self.controller.send(Promote(lane, weights, replica))

    def texts(self) -> list[list[str]]:
        """The table's cells as drawn, row by row (for end-to-end tests); none when hidden."""
        if not self.shown:
            return []
        width = len(COLUMNS) + THRESHOLDS
        return [[dpg.get_value(f"race_{i}_{c}") for c in range(width)] for i in range(self.rows)]

    def apply(self, view: View) -> None:
        race = view.race
        if (race is not None) != self.shown:
            self.shown = race is not None
            (dpg.show_item if self.shown else dpg.hide_item)("race")
            self.relayout()
        if race is None:
            return
        dpg.set_value("race_sharing", race.sharing)
        if len(race.rows) != self.rows:
            for child in dpg.get_item_children("race_table", 1) or []:
                dpg.delete_item(child)
            for i in range(len(race.rows)):
                with dpg.table_row(parent="race_table"):
                    for column in range(len(COLUMNS) + THRESHOLDS):
                        dpg.add_text("", tag=f"race_{i}_{column}")
            self.rows = len(race.rows)
            names = [f"lane {n}" for n in range(race.lanes)]
            dpg.configure_item("promote_lane", items=names)
            if dpg.get_value("promote_lane") not in names:
                dpg.set_value("promote_lane", names[0] if names else "")
            self.relayout()
        table = self.table = race.table
        for n in range(THRESHOLDS):
            level = table.thresholds[n] if n < len(table.thresholds) else None
            dpg.configure_item(
                f"race_threshold_{n}", label="" if level is None else f"to {level_text(level)}"
            )
        for i, row in enumerate(table.rows):
            cells = ["leads" if row.leader else "", *row_cells(row)]
            cells += [
                reached_text(row, table.thresholds[n], "") if n < len(table.thresholds) else ""
                for n in range(THRESHOLDS)
            ]
            for column, text in enumerate(cells):
                dpg.set_value(f"race_{i}_{column}", text)
            self.styles.bind(f"race_{i}_0", "good" if row.leader else "muted")
        verdict, *rest = summary_lines(table, short=True)
        dpg.set_value("race_verdict", verdict)
        dpg.set_value("race_summary", "\n".join(rest))
        lines = 4 + len(table.rows) + len(rest)  # title (two), header, promote, summary
        if lines != self.lines:
            self.lines = lines
            self.relayout()
