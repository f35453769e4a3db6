"""The Dear PyGui window: the panels placed in one viewport, laid out, and the frame loop.

Each panel (viewer/panels/) builds its own widgets and shows the controller's view; this module
only opens the window, places the panels, sizes them, binds the keys and runs the loop. Everything
runs on the GUI thread and returns at once: run actions are queued on the controller, frames are
copied from shared memory, chart data arrives pre-built. Callbacks run on this thread too (manual
callback management), because Dear PyGui items are not thread safe. Over 300 lines because
the frame loop, its key bindings and its pacing read the same GUI-thread state.
"""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path

import dearpygui.dearpygui as dpg
import numpy as np

from viewer import theme
from viewer.controller import Controller
from viewer.input_watch import InputWatch
from viewer.pacing import REPLAY_WATCH_SHARE, WATCH_SHARE, FramePacer
from viewer.panels import Panel, TextStyles
from viewer.panels.charts import ChartsPanel
from viewer.panels.controls import ControlsPanel
from viewer.panels.dialogs import DialogsPanel
from viewer.panels.knobs import KnobsPanel
from viewer.panels.race import RacePanel
from viewer.panels.showcase import FRAME_H, FRAME_W, ShowcasePanel
from viewer.panels.status import StatusPanel
from viewer.panels.timeline import TimelinePanel
from viewer.panels.workers import WorkersPanel
from viewer.recorder import ClipRecorder
from viewer.view import View
from workers.door import ResetShowcase

# Still importable from here: the frame size (main, bench) and the typed knobs (knob table).
__all__ = ["App", "FRAME_H", "FRAME_W"]

TITLE = "TD-MPC2 Live"
UI_MAP_S = 2.0  # with TDMPC2_LIVE_UI_MAP (tests): the map is written again this often
NO_WATCH_IDLE_S = 0.2  # without an input watch, input is noticed only at a frame: draw often


