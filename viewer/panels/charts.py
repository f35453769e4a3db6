"""The charts panel: the start-up progress, the returns chart with its options (x axis, smoothing,
autoscale), and the tabs below it (speed, losses, merge distance, the message log).

Chart lines arrive pre-built in the view; the options go back to the controller, which builds the
next view's lines with them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import dearpygui.dearpygui as dpg

from viewer import theme
from viewer.controller import Controller
from viewer.model import LOSSES
from viewer.panels.status import LOG
from viewer.plots import LinePlot, nearest_point
from viewer.view import View

CLICK_PX = 4  # a press and release this close on the returns chart is a click, not a pan
TAB_MIN = 180  # pixels the speed / losses / distance charts keep before the returns chart


class ChartsPanel:
    def __init__(
        self,
        controller: Controller,
        relayout: Callable[[], None],
        pick_step: Callable[[float], None] | None = None,
    ) -> None:
        self.controller = controller
        self.relayout = relayout  # the start-up bar takes height from the charts
        self.pick_step = pick_step  # a click on the returns chart: the step clicked
        self._pressed: tuple[float, float] | None = None  # where a click on it began
        self.plots: dict[str, LinePlot] = {}
        self.startup_shown = False

    @property
    def tags(self) -> list[str]:
        return [plot.plot for plot in self.plots.values()]

    def build(self) -> None:
        with dpg.group(tag="startup", show=False):
            dpg.add_text("", tag="startup_text")
            dpg.add_progress_bar(tag="startup_bar", width=-1)
        self.plots["returns"] = LinePlot("returns", "episode return", height=360)
        # A click on the returns chart (pressed and released in place: not a pan) replays the
        # album episode nearest the step clicked. Global handlers: a plot's own clicked state
        # is ImPlot's, and an item handler did not see clicks there.
        with dpg.handler_registry():
            dpg.add_mouse_click_handler(dpg.mvMouseButton_Left, callback=self._on_press)
            dpg.add_mouse_release_handler(dpg.mvMouseButton_Left, callback=self._on_release)
        with dpg.group(horizontal=True):
            dpg.add_radio_button(
                ["agent steps", "wall time"],
                tag="x_axis",
                horizontal=True,
                default_value="agent steps",
                callback=self._on_options,
            )
            dpg.add_text("smoothing")
            dpg.add_slider_float(
                tag="smoothing",
                min_value=0.0,
                max_value=0.99,
                default_value=0.0,
                width=140,
                clamped=True,
                callback=self._on_options,
            )
            dpg.add_checkbox(label="autoscale", tag="autoscale", default_value=True)
            dpg.add_checkbox(label="by lane", tag="by_lane", show=False, callback=self._on_options)
            with dpg.tooltip("by_lane"):
                dpg.add_text(
                    "In a race: one line per lane, the race table's smoothed return; with\n"
                    "replicas their mean, shaded between the lowest and highest replica."
                )
        # What the published line is, and how this run's settings differ from the paper's.
        dpg.add_text("", tag="published_note", wrap=0, color=theme.MUTED)
        with dpg.tab_bar(tag="tabs"):
            with dpg.tab(label="Steps/s"):
                self.plots["speed"] = LinePlot("speed", "agent steps / s", height=-1)
            with dpg.tab(label="Losses"):
                dpg.add_combo(
                    list(LOSSES),
                    default_value="total_loss",
                    tag="loss_name",
                    width=200,
                    callback=self._on_options,
                )
                self.plots["losses"] = LinePlot("losses", "loss", height=-1)
            with dpg.tab(label="Merge distance"):
                self.plots["distances"] = LinePlot(
                    "distances", "distance from the average", height=-1
                )
            with dpg.tab(label="Log", tag="log_tab"):
                dpg.add_input_text(
                    tag=LOG, multiline=True, readonly=True, width=-1, height=-1, tracked=True
                )

    def fit(self, body: int, worker_rows: int) -> None:
        """Heights for a column `body` pixels high above a workers table of `worker_rows`."""
        workers = 64 + 27 * max(2, worker_rows)
        # The returns chart gives way first, so the tabbed charts keep a readable height
        # (TAB_MIN) as workers are added.
        startup = 56 if self.startup_shown else 0  # the start-up progress bar above the charts
        returns = max(200, min(int(body * 0.46), body - workers - 110 - TAB_MIN)) - startup
        self.plots["returns"].set_height(returns)
        tab_height = max(120, body - startup - returns - workers - 110)
        for name in ("speed", "losses", "distances"):
            self.plots[name].set_height(tab_height)
        dpg.configure_item(LOG, height=tab_height)

    def apply(self, view: View) -> None:
        if (view.startup is not None) != self.startup_shown:
            self.startup_shown = view.startup is not None
            (dpg.show_item if self.startup_shown else dpg.hide_item)("startup")
            self.relayout()
        if view.startup is not None:
            fraction, text = view.startup
            dpg.set_value("startup_text", text)
            dpg.set_value("startup_bar", fraction)
            dpg.configure_item("startup_bar", overlay=f"{fraction * 100:.0f}%")
        autoscale = dpg.get_value("autoscale")
        racing = view.race is not None
        if dpg.is_item_shown("by_lane") != racing:
            dpg.configure_item("by_lane", show=racing)
        label = (
            "published TD-MPC2" + (" from pixels" if view.obs == "rgb" else "") + " (5M, 3 seeds)"
        )
        extra = {label: view.published} if view.published else {}
        dpg.set_value("published_note", view.published_note)
        self.plots["returns"].update(
            view.returns,
            autoscale,
            extra=extra,
            merges=view.merge_marks,
            knobs=view.knob_marks,
            bands=view.bands,
        )
        self.plots["speed"].update(view.speed, autoscale, merges=view.merge_marks)
        self.plots["losses"].update(view.losses, autoscale, knobs=view.knob_marks)
        self.plots["distances"].update(view.distances, autoscale, merges=view.merge_marks)
        x_label = (
            "wall time (s)" if self.controller.options.wall_axis else "agent steps (per worker)"
        )
        for plot in self.plots.values():
            plot.set_x_label(x_label)

    def hover(self) -> None:
        """The read-out of the point nearest the mouse, on the chart under it."""
        for plot in self.plots.values():
            if dpg.is_item_hovered(plot.plot):
                x, y = dpg.get_plot_mouse_pos()
                plot.show_hover(nearest_point(plot.lines, x, y, plot.x_span(), plot.y_span()))
            else:
                plot.show_hover(None)

    def _on_press(self, *_) -> None:
        hovered = dpg.is_item_hovered(self.plots["returns"].plot)
        self._pressed = tuple(dpg.get_mouse_pos(local=False)) if hovered else None

    def _on_release(self, *_) -> None:
        pressed, self._pressed = self._pressed, None
        if pressed is None or self.pick_step is None:
            return
        x, y = dpg.get_mouse_pos(local=False)
        if abs(x - pressed[0]) <= CLICK_PX and abs(y - pressed[1]) <= CLICK_PX:
            self.pick_step(float(dpg.get_plot_mouse_pos()[0]))

    def _on_options(self, *_) -> None:
        self.controller.options = replace(
            self.controller.options,
            wall_axis=dpg.get_value("x_axis") == "wall time",
            smoothing=float(dpg.get_value("smoothing")),
            loss=dpg.get_value("loss_name"),
            by_lane=bool(dpg.get_value("by_lane")),
        )
