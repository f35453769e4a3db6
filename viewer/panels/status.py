"""The status bar and the message log: where the run is, what the machine does, the last notice.

Every one-line message of the window (a saved screenshot, a refused action, a worker's error)
goes through `notify`, which shows it in the status bar and keeps it in the Log tab.
"""

from __future__ import annotations

import time
from collections import deque

import dearpygui.dearpygui as dpg

from viewer import theme
from viewer.panels import TextStyles
from viewer.view import View

LOG = "log"  # the Log tab's text (the charts panel places it among its tabs)
PHASES = {
    "running": "",
    "starting": "starting...",
    "stopping": "stopping: workers write checkpoints...",
    "stopped": "stopped",
    "idle": "no run: Run > New run",
}


class StatusPanel:
    def __init__(self, styles: TextStyles) -> None:
        self.styles = styles
        self.log_lines: deque[str] = deque(maxlen=300)
        self._errors_shown = 0
        self._notes_shown = 0

    def build(self) -> None:
        with dpg.child_window(tag="statusbar", height=28, border=False, no_scrollbar=True):
            with dpg.group(horizontal=True):
                dpg.add_text("", tag="status_run")
                dpg.add_text("", tag="status_machine")
                dpg.add_text("", tag="status_fps")
                dpg.add_text("", tag="status_message")

    def apply(self, view: View) -> None:
        where = f"{view.run_path}{view.wording.label}"
        dpg.set_value("status_run", f"{where} {PHASES[view.phase]}".strip())
        dpg.set_value("status_machine", f"  |  {view.machine}" if view.machine else "")
        # Errors new since the last view, each as a notice (the view keeps only the newest).
        new_errors = view.error_count - self._errors_shown
        if new_errors > 0:
            for line in view.errors[-min(new_errors, len(view.errors)) :]:
                self.notify(f"error: {line}")
            self._errors_shown = view.error_count
        new_notes = view.note_count - self._notes_shown  # each process's fast path
        if new_notes > 0:
            for line in view.notes[-min(new_notes, len(view.notes)) :]:
                self.notify(line)
            self._notes_shown = view.note_count

    def show_fps(self, fps: float) -> None:
        dpg.set_value("status_fps", f"  |  window {fps:.0f} fps")

    def notify(self, message: str) -> None:
        colour = (
            theme.DANGER
            if message.startswith(("error", "refused"))
            else theme.WARNING
            if "crashed" in message
            else theme.MUTED
        )
        dpg.set_value("status_message", f"  |  {message}")
        self.styles.bind(
            "status_message",
            "danger"
            if colour == theme.DANGER
            else "warning"
            if colour == theme.WARNING
            else "muted",
        )
        self.log(message)

    def log(self, line: str) -> None:
        self.log_lines.append(f"{time.strftime('%H:%M:%S')}  {line}")
        dpg.set_value(LOG, "\n".join(self.log_lines))
