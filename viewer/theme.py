"""The window's look: a deliberate dark theme, readable fonts and plot colours, from assets/."""

from __future__ import annotations

from pathlib import Path

import dearpygui.dearpygui as dpg

ASSETS = Path(__file__).resolve().parent.parent / "assets"
FONT = ASSETS / "fonts" / "DejaVuSans.ttf"
MONO = ASSETS / "fonts" / "DejaVuSansMono.ttf"
ICON = ASSETS / "icon.png"

BACKGROUND = (22, 24, 29)
PANEL = (30, 33, 40)
ACCENT = (86, 156, 214)
TEXT = (222, 226, 232)
MUTED = (140, 148, 160)
WARNING = (236, 178, 64)
DANGER = (232, 96, 88)
GOOD = (110, 196, 120)
# One colour per worker (colour-blind friendly ordering), then the showcase and the reference.
WORKER_COLOURS = [
    (86, 156, 214),
    (230, 159, 0),
    (0, 158, 115),
    (204, 121, 167),
    (240, 228, 66),
    (213, 94, 0),
    (0, 114, 178),
    (150, 150, 150),
]
SHOWCASE_COLOUR = (255, 255, 255)
PUBLISHED_COLOUR = (120, 120, 130)
MERGE_COLOUR = (110, 196, 120, 90)
KNOB_COLOUR = (236, 178, 64, 140)


def load_fonts(scale: float = 1.0) -> tuple[int, int]:
    """(regular, monospace) fonts; the regular one becomes the default."""
    with dpg.font_registry():
        regular = dpg.add_font(str(FONT), round(16 * scale))
        mono = dpg.add_font(str(MONO), round(15 * scale))
    dpg.bind_font(regular)
    return regular, mono


def apply_dark_theme() -> None:
    with dpg.theme() as theme:
        with dpg.theme_component(dpg.mvAll):
            colours = {
                dpg.mvThemeCol_WindowBg: BACKGROUND,
                dpg.mvThemeCol_ChildBg: PANEL,
                dpg.mvThemeCol_PopupBg: PANEL,
                dpg.mvThemeCol_MenuBarBg: PANEL,
                dpg.mvThemeCol_Text: TEXT,
                dpg.mvThemeCol_TextDisabled: MUTED,
                dpg.mvThemeCol_FrameBg: (42, 46, 56),
                dpg.mvThemeCol_FrameBgHovered: (52, 58, 70),
                dpg.mvThemeCol_FrameBgActive: (60, 68, 84),
                dpg.mvThemeCol_Button: (48, 54, 66),
                dpg.mvThemeCol_ButtonHovered: (62, 92, 128),
                dpg.mvThemeCol_ButtonActive: ACCENT,
                dpg.mvThemeCol_SliderGrab: ACCENT,
                dpg.mvThemeCol_SliderGrabActive: (120, 180, 230),
                dpg.mvThemeCol_Header: (48, 54, 66),
                dpg.mvThemeCol_HeaderHovered: (62, 92, 128),
                dpg.mvThemeCol_Tab: (36, 40, 48),
                dpg.mvThemeCol_TabActive: (62, 92, 128),
                dpg.mvThemeCol_TabHovered: (72, 108, 150),
                dpg.mvThemeCol_PlotHistogram: ACCENT,
                dpg.mvThemeCol_CheckMark: ACCENT,
                dpg.mvThemeCol_Border: (50, 54, 62),
            }
            for target, colour in colours.items():
                dpg.add_theme_color(target, colour)
            dpg.add_theme_style(dpg.mvStyleVar_WindowRounding, 4)
            dpg.add_theme_style(dpg.mvStyleVar_ChildRounding, 4)
            dpg.add_theme_style(dpg.mvStyleVar_FrameRounding, 3)
            dpg.add_theme_style(dpg.mvStyleVar_GrabRounding, 3)
            dpg.add_theme_style(dpg.mvStyleVar_FramePadding, 6, 4)
            dpg.add_theme_style(dpg.mvStyleVar_ItemSpacing, 8, 6)
            dpg.add_theme_style(dpg.mvStyleVar_WindowPadding, 10, 8)
            dpg.add_theme_color(dpg.mvPlotCol_PlotBg, (18, 20, 24), category=dpg.mvThemeCat_Plots)
            dpg.add_theme_color(dpg.mvPlotCol_FrameBg, PANEL, category=dpg.mvThemeCat_Plots)
            dpg.add_theme_style(dpg.mvPlotStyleVar_LineWeight, 1.6, category=dpg.mvThemeCat_Plots)
    dpg.bind_theme(theme)


def line_theme(colour: tuple[int, ...], weight: float = 1.6) -> int:
    """A theme for one plot line (worker colour, showcase, reference)."""
    with dpg.theme() as theme:
        with dpg.theme_component(dpg.mvLineSeries):
            dpg.add_theme_color(dpg.mvPlotCol_Line, colour, category=dpg.mvThemeCat_Plots)
            dpg.add_theme_style(
                dpg.mvPlotStyleVar_LineWeight, weight, category=dpg.mvThemeCat_Plots
            )
        with dpg.theme_component(dpg.mvInfLineSeries):
            dpg.add_theme_color(dpg.mvPlotCol_Line, colour, category=dpg.mvThemeCat_Plots)
    return theme


def text_theme(colour: tuple[int, ...]) -> int:
    with dpg.theme() as theme:
        with dpg.theme_component(dpg.mvAll):
            dpg.add_theme_color(dpg.mvThemeCol_Text, colour)
    return theme
