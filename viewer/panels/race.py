"""The race: its table (one row per lane, best first: knobs that differ, agent steps per worker,
steps/s per worker, return now, best evaluation, the race time at which each lane first reached
a few returns, the area under its return against wall time in return x minutes), the promote
action, and the dialog that starts a race from a running run.
The rows come ranked in the view (workers/run/race_table.py); nothing here computes them.
"""

from __future__ import annotations

from collections.abc import Callable

import dearpygui.dearpygui as dpg

from agent.errors import ConfigError
from viewer.controller import Controller
from viewer.panels import TextStyles, data_table
from viewer.view import View
from workers.run.race import MAX_LANES
from workers.rundir.lanes import parse_lane

COLUMNS = ("", "lane", "knobs", "steps", "steps/s", "return", "eval")
THRESHOLDS = 3  # the race table's time-to-return columns (workers/run/race_table.py FRACTIONS)


def _clock(seconds: float | None) -> str:
    return "-" if seconds is None else f"{int(seconds // 60)}:{int(seconds % 60):02d}"


class RacePanel:
    def __init__(
        self, controller: Controller, styles: TextStyles, relayout: Callable[[], None]
    ) -> None:
        self.controller = controller
        self.styles = styles
        self.relayout = relayout  # the table's height steers the charts' heights
        self.rows = 0  # table rows built (lanes)
        self.shown = False

    def build(self) -> None:
        with dpg.group(tag="race", show=False):
            dpg.add_spacer(height=4)
            with dpg.group(horizontal=True):
                dpg.add_text("Race", tag="race_title")
                self.styles.bind("race_title", "accent")
                dpg.add_text("", tag="race_sharing", wrap=0)
                self.styles.bind("race_sharing", "muted")
            data_table("race_table", COLUMNS)
            for n in range(THRESHOLDS):
                dpg.add_table_column(label="", tag=f"race_threshold_{n}", parent="race_table")
            dpg.add_table_column(label="area", parent="race_table")
            with dpg.group(horizontal=True):
                dpg.add_combo([], tag="promote_lane", width=90)
                dpg.add_button(label="Promote lane", tag="promote", callback=self._promote)
                with dpg.tooltip("promote"):
                    dpg.add_text(
                        "The lane's knob values for every worker; the lanes become one merge "
                        "pool again (the next merge averages every worker)."
                    )

    def build_dialog(self) -> None:
        """The window that starts a race from the running run (outside the main window)."""
        with dpg.window(
            label="Start a race", tag="race_dialog", show=False, modal=True, pos=(380, 200)
        ):
            dpg.add_text(
                "The run's workers are split evenly into lanes; each lane starts from the\n"
                "merged weights, merges only with itself and runs its own knobs.",
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
                    hint="e.g. iterations=2,horizon=3 (empty: as the run)",
                    show=n < 2,
                    width=380,
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
            problem = self.controller.race_problem(count)
        except ConfigError as err:
            dpg.set_value("race_error", str(err))
            return
        if problem:  # refused before anything is written: the split the run cannot make
            dpg.set_value("race_error", problem)
            return
        dpg.hide_item("race_dialog")
        self.controller.start_race(lanes)

    def _promote(self, *_) -> None:
        chosen = dpg.get_value("promote_lane")
        if chosen:
            self.controller.promote(int(chosen.split()[-1]))

    def texts(self) -> list[list[str]]:
        """The table's cells as drawn, row by row (for end-to-end tests); none when hidden."""
        if not self.shown:
            return []
        width = len(COLUMNS) + THRESHOLDS + 1
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
                    for column in range(len(COLUMNS) + THRESHOLDS + 1):
                        dpg.add_text("", tag=f"race_{i}_{column}")
            self.rows = len(race.rows)
            names = [f"lane {n}" for n in range(race.lanes)]
            dpg.configure_item("promote_lane", items=names)
            if dpg.get_value("promote_lane") not in names:
                dpg.set_value("promote_lane", names[0] if names else "")
            self.relayout()
        for n in range(THRESHOLDS):
            level = race.thresholds[n] if n < len(race.thresholds) else None
            label = "" if level is None else f"to {level:g}"
            dpg.configure_item(f"race_threshold_{n}", label=label)
        for i, row in enumerate(race.rows):
            cells = [
                "leads" if row.leader else "",
                str(row.lane),
                ", ".join(f"{k}={v}" for k, v in row.knobs.items()) or "-",
                f"{row.steps:,.0f}",
                f"{row.steps_per_s:.2f}",
                "-" if row.ret is None else f"{row.ret:.1f}",
                "-" if row.best_eval is None else f"{row.best_eval:.1f}",
            ]
            cells += [
                _clock(row.reached.get(race.thresholds[n])) if n < len(race.thresholds) else ""
                for n in range(THRESHOLDS)
            ]
            cells.append(f"{row.area / 60:,.0f}")
            for column, text in enumerate(cells):
                dpg.set_value(f"race_{i}_{column}", text)
            self.styles.bind(f"race_{i}_0", "good" if row.leader else "muted")
