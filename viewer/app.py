"""The Dear PyGui window: viewport, charts, knob panel and status, drawn from the controller's view.

Everything here runs on the GUI thread and returns at once: run actions are queued on the
controller, frames are copied from shared memory, chart data arrives pre-built. Callbacks run on
this thread too (manual callback management), because Dear PyGui items are not thread safe.
"""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import dearpygui.dearpygui as dpg
import numpy as np

from viewer import theme
from viewer.controller import Controller, View
from viewer.input_watch import InputWatch
from viewer.model import KNOB_LABELS, LOSSES
from viewer.pacing import FramePacer
from viewer.plots import LinePlot, nearest_point
from viewer.recorder import ClipRecorder, save_screenshot
from workers.presets import cuda_available, knob_ranges, model_sizes, tasks

TITLE = "TD-MPC2 Live"
FRAME_H, FRAME_W = 300, 400
HELP = """Keyboard (as in the MuJoCo viewer, where they fit)
  Space       pause / resume rendering (training goes on)
  Backspace   reset the showcase episode
  Ctrl+P      screenshot of the viewport (PNG in the run's media/ folder)
  Ctrl+R      start / stop recording a clip (MP4, else GIF)
  F1          this help
  Ctrl+Q      quit (workers stop and write a checkpoint)

Knobs apply to every worker before its next agent step; the text beside each
slider shows the value the workers run with now until all have applied it.
Ctrl+click a slider to type a value; values outside the range cannot be entered.

Add worker: a new worker starts from the merged weights at the others' step.
Remove worker: the newest merging worker checkpoints and leaves the run; the
others merge without it, and a resumed run leaves it out.

Attached to a run (--attach): the training buttons ask the process that
started it; closing this window leaves that run training.

While nobody uses the window it draws about 2 frames a second on software GL
(new frames and numbers, within 0.04 of a core), so training keeps its speed;
any mouse or key input brings it back to full rate at once."""
# Knobs entered as numbers rather than dragged (wide ranges).
TYPED_KNOBS = {"merge_every": 500, "num_samples": 64, "num_elites": 8}
KNOB_DEBOUNCE_S = 0.35
NO_WATCH_IDLE_S = 0.2  # without an input watch, input is noticed only at a frame: draw often
TAB_MIN = 180  # pixels the speed / losses / distance charts keep before the returns chart


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
        self.pending_knobs: dict[str, int] = {}
        self.pending_since = 0.0
        self.render_paused = False
        self.frame_seq = -1
        self.last_frame: np.ndarray | None = None
        self.frame_info: dict | None = None
        self.recorder: ClipRecorder | None = None
        self.log_lines: deque[str] = deque(maxlen=300)
        self.quit_requested = False
        self.pacer = FramePacer(fps_cap)
        self.input_watch: InputWatch | None = None
        self.changed = True
        self._tick_failed = False
        self._frame_buffer = np.zeros(FRAME_H * FRAME_W * 3, dtype=np.float32)
        self._shown_sources: list[str] = []
        self._shown_cameras: list[str] = []
        self._worker_rows = 0
        self._errors_shown = 0
        self._startup_shown = False
        self.plots: dict[str, LinePlot] = {}
        self.ui_map_path = os.environ.get("TDMPC2_LIVE_UI_MAP")
        self.stats_path = os.environ.get("TDMPC2_LIVE_STATS")

    # building ------------------------------------------------------------------------
    def build(self) -> None:
        dpg.create_context()
        dpg.configure_app(manual_callback_management=True)
        theme.load_fonts()
        theme.apply_dark_theme()
        self._themes = {
            name: theme.text_theme(colour)
            for name, colour in dict(
                muted=theme.MUTED,
                warning=theme.WARNING,
                danger=theme.DANGER,
                good=theme.GOOD,
                accent=theme.ACCENT,
            ).items()
        }
        with dpg.texture_registry():
            dpg.add_raw_texture(
                FRAME_W,
                FRAME_H,
                self._frame_buffer,
                format=dpg.mvFormat_Float_rgb,
                tag="frame_texture",
            )
        with dpg.window(tag="main", no_scrollbar=True):
            self._build_menu()
            with dpg.group(horizontal=True):
                with dpg.child_window(tag="left", border=False):
                    self._build_viewport()
                    self._build_controls()
                with dpg.child_window(tag="right", border=False):
                    self._build_charts()
                    self._build_workers()
            with dpg.child_window(tag="statusbar", height=28, border=False, no_scrollbar=True):
                with dpg.group(horizontal=True):
                    dpg.add_text("", tag="status_run")
                    dpg.add_text("", tag="status_machine")
                    dpg.add_text("", tag="status_fps")
                    dpg.add_text("", tag="status_message")
        self._build_dialogs()
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

    def _build_menu(self) -> None:
        with dpg.menu_bar():
            with dpg.menu(label="Run"):
                dpg.add_menu_item(label="New run...", callback=self._show_new_run)
                dpg.add_menu_item(
                    label="Resume run directory...",
                    callback=lambda: self._pick_directory("resume"),
                )
                dpg.add_menu_item(
                    label="Attach to a running run...",
                    callback=lambda: self._pick_directory("attach"),
                )
                dpg.add_separator()
                dpg.add_menu_item(label="Save checkpoint", callback=self.controller.checkpoint)
                dpg.add_menu_item(label="Stop run", callback=self.controller.stop)
                dpg.add_separator()
                dpg.add_menu_item(label="Quit    Ctrl+Q", callback=self._quit)
            with dpg.menu(label="View"):
                dpg.add_menu_item(
                    label="Window screenshot", callback=lambda: self._window_screenshot()
                )
            with dpg.menu(label="Help"):
                dpg.add_menu_item(label="Shortcuts and knobs    F1", callback=self._toggle_help)

    def _build_viewport(self) -> None:
        with dpg.drawlist(width=FRAME_W, height=FRAME_H, tag="viewport_draw"):
            dpg.draw_rectangle((0, 0), (FRAME_W, FRAME_H), fill=(0, 0, 0, 255), tag="viewport_bg")
            dpg.draw_image("frame_texture", (0, 0), (FRAME_W, FRAME_H), tag="viewport_image")
            dpg.draw_rectangle(
                (0, 0), (10, 10), fill=(0, 0, 0, 150), color=(0, 0, 0, 0), tag="overlay_bg"
            )
            dpg.draw_text((8, 6), "", size=16, color=(*theme.TEXT, 255), tag="overlay_1")
            dpg.draw_text((8, 26), "", size=15, color=(*theme.MUTED, 255), tag="overlay_2")
            dpg.draw_text((8, 46), "", size=15, color=(*theme.WARNING, 255), tag="overlay_3")
        with dpg.group(horizontal=True):
            dpg.add_combo([], tag="camera", width=150, callback=self._on_camera)
            dpg.add_combo(["merged"], default_value="merged", tag="source", width=150)
            dpg.set_item_callback("source", self._on_source)
            dpg.add_button(
                label="Pause rendering", tag="render_pause", callback=self._toggle_render
            )
        with dpg.group(horizontal=True):
            dpg.add_button(label="Reset episode", callback=self.controller.reset_showcase)
            dpg.add_button(label="Screenshot", callback=self._screenshot)
            dpg.add_button(label="Record clip", tag="record", callback=self._toggle_record)

    def _build_controls(self) -> None:
        dpg.add_spacer(height=4)
        dpg.add_text("Speed knobs", tag="knobs_title")
        dpg.bind_item_theme("knobs_title", self._themes["accent"])
        ranges = knob_ranges()
        with dpg.table(header_row=False, tag="knob_table", policy=dpg.mvTable_SizingStretchProp):
            dpg.add_table_column(init_width_or_weight=1.1)
            dpg.add_table_column(init_width_or_weight=1.3)
            dpg.add_table_column(init_width_or_weight=0.8)
            for name, label in KNOB_LABELS.items():
                low, high = (int(v) for v in ranges[name])
                with dpg.table_row():
                    dpg.add_text(label)
                    kwargs = dict(
                        tag=f"knob_{name}",
                        min_value=low,
                        max_value=high,
                        width=-1,
                        callback=self._on_knob,
                        user_data=name,
                    )
                    if name in TYPED_KNOBS:
                        dpg.add_input_int(
                            step=TYPED_KNOBS[name],
                            min_clamped=True,
                            max_clamped=True,
                            on_enter=True,
                            **kwargs,
                        )
                    else:
                        dpg.add_slider_int(clamped=True, **kwargs)
                    dpg.add_text("", tag=f"knob_applied_{name}")
        with dpg.group(horizontal=True):
            dpg.add_button(label="Pause training", tag="train_pause", callback=self._toggle_train)
            dpg.add_button(label="Save checkpoint", callback=self.controller.checkpoint)
            dpg.add_button(label="Stop run", callback=self.controller.stop)
            dpg.add_button(
                label="Restart crashed", tag="restart", callback=self.controller.restart_crashed
            )
        with dpg.group(horizontal=True):
            dpg.add_button(
                label="Add worker", tag="add_worker", callback=self.controller.add_worker
            )
            with dpg.tooltip("add_worker"):
                dpg.add_text("A new worker starts from the merged weights at the others' step.")
            dpg.add_button(
                label="Remove worker", tag="remove_worker", callback=self.controller.remove_worker
            )
            with dpg.tooltip("remove_worker"):
                dpg.add_text("The newest merging worker writes a checkpoint and leaves the run.")

    def _build_workers(self) -> None:
        dpg.add_spacer(height=4)
        dpg.add_text("Workers", tag="workers_title")
        dpg.bind_item_theme("workers_title", self._themes["accent"])
        with dpg.table(
            tag="worker_table",
            header_row=True,
            policy=dpg.mvTable_SizingStretchProp,
            row_background=True,
            borders_innerH=True,
        ):
            for label in ("worker", "state", "step", "speed", "return", "merges"):
                dpg.add_table_column(label=label)

    def _build_charts(self) -> None:
        with dpg.group(tag="startup", show=False):
            dpg.add_text("", tag="startup_text")
            dpg.add_progress_bar(tag="startup_bar", width=-1)
        self.plots["returns"] = LinePlot("returns", "episode return", height=360)
        with dpg.group(horizontal=True):
            dpg.add_radio_button(
                ["agent steps", "wall time"],
                tag="x_axis",
                horizontal=True,
                default_value="agent steps",
                callback=self._on_chart_options,
            )
            dpg.add_text("smoothing")
            dpg.add_slider_float(
                tag="smoothing",
                min_value=0.0,
                max_value=0.99,
                default_value=0.0,
                width=140,
                clamped=True,
                callback=self._on_chart_options,
            )
            dpg.add_checkbox(label="autoscale", tag="autoscale", default_value=True)
        with dpg.tab_bar(tag="tabs"):
            with dpg.tab(label="Steps/s"):
                self.plots["speed"] = LinePlot("speed", "agent steps / s", height=-1)
            with dpg.tab(label="Losses"):
                dpg.add_combo(
                    list(LOSSES),
                    default_value="total_loss",
                    tag="loss_name",
                    width=200,
                    callback=self._on_chart_options,
                )
                self.plots["losses"] = LinePlot("losses", "loss", height=-1)
            with dpg.tab(label="Merge distance"):
                self.plots["distances"] = LinePlot(
                    "distances", "distance from the average", height=-1
                )
            with dpg.tab(label="Log", tag="log_tab"):
                dpg.add_input_text(
                    tag="log", multiline=True, readonly=True, width=-1, height=-1, tracked=True
                )

    def _build_dialogs(self) -> None:
        with dpg.window(
            label="Help", tag="help", show=False, modal=False, width=620, height=410, pos=(300, 110)
        ):
            dpg.add_text(HELP)
        with dpg.window(
            label="New run", tag="new_run", show=False, modal=True, width=460, pos=(420, 180)
        ):
            dpg.add_combo(tasks(), label="task", tag="new_task", default_value="cartpole-balance")
            dpg.add_combo([str(s) for s in model_sizes()], label="model size (M)", tag="new_size")
            dpg.add_input_int(
                label="workers", tag="new_workers", default_value=2, min_value=1, max_value=16
            )
            dpg.add_input_int(
                label="merge every",
                tag="new_merge",
                default_value=500,
                min_value=1,
                max_value=10_000_000,
                min_clamped=True,
                max_clamped=True,
                step=500,
            )
            dpg.add_checkbox(label="add a control worker (never merges)", tag="new_control")
            dpg.add_checkbox(
                label="reduced planning for CPU (128 samples x 2 iterations)",
                tag="new_cpu_planning",
                default_value=not cuda_available(),
            )
            dpg.add_combo(["auto", "cpu", "cuda"], label="device", tag="new_device")
            dpg.set_value("new_device", "auto")
            dpg.add_input_text(label="run directory", tag="new_dir", hint="runs/TASK-TIME")
            dpg.add_text("", tag="new_error", wrap=420)
            dpg.bind_item_theme("new_error", self._themes["danger"])
            with dpg.group(horizontal=True):
                dpg.add_button(label="Start", callback=self._start_new_run)
                dpg.add_button(label="Cancel", callback=lambda: dpg.hide_item("new_run"))
        dpg.add_file_dialog(
            directory_selector=True,
            show=False,
            tag="dir_dialog",
            width=700,
            height=420,
            callback=self._on_directory,
        )

    def _build_shortcuts(self) -> None:
        with dpg.handler_registry():
            dpg.add_key_press_handler(dpg.mvKey_Spacebar, callback=self._key_space)
            dpg.add_key_press_handler(dpg.mvKey_Back, callback=self._key_backspace)
            dpg.add_key_press_handler(dpg.mvKey_P, callback=self._key_ctrl(self._screenshot))
            dpg.add_key_press_handler(dpg.mvKey_R, callback=self._key_ctrl(self._toggle_record))
            dpg.add_key_press_handler(dpg.mvKey_Q, callback=self._key_ctrl(self._quit))
            dpg.add_key_press_handler(dpg.mvKey_F1, callback=self._toggle_help)
            # Any input keeps the window at full frame rate for a moment (see run()).
            for add in (dpg.add_mouse_move_handler, dpg.add_mouse_wheel_handler):
                add(callback=self._activity)
            dpg.add_mouse_click_handler(callback=self._activity)
            dpg.add_key_down_handler(callback=self._activity)

    # layout --------------------------------------------------------------------------
    def _layout(self) -> None:
        width = dpg.get_viewport_client_width()
        height = dpg.get_viewport_client_height()
        body = max(200, height - 28 - 46)
        left = max(440, int(width * 0.4))
        dpg.configure_item("left", width=left, height=body)
        dpg.configure_item("right", width=max(300, width - left - 28), height=body)
        image_w = left - 24
        # The image takes what the controls below it leave (they scroll on small screens).
        image_h = min(int(image_w * FRAME_H / FRAME_W), max(240, body - 330))
        image_w = int(image_h * FRAME_W / FRAME_H)
        dpg.configure_item("viewport_draw", width=image_w, height=image_h)
        dpg.configure_item("viewport_bg", pmax=(image_w, image_h))
        dpg.configure_item("viewport_image", pmax=(image_w, image_h))
        workers = 64 + 27 * max(2, self._worker_rows)
        # The returns chart gives way first, so the tabbed charts keep a readable height
        # (TAB_MIN) as workers are added.
        startup = 56 if self._startup_shown else 0  # the start-up progress bar above the charts
        returns = max(200, min(int(body * 0.46), body - workers - 110 - TAB_MIN)) - startup
        self.plots["returns"].set_height(returns)
        tab_height = max(120, body - startup - returns - workers - 110)
        for name in ("speed", "losses", "distances"):
            self.plots[name].set_height(tab_height)
        dpg.configure_item("log", height=tab_height)

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
        self._ui_map_written = False
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
                if frames == 30 and self.ui_map_path and not self._ui_map_written:
                    self._ui_map_written = True
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
            self._toggle_record()
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
                self._notify(f"error: window update failed ({type(err).__name__}: {err})")

    def tick(self) -> None:
        """Every loop turn, drawn or not: send knob changes, show notices."""
        self._flush_knobs()
        while not self.controller.notices.empty():
            self._notify(self.controller.notices.get())
            self.changed = True

    def _news(self) -> bool:
        """A new showcase frame or new numbers wait to be shown."""
        seq = self.controller.frame_sequence()  # odd while the player writes
        new_frame = seq > 0 and seq % 2 == 0 and seq != self.frame_seq
        return new_frame or self.controller.view.version != self.view.version

    def prepare_frame(self) -> None:
        """Before a frame is drawn: the newest showcase frame into the texture, the newest
        view into the widgets. Skipped frames are never copied (latest wins)."""
        self._update_frame()
        view = self.controller.view
        if view.version != self.view.version:
            self.view = view
            self._apply_view(view)
        self._update_hover()
        if len(self.frame_times) > 10:
            fps = len(self.frame_times) / sum(self.frame_times)
            dpg.set_value("status_fps", f"  |  window {fps:.0f} fps")

    def _update_frame(self) -> None:
        got = self.controller.read_frame()
        if got is None:
            return
        frame, info = got
        if info["sequence"] == self.frame_seq:
            return
        self.frame_seq, self.frame_info, self.last_frame = info["sequence"], info, frame
        self.changed = True
        if frame.shape != (FRAME_H, FRAME_W, 3):
            return
        np.multiply(frame.reshape(-1), 1.0 / 255.0, out=self._frame_buffer)
        dpg.set_value("frame_texture", self._frame_buffer)
        if self.recorder is not None:
            self.recorder.add(frame)
        self._update_overlay()

    def _update_overlay(self) -> None:
        info, view = self.frame_info or {}, self.view
        source = info.get("source", -1)
        whose = "merged weights" if source in (-1, None) else f"worker {source}'s weights"
        weights_step = info.get("weights_step", -1)
        weights = (
            "untrained" if weights_step is None or weights_step < 0 else f"step {weights_step:,}"
        )
        line1 = f"{view.task}  ·  {whose} ({weights})"
        episode, t, ret = info.get("episode", 0) + 1, info.get("step", 0), info.get("return", 0.0)
        line2 = f"episode {episode}  ·  t {t}  ·  return {ret:.1f}"
        pace = info.get("pace", 1.0)
        if pace < 0.95:  # the player is held to a CPU budget: say that this is slow motion
            line2 += f"  ·  slow motion {pace:.2f}x"
        flags = []
        if self.render_paused:
            flags.append("rendering paused (Space)")
        if self.recorder is not None:
            flags.append(f"REC {self.recorder.frames_written} frames")
        # Drawn text is an item setting, not a value.
        dpg.configure_item("overlay_1", text=line1)
        dpg.configure_item("overlay_2", text=line2)
        dpg.configure_item("overlay_3", text="   ".join(flags))
        width = 9 * max(len(line1), len(line2)) + 10
        dpg.configure_item("overlay_bg", pmax=(width, 66 if flags else 48))

    # view -> widgets -------------------------------------------------------------------
    def _apply_view(self, view: View) -> None:
        phase = {
            "running": "",
            "starting": "starting...",
            "stopping": "stopping: workers write checkpoints...",
            "stopped": "stopped",
            "idle": "no run: Run > New run",
        }[view.phase]
        where = f"{view.run_path}" + (" (attached)" if view.attached else "")
        dpg.set_value("status_run", f"{where} {phase}".strip())
        dpg.set_value("status_machine", f"  |  {view.machine}" if view.machine else "")
        if (view.startup is not None) != self._startup_shown:
            self._startup_shown = view.startup is not None
            (dpg.show_item if self._startup_shown else dpg.hide_item)("startup")
            self._layout()
        if view.startup is not None:
            fraction, text = view.startup
            dpg.set_value("startup_text", text)
            dpg.set_value("startup_bar", fraction)
            dpg.configure_item("startup_bar", overlay=f"{fraction * 100:.0f}%")
        self._apply_knobs(view)
        self._apply_workers(view)
        dpg.set_item_label("train_pause", "Resume training" if view.paused else "Pause training")
        autoscale = dpg.get_value("autoscale")
        extra = {"published TD-MPC2 (5M, 3 seeds)": view.published} if view.published else {}
        self.plots["returns"].update(
            view.returns, autoscale, extra=extra, merges=view.merge_marks, knobs=view.knob_marks
        )
        self.plots["speed"].update(view.speed, autoscale, merges=view.merge_marks)
        self.plots["losses"].update(view.losses, autoscale, knobs=view.knob_marks)
        self.plots["distances"].update(view.distances, autoscale, merges=view.merge_marks)
        x_label = (
            "wall time (s)" if self.controller.options.wall_axis else "agent steps (per worker)"
        )
        for plot in self.plots.values():
            plot.set_x_label(x_label)
        if view.cameras != self._shown_cameras:
            self._shown_cameras = view.cameras
            dpg.configure_item("camera", items=view.cameras)
            if view.cameras:
                dpg.set_value("camera", view.cameras[0])
        if view.sources != self._shown_sources:
            self._shown_sources = view.sources
            dpg.configure_item("source", items=view.sources)
        new_errors = view.error_count - self._errors_shown
        if new_errors > 0:
            for line in view.errors[-min(new_errors, len(view.errors)) :]:
                self._notify(f"error: {line}")
            self._errors_shown = view.error_count

    def _apply_knobs(self, view: View) -> None:
        for row in view.knobs:
            tag = f"knob_{row.name}"
            if row.name not in self.pending_knobs and not dpg.is_item_active(tag):
                dpg.set_value(tag, int(row.requested))
            text = dpg.get_value(f"knob_applied_{row.name}")
            new = row.applied_text
            if text != new:
                dpg.set_value(f"knob_applied_{row.name}", new)
                style = "danger" if row.error else "warning" if row.pending else "muted"
                dpg.bind_item_theme(f"knob_applied_{row.name}", self._themes[style])

    def _apply_workers(self, view: View) -> None:
        rows = view.workers
        if len(rows) != self._worker_rows:
            for child in dpg.get_item_children("worker_table", 1) or []:
                dpg.delete_item(child)
            for i in range(len(rows)):
                with dpg.table_row(parent="worker_table"):
                    for column in ("worker", "state", "step", "speed", "return", "merges"):
                        dpg.add_text("", tag=f"cell_{i}_{column}")
            self._worker_rows = len(rows)
            self._layout()
        for i, row in enumerate(rows):
            for column in ("worker", "state", "step", "speed", "return", "merges"):
                dpg.set_value(f"cell_{i}_{column}", row[column])
            style = (
                "danger" if row["problem"] else "good" if row["state"] == "training" else "muted"
            )
            dpg.bind_item_theme(f"cell_{i}_state", self._themes[style])
        crashed = any(r["state"] == "crashed" for r in rows)
        dpg.configure_item("restart", enabled=crashed)

    def _update_hover(self) -> None:
        for plot in self.plots.values():
            if dpg.is_item_hovered(plot.plot):
                x, y = dpg.get_plot_mouse_pos()
                plot.show_hover(nearest_point(plot.lines, x, y, plot.x_span(), plot.y_span()))
            else:
                plot.show_hover(None)

    # callbacks -----------------------------------------------------------------------
    def _activity(self, *_) -> None:
        self.pacer.input(time.monotonic())

    def _input_seen(self) -> bool:
        """Input over the window since the last tick, asked of the X server (no frame drawn)."""
        if self.input_watch is None:
            return False
        width, height = dpg.get_viewport_client_width(), dpg.get_viewport_client_height()
        return self.input_watch.poll(width, height)

    def _on_knob(self, sender, value, name) -> None:
        self.pending_knobs[name] = int(value)
        self.pending_since = time.monotonic()

    def _flush_knobs(self) -> None:
        """Send knob changes once the slider rests: one version per gesture, not per pixel."""
        if not self.pending_knobs or time.monotonic() - self.pending_since < KNOB_DEBOUNCE_S:
            return
        if any(dpg.is_item_active(f"knob_{name}") for name in self.pending_knobs):
            return
        changes, self.pending_knobs = self.pending_knobs, {}
        self.controller.set_knobs(**changes)

    def _on_chart_options(self, *_) -> None:
        self.controller.options = replace(
            self.controller.options,
            wall_axis=dpg.get_value("x_axis") == "wall time",
            smoothing=float(dpg.get_value("smoothing")),
            loss=dpg.get_value("loss_name"),
        )

    def _on_camera(self, sender, value) -> None:
        if value in self._shown_cameras:
            self.controller.set_showcase(camera=self._shown_cameras.index(value))

    def _on_source(self, sender, value) -> None:
        if value in self._shown_sources:
            self.controller.set_showcase(source=self._shown_sources.index(value) - 1)

    def _toggle_render(self, *_) -> None:
        self.render_paused = not self.render_paused
        self.controller.pause_rendering(self.render_paused)
        dpg.set_item_label(
            "render_pause", "Resume rendering" if self.render_paused else "Pause rendering"
        )
        self._update_overlay()

    def _toggle_train(self, *_) -> None:
        self.controller.pause(not self.view.paused)

    def _media_dir(self) -> Path:
        return Path(self.view.run_path or ".") / "media"

    def _screenshot(self, *_) -> None:
        if self.last_frame is None:
            self._notify("refused: no frame to save yet")
            return
        try:
            path = save_screenshot(self.last_frame, self._media_dir())
        except OSError as err:
            self._notify(f"error: screenshot not saved ({err.strerror})")
            return
        self._notify(f"screenshot saved: {path}")

    def _window_screenshot(self) -> None:
        path = self._media_dir() / f"window-{time.strftime('%Y%m%d-%H%M%S')}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        dpg.output_frame_buffer(file=str(path))
        self._notify(f"window screenshot saved: {path}")

    def _toggle_record(self, *_) -> None:
        if self.recorder is None:
            try:
                self.recorder = ClipRecorder(self._media_dir())
            except OSError as err:
                self._notify(f"error: cannot record ({err.strerror})")
                return
            dpg.set_item_label("record", "Stop recording")
            self._notify(f"recording to {self.recorder.path}")
        else:
            recorder, self.recorder = self.recorder, None
            path = recorder.stop()
            dpg.set_item_label("record", "Record clip")
            if recorder.error:
                self._notify(f"error: clip not written ({recorder.error})")
            else:
                self._notify(f"clip saved: {path} ({recorder.frames_written} frames)")
        self._update_overlay()

    def _typing(self) -> bool:
        """True while a text field has the keyboard, so shortcuts do not fire."""
        return dpg.is_item_shown("new_run") or dpg.is_item_shown("dir_dialog")

    def _key_space(self, *_) -> None:
        if not self._typing():
            self._toggle_render()

    def _key_backspace(self, *_) -> None:
        if not self._typing() and not any(
            dpg.is_item_active(f"knob_{name}") for name in KNOB_LABELS
        ):
            self.controller.reset_showcase()

    def _key_ctrl(self, action: Callable) -> Callable:
        def handler(*_) -> None:
            if dpg.is_key_down(dpg.mvKey_LControl) or dpg.is_key_down(dpg.mvKey_RControl):
                action()

        return handler

    def _toggle_help(self, *_) -> None:
        (dpg.hide_item if dpg.is_item_shown("help") else dpg.show_item)("help")

    def _quit(self, *_) -> None:
        self.quit_requested = True

    def _show_new_run(self) -> None:
        dpg.set_value("new_error", "")
        if not dpg.get_value("new_size"):
            dpg.set_value("new_size", "1")
        dpg.show_item("new_run")

    def _start_new_run(self) -> None:
        from viewer.runs import new_run

        try:
            make = new_run(
                task=dpg.get_value("new_task"),
                model_size=int(dpg.get_value("new_size") or 1),
                workers=int(dpg.get_value("new_workers")),
                merge_every=int(dpg.get_value("new_merge")),
                control_worker=bool(dpg.get_value("new_control")),
                device=dpg.get_value("new_device") or "auto",
                run_dir=dpg.get_value("new_dir").strip() or None,
                cpu_planning=bool(dpg.get_value("new_cpu_planning")),
            )
        except Exception as err:  # bad input: shown in the dialog, nothing started
            dpg.set_value("new_error", str(err))
            return
        dpg.hide_item("new_run")
        self.controller.open(make)

    def _pick_directory(self, purpose: str) -> None:
        dpg.set_item_user_data("dir_dialog", purpose)
        dpg.configure_item("dir_dialog", label=f"{purpose.capitalize()}: choose a run directory")
        dpg.show_item("dir_dialog")

    def _on_directory(self, sender, app_data) -> None:
        from viewer.runs import attach_run, resume_run

        path = app_data.get("file_path_name", "")
        purpose = dpg.get_item_user_data("dir_dialog")
        self.controller.open((attach_run if purpose == "attach" else resume_run)(path))

    # messages ------------------------------------------------------------------------
    def _notify(self, message: str) -> None:
        colour = (
            theme.DANGER
            if message.startswith(("error", "refused"))
            else theme.WARNING
            if "crashed" in message
            else theme.MUTED
        )
        dpg.set_value("status_message", f"  |  {message}")
        dpg.bind_item_theme(
            "status_message",
            self._themes[
                "danger"
                if colour == theme.DANGER
                else "warning"
                if colour == theme.WARNING
                else "muted"
            ],
        )
        self._log(message)

    def _log(self, line: str) -> None:
        self.log_lines.append(f"{time.strftime('%H:%M:%S')}  {line}")
        dpg.set_value("log", "\n".join(self.log_lines))

    def _write_ui_map(self) -> None:
        """Screen rectangles of the main controls, for end-to-end tests that drive real input."""
        tags = ["viewport_draw", "render_pause", "record", "train_pause", "worker_table"]
        tags += [f"knob_{name}" for name in KNOB_LABELS] + [p.plot for p in self.plots.values()]
        rects = {}
        for tag in tags:
            state = dpg.get_item_state(tag)
            if "rect_min" in state:
                rects[str(tag)] = [*state["rect_min"], *state["rect_size"]]
        Path(self.ui_map_path).write_text(json.dumps(rects))
