"""The showcase panel: the policy acting in the viewport with its overlay, the camera and weights
choice, and what saves the picture (screenshots of the frame or the window, recorded clips).

Frames are copied from shared memory only when a new one is due to be drawn (latest wins); a clip
being recorded takes each of them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import dearpygui.dearpygui as dpg
import numpy as np

from viewer import theme
from viewer.controller import Controller
from viewer.recorder import ClipRecorder, media_dir, media_path, save_screenshot
from viewer.timeline import agent_labels, pane_label, pane_roles
from viewer.view import View
from workers.door import (
    ChooseShowcase,
    PaneInfo,
    PauseRendering,
    ResetShowcase,
    pane_boxes,
    pane_infos,
)

MAX_PANES = 4

FRAME_H, FRAME_W = 300, 400
MODE_LABELS = {"auto": "auto", "live": "live", "replay": "replay at 1x"}


class ShowcasePanel:
    def __init__(self, controller: Controller, notify: Callable[[str], None]) -> None:
        self.controller = controller
        self.notify = notify
        self.view: View = controller.view  # the last view applied (task, run directory)
        self.render_paused = False
        self.frame_seq = -1
        self.last_frame: np.ndarray | None = None
        self.frame_info: dict | None = None
        self.recorder: ClipRecorder | None = None
        self.shown: deque[tuple[float, dict]] = deque(maxlen=20_000)  # (time, info) per frame
        self._frame_buffer = np.zeros(FRAME_H * FRAME_W * 3, dtype=np.float32)
        self._shown_sources: list[str] = []
        self._source_ids: list[int] = []
        self._shown_cameras: list[str] = []
        self.image_size = (FRAME_W, FRAME_H)  # as drawn (fit)

    # building ------------------------------------------------------------------------
    def build_texture(self) -> None:
        """The frame's texture: a root item, so made before the window that draws it."""
        with dpg.texture_registry():
            dpg.add_raw_texture(
                FRAME_W,
                FRAME_H,
                self._frame_buffer,
                format=dpg.mvFormat_Float_rgb,
                tag="frame_texture",
            )

    def build(self) -> None:
        with dpg.drawlist(width=FRAME_W, height=FRAME_H, tag="viewport_draw"):
            dpg.draw_rectangle((0, 0), (FRAME_W, FRAME_H), fill=(0, 0, 0, 255), tag="viewport_bg")
            dpg.draw_image("frame_texture", (0, 0), (FRAME_W, FRAME_H), tag="viewport_image")
            dpg.draw_rectangle(
                (0, 0), (10, 10), fill=(0, 0, 0, 150), color=(0, 0, 0, 0), tag="overlay_bg"
            )
            dpg.draw_text((8, 6), "", size=16, color=(*theme.TEXT, 255), tag="overlay_1")
            dpg.draw_text((8, 26), "", size=15, color=(*theme.MUTED, 255), tag="overlay_2")
            dpg.draw_text((8, 46), "", size=15, color=(*theme.WARNING, 255), tag="overlay_3")
            for p in range(MAX_PANES):  # each pane's label, placed when panes show
                dpg.draw_rectangle(
                    (0, 0), (1, 1), fill=(0, 0, 0, 150), color=(0, 0, 0, 0), tag=f"pane_bg{p}"
                )
                dpg.draw_text((0, 0), "", size=14, color=(*theme.TEXT, 255), tag=f"pane_text{p}")
        with dpg.group(horizontal=True):
            dpg.add_combo([], tag="camera", width=150, callback=self._on_camera)
            dpg.add_combo(["merged"], default_value="merged", tag="source", width=150)
            dpg.set_item_callback("source", self._on_source)
            dpg.add_combo(
                list(MODE_LABELS.values()),
                default_value=MODE_LABELS["auto"],
                tag="showcase_mode",
                width=150,
                callback=self._on_mode,
            )
            with dpg.tooltip("showcase_mode"):
                dpg.add_text(
                    "live: the planner acts with the chosen weights now (slow motion on a CPU)\n"
                    "replay: their newest finished episode again, at real speed\n"
                    "auto: replay on a CPU when live play runs under half real speed"
                )
        with dpg.group(horizontal=True):
            dpg.add_button(label="Pause rendering", tag="render_pause", callback=self.toggle_render)
            dpg.add_button(label="Reset episode", callback=self.controller.sender(ResetShowcase()))
            dpg.add_button(label="Screenshot", callback=self.screenshot)
            dpg.add_button(label="Record clip", tag="record", callback=self.toggle_record)

    def fit(self, image_w: int, body: int) -> None:
        """Size the image to `image_w` wide, or less: it takes what the controls below it leave
        (they scroll on small screens)."""
        image_h = min(int(image_w * FRAME_H / FRAME_W), max(240, body - 380))
        image_w = int(image_h * FRAME_W / FRAME_H)
        dpg.configure_item("viewport_draw", width=image_w, height=image_h)
        dpg.configure_item("viewport_bg", pmax=(image_w, image_h))
        dpg.configure_item("viewport_image", pmax=(image_w, image_h))
        self.image_size = (image_w, image_h)

    # frames --------------------------------------------------------------------------
    def frame_waiting(self) -> bool:
        """A new showcase frame waits to be shown (asked without copying it)."""
        seq = self.controller.frame_sequence()  # odd while the player writes
        return seq > 0 and seq % 2 == 0 and seq != self.frame_seq

    def update_frame(self) -> bool:
        """Copy the newest frame into the texture; True when there was a new one."""
        got = self.controller.read_frame()
        if got is None:
            return False
        frame, info = got
        if info["sequence"] == self.frame_seq:
            return False
        self.frame_seq, self.frame_info, self.last_frame = info["sequence"], info, frame
        self.shown.append((time.perf_counter(), info))
        if frame.shape != (FRAME_H, FRAME_W, 3):
            return True
        np.multiply(frame.reshape(-1), 1.0 / 255.0, out=self._frame_buffer)
        dpg.set_value("frame_texture", self._frame_buffer)
        if self.recorder is not None:
            self.recorder.add(frame)
        self._update_overlay()
        return True

    def _update_overlay(self) -> None:
        info, view = self.frame_info or {}, self.view
        line1, line2 = overlay_lines(view.task, info)
        if info.get("panes", 0) >= 2:  # each pane has its own label
            line1 = line2 = ""
        if not info.get("renders", 1):
            line1 = f"{view.task}: this environment does not render (training goes on)"
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
        dpg.configure_item(
            "overlay_bg", pmax=(width, 66 if flags else 48), show=bool(line1 or flags)
        )
        self._update_pane_labels(pane_infos(info))
        labels = agent_labels((FRAME_H, FRAME_W), self.image_size[0] / FRAME_W)
        for p, (text, at, box) in enumerate(labels if info.get("agent_view") else []):
            dpg.configure_item(f"pane_text{p}", text=text, pos=at, show=True)
            dpg.configure_item(f"pane_bg{p}", pmin=box[0], pmax=box[1], show=True)

    def _update_pane_labels(self, panes: list[PaneInfo]) -> None:
        """Each pane's label at its top left (the frame's own overlay says what plays)."""
        race = self.view.race
        knobs = {row.lane: row.knobs for row in race.rows} if race is not None else {}
        image_w, image_h = self.image_size
        boxes = pane_boxes(image_h, image_w, len(panes)) if panes else []
        roles = pane_roles(len(panes), self.view.panes)
        for p in range(MAX_PANES):
            shown = p < len(panes)
            dpg.configure_item(f"pane_bg{p}", show=shown)
            dpg.configure_item(f"pane_text{p}", show=shown)
            if not shown:
                continue
            top, left, _, pane_w = boxes[p]
            text = pane_label(panes[p], knobs, roles[p])
            lines = text.split("\n")
            dpg.configure_item(f"pane_text{p}", text=text, pos=(left + 6, top + 4))
            right = min(left + pane_w - 2, left + 12 + 8 * max(map(len, lines)))
            size = (right, top + 8 + 17 * len(lines))
            dpg.configure_item(f"pane_bg{p}", pmin=(left + 2, top + 2), pmax=size)

    # view -> widgets -----------------------------------------------------------------
    def apply(self, view: View) -> None:
        self.view = view
        if view.cameras != self._shown_cameras:
            self._shown_cameras = view.cameras
            dpg.configure_item("camera", items=view.cameras)
            if view.cameras:
                dpg.set_value("camera", view.cameras[0])
        if view.sources != self._shown_sources:
            self._shown_sources, self._source_ids = view.sources, view.source_ids
            dpg.configure_item("source", items=view.sources)
        label = MODE_LABELS.get(view.showcase_mode)
        if label is not None and dpg.get_value("showcase_mode") != label:
            dpg.set_value("showcase_mode", label)
        if view.source in self._source_ids:  # chosen here, or by the run (a race's start)
            label = self._shown_sources[self._source_ids.index(view.source)]
            if dpg.get_value("source") != label:
                dpg.set_value("source", label)

    # callbacks -----------------------------------------------------------------------
    def _on_camera(self, sender, value) -> None:
        if value in self._shown_cameras:
            self.controller.send(ChooseShowcase(camera=self._shown_cameras.index(value)))

    def _on_source(self, sender, value) -> None:
        if value in self._shown_sources:
            source = self._source_ids[self._shown_sources.index(value)]
            self.controller.send(ChooseShowcase(source=source))

    def _on_mode(self, sender, value) -> None:
        mode = next((m for m, label in MODE_LABELS.items() if label == value), None)
        if mode is not None:
            self.controller.send(ChooseShowcase(mode=mode))

    def toggle_render(self, *_) -> None:
        self.render_paused = not self.render_paused
        self.controller.send(PauseRendering(self.render_paused))
        dpg.set_item_label(
            "render_pause", "Resume rendering" if self.render_paused else "Pause rendering"
        )
        self._update_overlay()

    def media_dir(self) -> Path:
        return media_dir(self.view.run_path)

    def screenshot(self, *_) -> None:
        if self.last_frame is None:
            self.notify("refused: no frame to save yet")
            return
        try:
            path = save_screenshot(self.last_frame, self.media_dir())
        except OSError as err:
            self.notify(f"error: screenshot not saved ({err.strerror})")
            return
        self.notify(f"screenshot saved: {path}")

    def window_screenshot(self, *_) -> None:
        path = media_path(self.media_dir(), "window", ".png")
        dpg.output_frame_buffer(file=str(path))
        self.notify(f"window screenshot saved: {path}")

    def toggle_record(self, *_) -> None:
        if self.recorder is None:
            try:
                self.recorder = ClipRecorder(self.media_dir())
            except OSError as err:
                self.notify(f"error: cannot record ({err.strerror})")
                return
            dpg.set_item_label("record", "Stop recording")
            self.notify(f"recording to {self.recorder.path}")
        else:
            recorder, self.recorder = self.recorder, None
            path = recorder.stop()
            dpg.set_item_label("record", "Record clip")
            if recorder.error:
                self.notify(f"error: clip not written ({recorder.error})")
            else:
                self.notify(f"clip saved: {path} ({recorder.frames_written} frames)")
        self._update_overlay()