class App:
    def __init__(
        self,
        controller: Controller,
        open_first: Callable | None,
        fps_cap: float = 32.0,
        max_seconds: float | None = None,
    ):
        self.controller = controller
        self.open_first = open_first
        self.fps_cap = fps_cap
        self.max_seconds = max_seconds
        self.view: View = controller.view
        self.frame_times: deque[float] = deque(maxlen=240)
        self.work_ms: list[float] = []
        self.frame_stamps: list[float] = []  # perf_counter() at each drawn frame
        self.quit_requested = False
        self.pacer = FramePacer(fps_cap)
        self.input_watch: InputWatch | None = None
        self.changed = True
        self._tick_failed = False
        self.ui_map_path = os.environ.get("TDMPC2_LIVE_UI_MAP")
        self.stats_path = os.environ.get("TDMPC2_LIVE_STATS")
        # The panels, in the order they show a new view.
        self.styles = TextStyles()
        self.status = StatusPanel(self.styles)
        self.showcase = ShowcasePanel(controller, self.status.notify)
        self.knobs = KnobsPanel(controller.send, self.styles)
        self.controls = ControlsPanel(controller)
        self.timeline = TimelinePanel(controller, self.status.notify)
        self.charts = ChartsPanel(controller, self._layout, self.timeline.pick_at)
        self.workers = WorkersPanel(self.styles, self._layout)
        self.race = RacePanel(controller, self.styles, self._layout)
        self.dialogs = DialogsPanel(
            controller,
            self.styles,
            self._quit,
            self.showcase.window_screenshot,
            self.race.show_dialog,
        )
        self.panels: list[Panel] = [self.status, self.charts, self.knobs, self.race, self.workers]
        self.panels += [self.controls, self.showcase, self.timeline, self.dialogs]

    @property
    def frame_info(self) -> dict | None:
        """The shown showcase frame's info (None until the first frame)."""
        return self.showcase.frame_info

    @property
    def recorder(self) -> ClipRecorder | None:
        return self.showcase.recorder

    # building ------------------------------------------------------------------------
    def build(self) -> None:
        dpg.create_context()
        dpg.configure_app(manual_callback_management=True)
        theme.load_fonts()
        theme.apply_dark_theme()
        self.styles.load()
        self.showcase.build_texture()
        with dpg.window(tag="main", no_scrollbar=True):
            self.dialogs.build_menu()
            with dpg.group(horizontal=True):
                with dpg.child_window(tag="left", border=False):
                    self.showcase.build()
                    self.timeline.build()
                    self.knobs.build()
                    self.controls.build()
                with dpg.child_window(tag="right", border=False):
                    self.charts.build()
                    self.race.build()
                    self.workers.build()
            self.status.build()
        self.dialogs.build()
        self.race.build_dialog()
        self._build_shortcuts()
        dpg.set_primary_window("main", True)
        icon = str(theme.ICON) if theme.ICON.exists() else ""
        dpg.create_viewport(
            title=TITLE,
            width=1280,
            height=800,
            min_width=960,
            min_height=640,
            x_pos=0,
            y_pos=0,
            small_icon=icon,
            large_icon=icon,
            clear_color=theme.BACKGROUND,
        )
        dpg.set_viewport_resize_callback(lambda *_: self._layout())
        dpg.setup_dearpygui()
        dpg.show_viewport()
        self.input_watch = InputWatch.open()
        if self.input_watch is None:
            self.pacer.idle_s = NO_WATCH_IDLE_S
        self._layout()

    def _build_shortcuts(self) -> None:
        showcase = self.showcase
        with dpg.handler_registry():
            dpg.add_key_press_handler(dpg.mvKey_Spacebar, callback=self._key_space)
            dpg.add_key_press_handler(dpg.mvKey_Back, callback=self._key_backspace)
            dpg.add_key_press_handler(dpg.mvKey_P, callback=self._key_ctrl(showcase.screenshot))
            dpg.add_key_press_handler(dpg.mvKey_R, callback=self._key_ctrl(showcase.toggle_record))
            dpg.add_key_press_handler(dpg.mvKey_Q, callback=self._key_ctrl(self._quit))
            dpg.add_key_press_handler(dpg.mvKey_F1, callback=self.dialogs.toggle_help)
            # Any input keeps the window at full frame rate for a moment (see run()).
            for add in (dpg.add_mouse_move_handler, dpg.add_mouse_wheel_handler):
                add(callback=self._activity)
            dpg.add_mouse_click_handler(callback=self._activity)
            dpg.add_key_down_handler(callback=self._activity)

    def _typing(self) -> bool:
        """A dialog with text fields is open: keys are its, not shortcuts."""
        return self.dialogs.typing() or self.race.typing()

    # layout --------------------------------------------------------------------------
    def _layout(self) -> None:
        width = dpg.get_viewport_client_width()
        height = dpg.get_viewport_client_height()
        body = max(200, height - 28 - 46)
        left = max(440, int(width * 0.4))
        dpg.configure_item("left", width=left, height=body)
        dpg.configure_item("right", width=max(300, width - left - 28), height=body)
        self.showcase.fit(left - 24, body)
        race_rows = self.race.lines if self.race.shown else 0
        self.charts.fit(body, self.workers.rows + race_rows)

    # the frame loop ------------------------------------------------------------------
    def run(self) -> dict:
        """Open the window and run until it is closed; returns frame-time statistics."""
        self.build()
        if self.open_first is not None:
            self.controller.open(self.open_first)
        # Ctrl+C and SIGTERM close the window as its close button does: the loop ends at the
        # next tick and the caller stops the run (checkpoints); no KeyboardInterrupt lands in
        # the middle of a frame.
        previous = {
            sig: signal.signal(sig, lambda *_: self._quit())
            for sig in (signal.SIGINT, signal.SIGTERM)
        }
        start = last = next_due = time.perf_counter()
        next_ui_map = 0.0
        frames = 0
        try:
            while dpg.is_dearpygui_running() and not self.quit_requested:
                begin = time.perf_counter()
                self._guarded(self.tick)
                now = time.monotonic()
                # A clip being recorded takes every frame the player makes, as input does.
                if self.recorder is not None or (not self.pacer.active(now) and self._input_seen()):
                    self.pacer.input(now)
                if self.pacer.due(now, self.changed or self._news()):
                    self.changed = False
                    self._guarded(self.prepare_frame)
                    dpg.render_dearpygui_frame()
                    dpg.run_callbacks(dpg.get_callback_queue())
                    frames += 1
                    work = time.perf_counter() - begin
                    self.pacer.drew(now, work)
                    self.work_ms.append(work * 1000)
                    self.frame_stamps.append(begin)
                    end = time.perf_counter()
                    self.frame_times.append(end - last)
                    last = end
                if frames >= 30 and self.ui_map_path and time.monotonic() >= next_ui_map:
                    next_ui_map = time.monotonic() + UI_MAP_S
                    self._write_ui_map()
                # vsync does not cap the loop under Xvfb: sleep until the next frame is due
                # (a deadline, so sleep overshoot does not pull the rate below the cap).
                period = self.pacer.tick_s(time.monotonic())
                next_due = max(next_due + period, time.perf_counter() - 0.1)
                time.sleep(max(0.0, next_due - time.perf_counter()))
                if self.max_seconds is not None and time.perf_counter() - start > self.max_seconds:
                    break
        except KeyboardInterrupt:  # a handler of the caller's own raised it
            pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        stats = self._stats(time.perf_counter() - start, frames)
        if self.recorder is not None:
            self.showcase.toggle_record()
        dpg.destroy_context()
        if self.stats_path:
            Path(self.stats_path).write_text(json.dumps(stats))
        return stats

    def _stats(self, seconds: float, frames: int) -> dict:
        times = np.array(self.work_ms[10:] or [0.0])
        return {
            "frames": frames,
            "seconds": round(seconds, 2),
            "fps": round(frames / seconds, 1) if seconds > 0 else 0.0,
            # Time the loop worked per frame (the rest is sleep up to the frame-rate cap).
            "work_ms_median": round(float(np.median(times)), 2),
            "work_ms_p99": round(float(np.percentile(times, 99)), 2),
            "work_ms_max": round(float(times.max()), 2),
        }

    def _guarded(self, step: Callable[[], None]) -> None:
        # A drawing bug must not take the training run down with the window: report it once.
        try:
            step()
        except Exception as err:
            if not self._tick_failed:
                self._tick_failed = True
                traceback.print_exc()
                self.status.notify(f"error: window update failed ({type(err).__name__}: {err})")

    def tick(self) -> None:
        """Every loop turn, drawn or not: send knob changes, show notices."""
        self.knobs.flush()
        while not self.controller.notices.empty():
            self.status.notify(self.controller.notices.get())
            self.changed = True

    def _news(self) -> bool:
        """A new showcase frame or new numbers wait to be shown."""
        return self.showcase.frame_waiting() or self.controller.view.version != self.view.version

    def prepare_frame(self) -> None:
        """Before a frame is drawn: the newest showcase frame into the texture, the newest
        view into the widgets. Skipped frames are never copied (latest wins)."""
        if self.showcase.update_frame():
            self.changed = True
            replaying = bool((self.showcase.frame_info or {}).get("replay"))
            self.pacer.watch_share = REPLAY_WATCH_SHARE if replaying else WATCH_SHARE
        view = self.controller.view
        if view.version != self.view.version:
            self.view = view
            for panel in self.panels:
                panel.apply(view)
        self.charts.hover()
        if len(self.frame_times) > 10:
            self.status.show_fps(len(self.frame_times) / sum(self.frame_times))

    # input ---------------------------------------------------------------------------
    def _activity(self, *_) -> None:
        self.pacer.input(time.monotonic())

    def _input_seen(self) -> bool:
        """Input over the window since the last tick, asked of the X server (no frame drawn)."""
        if self.input_watch is None:
            return False
        width, height = dpg.get_viewport_client_width(), dpg.get_viewport_client_height()
        return self.input_watch.poll(width, height)

    def _key_space(self, *_) -> None:
        if not self._typing():
            self.showcase.toggle_render()

    def _key_backspace(self, *_) -> None:
        if not self._typing() and not self.knobs.active():
            self.controller.send(ResetShowcase())

    def _key_ctrl(self, action: Callable) -> Callable:
        def handler(*_) -> None:
            if dpg.is_key_down(dpg.mvKey_LControl) or dpg.is_key_down(dpg.mvKey_RControl):
                action()

        return handler

    def _quit(self, *_) -> None:
        self.quit_requested = True

    def _write_ui_map(self) -> None:
        """Screen rectangles of the main controls, for end-to-end tests that drive real input,
        and texts the window shows, read back ("texts": the race table, the viewport overlay)."""
        tags = ["viewport_draw", "render_pause", "record", "train_pause", "worker_table"]
        tags += ["promote", "knob_lane", "timeline", "timeline_newest", "panes"]
        tags += self.knobs.tags + self.charts.tags
        rects = {}
        for tag in tags:
            state = dpg.get_item_state(tag)
            if "rect_min" in state and state.get("visible", True):
                rects[str(tag)] = [*state["rect_min"], *state["rect_size"]]
        overlay = [dpg.get_item_configuration(f"overlay_{i}")["text"] for i in (1, 2)]
        rects["texts"] = {"race": self.race.texts(), "overlay": overlay}
        path = Path(self.ui_map_path)
        path.with_suffix(".tmp").write_text(json.dumps(rects))
        path.with_suffix(".tmp").replace(path)  # a reader never sees half of it
