"""The knob panel: one widget per live knob, the value each worker runs with beside it, and the
debounce that sends a change once the slider rests (one knob version per gesture, not per pixel).

The panel learns which knobs exist, their order, labels, ranges and widget kind in one place,
`knob_widgets()`; change that function and the panel follows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import dearpygui.dearpygui as dpg

from viewer.controller import View
from viewer.model import KNOB_LABELS
from viewer.panels import TextStyles
from workers.presets import knob_ranges

# Knobs entered as numbers rather than dragged (wide ranges): name -> the +/- step.
TYPED_KNOBS = {"merge_every": 500, "num_samples": 64, "num_elites": 8}
KNOB_DEBOUNCE_S = 0.35


@dataclass(frozen=True)
class KnobWidget:
    """What the panel needs to draw one knob."""

    name: str
    label: str
    low: int
    high: int
    step: int | None  # typed entry with this +/- step; None: a slider


def knob_widgets() -> list[KnobWidget]:
    """The knobs the window shows, in panel order: the panel's one source of its knob list."""
    ranges = knob_ranges()
    widgets = []
    for name, label in KNOB_LABELS.items():
        low, high = (int(v) for v in ranges[name])
        widgets.append(KnobWidget(name, label, low, high, TYPED_KNOBS.get(name)))
    return widgets


class KnobsPanel:
    def __init__(
        self,
        send: Callable[..., None],
        styles: TextStyles,
        knobs: Callable[[], list[KnobWidget]] = knob_widgets,
    ) -> None:
        self.send = send  # the controller's set_knobs(**changes)
        self.styles = styles
        self._knobs = knobs
        self.knobs: list[KnobWidget] = []
        self.pending: dict[str, int] = {}
        self.pending_since = 0.0

    @property
    def tags(self) -> list[str]:
        return [f"knob_{knob.name}" for knob in self.knobs]

    def build(self) -> None:
        self.knobs = self._knobs()
        dpg.add_spacer(height=4)
        dpg.add_text("Speed knobs", tag="knobs_title")
        self.styles.bind("knobs_title", "accent")
        with dpg.table(header_row=False, tag="knob_table", policy=dpg.mvTable_SizingStretchProp):
            dpg.add_table_column(init_width_or_weight=1.1)
            dpg.add_table_column(init_width_or_weight=1.3)
            dpg.add_table_column(init_width_or_weight=0.8)
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
                    if knob.step is not None:
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

    def apply(self, view: View) -> None:
        for row in view.knobs:
            tag = f"knob_{row.name}"
            if row.name not in self.pending and not dpg.is_item_active(tag):
                dpg.set_value(tag, int(row.requested))
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
        self.pending[name] = int(value)
        self.pending_since = time.monotonic()

    def flush(self) -> None:
        """Send knob changes once the slider rests."""
        if not self.pending or time.monotonic() - self.pending_since < KNOB_DEBOUNCE_S:
            return
        if any(dpg.is_item_active(f"knob_{name}") for name in self.pending):
            return
        changes, self.pending = self.pending, {}
        self.send(**changes)
