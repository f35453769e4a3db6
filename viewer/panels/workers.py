"""The workers table: one row per worker (state, step, speed, last return, merges), rebuilt only
when the number of workers changes, its state cell coloured by health."""

from __future__ import annotations

from collections.abc import Callable

import dearpygui.dearpygui as dpg

from viewer.panels import TextStyles, data_table
from viewer.view import View

COLUMNS = ("worker", "lane", "state", "step", "speed", "return", "merges")


class WorkersPanel:
    def __init__(self, styles: TextStyles, relayout: Callable[[], None]) -> None:
        self.styles = styles
        self.relayout = relayout  # the table's height steers the charts' heights
        self.rows = 0

    def build(self) -> None:
        dpg.add_spacer(height=4)
        dpg.add_text("Workers", tag="workers_title")
        self.styles.bind("workers_title", "accent")
        data_table("worker_table", COLUMNS)

    def apply(self, view: View) -> None:
        rows = view.workers
        if len(rows) != self.rows:
            for child in dpg.get_item_children("worker_table", 1) or []:
                dpg.delete_item(child)
            for i in range(len(rows)):
                with dpg.table_row(parent="worker_table"):
                    for column in COLUMNS:
                        dpg.add_text("", tag=f"cell_{i}_{column}")
            self.rows = len(rows)
            self.relayout()
        for i, row in enumerate(rows):
            for column in COLUMNS:
                dpg.set_value(f"cell_{i}_{column}", row[column])
            style = (
                "danger" if row["problem"] else "good" if row["state"] == "training" else "muted"
            )
            self.styles.bind(f"cell_{i}_state", style)
