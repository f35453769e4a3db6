"""The knob panel: one widget per live knob, the value each worker runs with beside it, and the
debounce that sends a change once the slider rests (one knob version per gesture, not per pixel).
In a race, a column per lane (its value, and what its workers run with until they apply it),
and a choice of whom a change is for: one lane, or all.

The panel learns which knobs exist, their order, labels, ranges and widget kind from the knob
table (agent/knobs.py), through `knob_widgets()`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import dearpygui.dearpygui as dpg

from agent.knobs import KnobValue, knobs
from viewer.panels import TextStyles
from viewer.view import View
from workers.door import MAX_LANES, Command, SetKnobs

ALL_LANES = "all lanes"

KNOB_DEBOUNCE_S = 0.35


@dataclass(frozen=True)
class KnobWidget:
    """What the panel needs to draw one knob."""

    name: str
    label: str
    low: float
    high: float
    step: int | None  # typed entry with this +/- step; None: a slider
    kind: type = int  # int: integer widgets; float: a float slider; bool: a checkbox


def knob_widgets() -> list[KnobWidget]:
    """The knobs the window shows, in the table's order."""
    return [
        KnobWidget(k.name, k.title, k.kind(k.low), k.kind(k.high), k.step or None, k.kind)
        for k in knobs().values()
        if k.in_window
    ]


class KnobsPanel:
    def __init__(
        self,
        send: Callable[[Command], None],
        styles: TextStyles,
        knobs: Callable[[], list[KnobWidget]] = knob_widgets,
    ) -> None:
        self.send = send  # the controller's send
        self.lanes = 0  # lanes of the race shown (0: no race)
        self.styles = styles
        self._knobs = knobs
        self.knobs: list[KnobWidget] = []
        self.pending: dict[str, KnobValue] = {}
        self._kinds: dict[str, type] = {}
        self.pending_since = 0.0

    @property
    def tags(self) -> list[str]:
        return [f"knob_{knob.name}" for knob in self.knobs]

    def build(self) -> None:
        self.knobs = self._knobs()
        self._kinds = {knob.name: knob.kind for knob in self.knobs}
        dpg.add_spacer(height=4)
        with dpg.group(horizontal=True):
            dpg.add_text("Speed knobs", tag="knobs_title")
            self.styles.bind("knobs_title", "accent")
            dpg.add_combo([ALL_LANES], tag="knob_lane", default_value=ALL_LANES, width=110)
            dpg.hide_item("knob_lane")
            with dpg.tooltip("knob_lane"):
                dpg.add_text("Whose knobs a change sets: one lane of the race, or every worker.")
        with dpg.table(header_row=False, tag="knob_table", policy=dpg.mvTable_SizingStretchProp):
            dpg.add_table_column(init_width_or_weight=1.1)
            dpg.add_table_column(init_width_or_weight=1.3)
            dpg.add_table_column(init_width_or_weight=0.8, tag="knob_now_column")
            for n in range(MAX_LANES):
                dpg.add_table_column(init_width_or_weight=0.5, tag=f"knob_lane_column_{n}")
            for knob in self.knobs:
                with dpg.table_row():
                    dpg.add_text(knob.label)
                    kwargs = dict(
                        tag=f"knob_{knob.name}",
                        min_value=knob.low,
                        max_value=knob.high,
                        width=-1,
                        callback=self._on_knob,
                        user_data=knob.name,
                    )
                    if knob.kind is bool:  # an on/off knob: a checkbox
                        del kwargs["min_value"], kwargs["max_value"], kwargs["width"]
                        dpg.add_checkbox(**kwargs)
                    elif knob.kind is float:
                        dpg.add_slider_float(clamped=True, **kwargs)
                    elif knob.step is not None:
                        dpg.add_input_int(
                            step=knob.step,
                            min_clamped=True,
                            max_clamped=True,
                            on_enter=True,
                            **kwargs,
                        )
                    else:
                        dpg.add_slider_int(clamped=True, **kwargs)
                    dpg.add_text("", tag=f"knob_applied_{knob.name}")
                    for n in range(MAX_LANES):
                        dpg.add_text("", tag=f"knob_lane_{knob.name}_{n}")
        self._show_lanes(0)

    def _show_lanes(self, count: int) -> None:
        """A column per lane of a race; the "now" column when there is none. (A table column
        hides with enabled=False: its show flag leaves it drawn.)"""
        self.lanes = count
        dpg.configure_item("knob_now_column", enabled=count == 0)
        for n in range(MAX_LANES):
            dpg.configure_item(f"knob_lane_column_{n}", enabled=n < count)
        names = [ALL_LANES] + [f"lane {n}" for n in range(count)]
        dpg.configure_item("knob_lane", items=names, show=count > 0)
        if dpg.get_value("knob_lane") not in names:
            dpg.set_value("knob_lane", ALL_LANES)

    def target(self) -> int | None:
        """The lane a change is for (None: every worker)."""
        chosen = dpg.get_value("knob_lane")
        return None if self.lanes == 0 or chosen == ALL_LANES else int(chosen.split()[-1])

    def apply(self, view: View) -> None:
        lanes = view.race.lanes if view.race is not None else 0
        if lanes != self.lanes:
            self._show_lanes(lanes)
        lane = self.target()
        for row in view.knobs:
            tag = f"knob_{row.name}"
            # All lanes: the first lane's value (each lane's is in its column).
            lanes = row.lane_requested
            shown = lanes[lane if lane is not None else 0] if lanes else row.requested
            if row.name not in self.pending and not dpg.is_item_active(tag):
                dpg.set_value(tag, self._kinds[row.name](shown))
            for n, text in enumerate(row.lanes[:MAX_LANES]):
                dpg.set_value(f"knob_lane_{row.name}_{n}", f"L{n} {text}")
            text = dpg.get_value(f"knob_applied_{row.name}")
            new = row.applied_text
            if text != new:
                dpg.set_value(f"knob_applied_{row.name}", new)
                style = "danger" if row.error else "warning" if row.pending else "muted"
                self.styles.bind(f"knob_applied_{row.name}", style)

    def active(self) -> bool:
        """A knob has the mouse or the keyboard (keys then belong to it, not to shortcuts)."""
        return any(dpg.is_item_active(tag) for tag in self.tags)

    def _on_knob(self, sender, value, name) -> None:
        self.pending[name] = self._kinds[name](value)
        self.pending_since = time.monotonic()

    def flush(self) -> None:
        """Send knob changes once the slider rests."""
        if not self.pending or time.monotonic() - self.pending_since < KNOB_DEBOUNCE_S:
            return
        if any(dpg.is_item_active(f"knob_{name}") for name in self.pending):
            return
        changes, self.pending = self.pending, {}
        self.send(SetKnobs(changes, lane=self.target()))
