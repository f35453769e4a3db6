"""The timeline under the viewport: a slider over the shown source's album episodes (moving it
pins one, replayed in a loop), a button back to the newest, and the panes' layout.

What the slider means lives in viewer/timeline.py (testable without a display); this panel owns
the widgets and sends commands (PinEpisode, ShowPanes) through the controller.
"""

from __future__ import annotations

from collections.abc import Callable

import dearpygui.dearpygui as dpg

from viewer import theme
from viewer.controller import Controller
from viewer.timeline import TimelinePoint, chart_pick, slider_index
from viewer.view import View
from workers.door import PinEpisode, ShowPanes

PANE_LABELS = {
    "single": "panes: 1",
    "then-now-2": "then & now (2)",
    "then-now-4": "then & now (4)",
    "lanes": "lanes",
    "agent-view": "the agent's view",
}


def pane_choices(obs: str) -> list[str]:
    """The panes combo's items: the agent's view only for a run from pixels."""
    return [label for k, label in PANE_LABELS.items() if obs == "rgb" or k != "agent-view"]


class TimelinePanel:
    def __init__(self, controller: Controller, notify: Callable[[str], None]) -> None:
        self.controller = controller
        self.notify = notify
        self.points: list[TimelinePoint] = []
        self.pin: tuple[int, str, int] | None = None
        self.asked: PinEpisode | None = None  # the last pin sent, so a drag sends each once
        self._placed: tuple | None = None  # what the slider was last placed for
        self._obs = "state"  # the shown run's observations: whose pane choices are listed

    def build(self) -> None:
        with dpg.group(horizontal=True):
            dpg.add_slider_int(
                tag="timeline",
                min_value=0,
                max_value=0,
                format="",
                width=-250,
                callback=self._on_slide,
            )
            with dpg.tooltip("timeline"):
                dpg.add_text(
                    "The album: episodes kept across the run. Slide to replay one (looping);\n"
                    "a click on the returns chart picks the one nearest that step."
                )
            dpg.add_button(label="Newest", tag="timeline_newest", callback=self._on_newest)
            dpg.add_combo(
                pane_choices("state"),
                default_value=PANE_LABELS["single"],
                tag="panes",
                width=-1,
                callback=self._on_panes,
            )
            with dpg.tooltip("panes"):
                dpg.add_text(
                    "then & now: the first and newest album episodes side by side (4: and the\n"
                    "thirds between); lanes: each race lane's newest episode. Replays at 1x.\n"
                    "the agent's view (a run from pixels): the 3 frames its encoder takes,\n"
                    "beside the episode shown."
                )
        dpg.add_text("", tag="timeline_label", color=theme.MUTED)

    def apply(self, view: View) -> None:
        self.points, self.pin = view.album, view.pin
        if view.obs != self._obs:
            self._obs = view.obs
            dpg.configure_item("panes", items=pane_choices(view.obs))
        label = PANE_LABELS.get(view.panes)
        if label is not None and dpg.get_value("panes") != label:
            dpg.set_value("panes", label)
        ends = (len(view.album), view.album[0].step if view.album else -1, view.pin)
        # Placed again only when the album or the pin changed, never under a dragging hand.
        if ends != self._placed and not dpg.is_item_active("timeline"):
            self._placed = ends
            dpg.configure_item("timeline", max_value=max(0, len(view.album) - 1))
            dpg.set_value("timeline", slider_index(view.album, view.pin))
        dpg.set_value("timeline_label", self.label())

    def label(self) -> str:
        if not self.points:
            return "timeline: no album episode of the shown weights yet"
        if self.pin is None:
            return f"newest episodes  ·  album: {len(self.points)}, last: {self.points[-1].label()}"
        shown = self.points[slider_index(self.points, self.pin)]
        return f"pinned (looping): {shown.label()}"

    # callbacks -----------------------------------------------------------------------
    def _on_slide(self, sender, value) -> None:
        if 0 <= value < len(self.points):
            self.send_pin(self.points[value].pin)

    def send_pin(self, command: PinEpisode) -> None:
        if command != self.asked:
            self.asked = command
            self.controller.send(command)

    def _on_newest(self, *_) -> None:
        self.asked = None
        self.controller.send(PinEpisode())

    def _on_panes(self, sender, value) -> None:
        layout = next((k for k, label in PANE_LABELS.items() if label == value), None)
        if layout is not None:
            self.controller.send(ShowPanes(layout))

    def pick_at(self, step: float) -> None:
        """A click on the returns chart at `step`: pin the album episode nearest it."""
        point, why = chart_pick(self.points, step, self.controller.options.wall_axis)
        if point is None:
            self.notify(why)
        else:
            self.send_pin(point.pin)
