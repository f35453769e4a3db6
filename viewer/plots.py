"""One live chart: a Dear PyGui plot whose lines are created on first sight and then updated in
place, with merge and knob-change markers and a hover read-out of the nearest point."""

from __future__ import annotations

import re

import dearpygui.dearpygui as dpg
import numpy as np

from viewer import theme

Lines = dict[str, tuple[list[float], list[float]]]


def nearest_point(
    lines: Lines, x: float, y: float, x_span: float, y_span: float
) -> tuple[str, float, float] | None:
    """The data point nearest to (x, y), distances scaled by the visible spans of the axes."""
    best, best_d = None, float("inf")
    for label, (xs, ys) in lines.items():
        if not xs:
            continue
        px, py = np.asarray(xs), np.asarray(ys)
        d = ((px - x) / max(x_span, 1e-12)) ** 2 + ((py - y) / max(y_span, 1e-12)) ** 2
        i = int(np.argmin(d))
        if d[i] < best_d:
            best, best_d = (label, float(px[i]), float(py[i])), float(d[i])
    return best


def axis_limits(lines: Lines, reference: Lines) -> tuple[tuple, tuple] | None:
    """x and y limits that fit `lines` (padded), and the reference only within that x range."""
    xs = [x for px, _ in lines.values() for x in px]
    if not xs:
        return None
    x_low, x_high = min(xs), max(xs)
    if x_high - x_low < 1e-9:
        x_low, x_high = x_low - 1.0, x_high + 1.0
    ys = [y for _, py in lines.values() for y in py]
    for px, py in reference.values():
        if px:
            inside = (np.asarray(px) >= x_low) & (np.asarray(px) <= x_high)
            ys += np.asarray(py)[inside].tolist()
            ys.append(float(np.interp(x_high, px, py)))
    y_low, y_high = min(ys), max(ys)
    pad = max(y_high - y_low, 1e-6) * 0.06
    return (x_low, x_high + (x_high - x_low) * 0.02), (y_low - pad, y_high + pad)


def line_colour(label: str) -> tuple[int, ...]:
    if label.startswith("showcase"):
        return theme.SHOWCASE_COLOUR
    if label.startswith("published"):
        return theme.PUBLISHED_COLOUR
    match = re.search(r"(?:worker|lane) (\d+)", label)
    index = int(match.group(1)) if match else 0
    return theme.WORKER_COLOURS[index % len(theme.WORKER_COLOURS)]


class LinePlot:
    def __init__(self, name: str, y_label: str, height: int):
        self.name = name
        self.plot = f"plot_{name}"
        self.lines: Lines = {}
        self._series: dict[str, int | str] = {}
        self._themes: dict[str, int] = {}
        self._bands: set[str] = set()  # labels of shaded bands among the series
        with dpg.plot(tag=self.plot, height=height, width=-1, anti_aliased=True):
            dpg.add_plot_legend(location=dpg.mvPlot_Location_North, horizontal=True, outside=True)
            self.x_axis = dpg.add_plot_axis(dpg.mvXAxis, label="agent steps (per worker)")
            self.y_axis = dpg.add_plot_axis(dpg.mvYAxis, label=y_label)
            self.merges = dpg.add_inf_line_series([], label="merges", parent=self.y_axis)
            self.knobs = dpg.add_inf_line_series([], label="knob changes", parent=self.y_axis)
            self.hover = dpg.add_plot_annotation(
                default_value=(0.0, 0.0), offset=(12, -12), show=False, color=(40, 44, 52, 230)
            )
        dpg.bind_item_theme(self.merges, theme.line_theme(theme.MERGE_COLOUR, 1.0))
        dpg.bind_item_theme(self.knobs, theme.line_theme(theme.KNOB_COLOUR, 1.0))

    def set_height(self, height: int) -> None:
        dpg.configure_item(self.plot, height=height)

    def set_x_label(self, label: str) -> None:
        dpg.configure_item(self.x_axis, label=label)

    def _band_for(self, label: str) -> int | str:
        """A shaded band (a lane's replicas), in its lane's colour, see-through."""
        if label not in self._series:
            tag = dpg.add_shade_series([], [], y2=[], label=label, parent=self.y_axis)
            self._bands.add(label)
            colour = (*line_colour(label)[:3], 60)
            with dpg.theme() as band_theme, dpg.theme_component(dpg.mvShadeSeries):
                dpg.add_theme_color(dpg.mvPlotCol_Fill, colour, category=dpg.mvThemeCat_Plots)
            dpg.bind_item_theme(tag, band_theme)
            self._series[label] = tag
        return self._series[label]

    def _series_for(self, label: str) -> int | str:
        if label not in self._series:
            if label.startswith("eval"):
                tag = dpg.add_scatter_series([], [], label=label, parent=self.y_axis)
            else:
                tag = dpg.add_line_series([], [], label=label, parent=self.y_axis)
            colour = line_colour(label)
            with dpg.theme() as series_theme:
                for component in (dpg.mvLineSeries, dpg.mvScatterSeries):
                    with dpg.theme_component(component):
                        dpg.add_theme_color(
                            dpg.mvPlotCol_Line, colour, category=dpg.mvThemeCat_Plots
                        )
                        dpg.add_theme_color(
                            dpg.mvPlotCol_MarkerFill, colour, category=dpg.mvThemeCat_Plots
                        )
                        dpg.add_theme_style(
                            dpg.mvPlotStyleVar_Marker,
                            dpg.mvPlotMarker_Diamond,
                            category=dpg.mvThemeCat_Plots,
                        )
            dpg.bind_item_theme(tag, series_theme)
            self._series[label] = tag
        return self._series[label]

    def update(
        self,
        lines: Lines,
        autoscale: bool,
        extra: Lines | None = None,
        merges: list[float] | None = None,
        knobs: list[float] | None = None,
        bands: dict | None = None,
    ) -> None:
        """New data for every line; `extra` lines (the published reference) do not steer
        autoscale, so a curve published to 1M steps does not squash a run at 5k. `bands`:
        label -> (xs, lows, highs), shaded."""
        every = {**lines, **(extra or {})}
        self.lines = every
        for label, (xs, ys) in every.items():
            dpg.set_value(self._series_for(label), [xs, ys])
        for label, (xs, lows, highs) in (bands or {}).items():
            dpg.set_value(self._band_for(label), [xs, lows, highs])
        for label in set(self._series) - set(every) - set(bands or {}):
            empty = [[], [], []] if label in self._bands else [[], []]
            dpg.set_value(self._series[label], empty)
        dpg.set_value(self.merges, [merges or []])
        dpg.set_value(self.knobs, [knobs or []])
        limits = axis_limits(lines, extra or {}) if autoscale else None
        if limits is None:
            dpg.set_axis_limits_auto(self.x_axis)
            dpg.set_axis_limits_auto(self.y_axis)
        else:
            dpg.set_axis_limits(self.x_axis, *limits[0])
            dpg.set_axis_limits(self.y_axis, *limits[1])

    def x_span(self) -> float:
        low, high = dpg.get_axis_limits(self.x_axis)
        return high - low

    def y_span(self) -> float:
        low, high = dpg.get_axis_limits(self.y_axis)
        return high - low

    def show_hover(self, point: tuple[str, float, float] | None) -> None:
        if point is None:
            dpg.configure_item(self.hover, show=False)
            return
        label, x, y = point
        dpg.set_value(self.hover, (x, y))
        dpg.configure_item(self.hover, label=f"{label}: {y:.4g} at {x:,.0f}", show=True)
