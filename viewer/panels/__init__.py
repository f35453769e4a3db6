"""The window's panels: each builds its widgets once (`build`) and shows a new view (`apply`).

A panel owns its widgets and the callbacks on them; the app only places the panels, lays them out
and runs the frame loop. Panels talk to the run only through the controller, and to each other
through the few callables the app hands them (notify, relayout), so each reads on its own.
"""

from __future__ import annotations

from typing import Protocol

import dearpygui.dearpygui as dpg

from viewer import theme
from viewer.view import View


class Panel(Protocol):
    def build(self) -> None:
        """Create the widgets, inside whatever container the app has open."""

    def apply(self, view: View) -> None:
        """Show a new view (called on the GUI thread only when the view changed)."""


def data_table(tag: str, labels: tuple[str, ...], fit: bool = False) -> None:
    """A table of rows of numbers: a header row, stripes, columns labelled `labels` (more can
    be added with parent=tag), sharing the width evenly or (`fit`) each as wide as its
    longest cell, the last ones cut off at the right when the window is too narrow."""
    with dpg.table(
        tag=tag,
        header_row=True,
        policy=dpg.mvTable_SizingFixedFit if fit else dpg.mvTable_SizingStretchProp,
        row_background=True,
        borders_innerH=True,
    ):
        for label in labels:
            dpg.add_table_column(label=label)


class TextStyles:
    """Named text colours, shared by the panels. Made once the Dear PyGui context exists (`load`),
    because a theme is a Dear PyGui item; until then the panels only hold this object."""

    COLOURS = dict(
        muted=theme.MUTED,
        warning=theme.WARNING,
        danger=theme.DANGER,
        good=theme.GOOD,
        accent=theme.ACCENT,
    )

    def __init__(self) -> None:
        self._themes: dict[str, int] = {}

    def load(self) -> None:
        self._themes = {name: theme.text_theme(colour) for name, colour in self.COLOURS.items()}

    def bind(self, item: int | str, name: str) -> None:
        dpg.bind_item_theme(item, self._themes[name])