def overlay_lines(task: str, info: dict) -> tuple[str, str]:
    """The viewport overlay's first two lines for a frame's info: what plays (live: whose
    weights; a replay: whose episode) and where in the episode it is."""
    source, t = info.get("source", -1), info.get("step", 0)
    if info.get("replay", 0):
        worker, step = info.get("replay_worker", 0), info.get("weights_step", 0)
        if info["replay"] == 2:
            episode = f"worker {worker}'s evaluation at step {step:,}"
        else:
            episode = f"worker {worker}'s episode {info.get('episode', 0)}, step {step:,}"
        line1 = ("PINNED  ·  " if info.get("pinned") else "") + f"REPLAY 1.0x  ·  {episode}"
        line2 = (
            f"t {t} / {info.get('replay_length', 0)}  ·  return {info.get('return', 0.0):.1f}"
            f" of {info.get('replay_return', 0.0):.1f}"
        )
        return line1, line2
    if source in (-1, None):
        whose = "merged weights"
    elif source <= -2:
        whose = f"lane {-2 - source}'s merged weights"
    else:
        whose = f"worker {source}'s weights"
    weights_step = info.get("weights_step", -1)
    weights = "untrained" if weights_step is None or weights_step < 0 else f"step {weights_step:,}"
    line1 = f"{task}  ·  LIVE  ·  {whose} ({weights})"
    line2 = (
        f"episode {info.get('episode', 0) + 1}  ·  t {t}  ·  return {info.get('return', 0.0):.1f}"
    )
    pace = info.get("pace", 1.0)
    if pace < 0.95:  # the player is held to a CPU budget: say that this is slow motion
        line2 += f"  ·  slow motion {pace:.2f}x"
    return line1, line2
