"""The menu bar and the windows it opens: help, the new-run dialog, and the directory picker for
resuming or attaching to a run. A new run is the one the dialog's fields ask for as flags
(workers/cli/new_run.py), handed to the controller, which starts it off the GUI thread."""

from __future__ import annotations

from collections.abc import Callable

import dearpygui.dearpygui as dpg

from agent.config import OBS_KINDS
from agent.errors import UserError
from agent.knobs import knobs
from viewer.controller import Controller
from viewer.panels import TextStyles
from viewer.view import View
from workers.door import (
    Checkpoint,
    MakeMontage,
    RunSettings,
    Stop,
    cuda_available,
    demo_preset,
    model_sizes,
    new_run_from_dialog,
    tasks,
)

HELP = """Keyboard (as in the MuJoCo viewer, where they fit)
  Space       pause / resume rendering (training goes on)
  Backspace   reset the showcase episode
  Ctrl+P      screenshot of the viewport (PNG in the run's media/ folder;
              no run open: runs/media/)
  Ctrl+R      start / stop recording a clip (MP4, else GIF)
  F1          this help
  Ctrl+Q      quit (workers stop and write a checkpoint)

Knobs apply to every worker before its next agent step; the text beside each
slider shows the value the workers run with now until all have applied it.
Ctrl+click a slider to type a value; values outside the range cannot be entered.

Run > Start a race...: the workers split into lanes with their own knobs and
merge pools; the race table ranks them by their training return, normalised
between the race's start and its top and averaged over the race's training time.
"set for" above the knobs: one lane, or all; Promote lane ends the race.

Run > Make a montage: 8 episodes the workers kept (the album), from early to
late, replayed one after another into an MP4 in the run's media/ folder, each
with its step, return and the learning curve; a race's lanes side by side.
It renders in the background; the status line says how far and where.

Add worker: a new worker starts from the merged weights at the others' step.
Remove worker: the newest merging worker checkpoints and leaves the run; the
others merge without it, and a resumed run leaves it out.

Attached to a run (--attach): the training buttons ask the process that
started it; closing this window leaves that run training.

While nobody uses the window it draws about 2 frames a second on software GL
(new frames and numbers, within 0.04 of a core), so training keeps its speed;
any mouse or key input brings it back to full rate at once."""


class DialogsPanel:
    def __init__(
        self,
        controller: Controller,
        styles: TextStyles,
        quit: Callable[[], None],
        window_screenshot: Callable[[], None],
        start_race: Callable[[], None],
    ) -> None:
        self.controller = controller
        self.styles = styles
        self.quit = quit
        self.window_screenshot = window_screenshot
        self.start_race = start_race  # opens the race dialog (viewer/panels/race.py)

    def build_menu(self) -> None:
        """The main window's menu bar (built inside it, before its other widgets)."""
        with dpg.menu_bar():
            with dpg.menu(label="Run"):
                dpg.add_menu_item(label="New run...", callback=self.show_new_run)
                dpg.add_menu_item(
                    label="Resume run directory...",
                    callback=lambda: self.pick_directory("resume"),
                )
                dpg.add_menu_item(
                    label="Attach to a running run...",
                    callback=lambda: self.pick_directory("attach"),
                )
                dpg.add_separator()
                dpg.add_menu_item(label="Start a race...", callback=lambda: self.start_race())
                dpg.add_menu_item(
                    label="Save checkpoint", callback=self.controller.sender(Checkpoint())
                )
                dpg.add_menu_item(label="Stop run", callback=self.controller.sender(Stop()))
                dpg.add_separator()
                dpg.add_menu_item(
                    label="Make a montage",
                    tag="make_montage",
                    callback=self.controller.sender(MakeMontage()),
                )
                dpg.add_separator()
                dpg.add_menu_item(label="Quit    Ctrl+Q", callback=lambda: self.quit())
            with dpg.menu(label="View"):
                dpg.add_menu_item(
                    label="Window screenshot", callback=lambda: self.window_screenshot()
                )
            with dpg.menu(label="Help"):
                dpg.add_menu_item(label="Shortcuts and knobs    F1", callback=self.toggle_help)

    def build(self) -> None:
        """The dialog windows, hidden until asked for (built outside the main window)."""
        with dpg.window(
            label="Help", tag="help", show=False, modal=False, width=620, height=500, pos=(300, 90)
        ):
            dpg.add_text(HELP)
        with dpg.window(
            label="New run", tag="new_run", show=False, modal=True, width=460, pos=(420, 180)
        ):
            # Filled in as the CPU demo, within the merge knob's range (agent/knobs.py).
            demo, merge = demo_preset("cpu"), knobs()["merge_every"]
            dpg.add_combo(tasks(), label="task", tag="new_task", default_value=demo.task)
            dpg.add_input_text(
                label="or gymnasium id", tag="new_gym_task", hint="Hopper-v5, my_pkg.envs:Arm-v0"
            )
            dpg.add_combo([str(s) for s in model_sizes()], label="model size (M)", tag="new_size")
            dpg.add_combo(
                list(OBS_KINDS), label="observations", tag="new_obs", default_value="state"
            )
            with dpg.tooltip("new_obs"):
                dpg.add_text(
                    "state: the task's state vector. rgb: what a 64x64 camera sees, the last 3\n"
                    "frames (DMControl tasks; the agent's view pane shows them). From pixels a\n"
                    "step costs more (convolutions, rendering) and each worker keeps 100,000\n"
                    "steps of frames (1.2 GB)."
                )
            dpg.add_input_int(
                label="workers",
                tag="new_workers",
                default_value=demo.workers,
                min_value=1,
                max_value=16,
            )
            dpg.add_input_int(
                label="merge every",
                tag="new_merge",
                default_value=demo.merge_every or RunSettings.merge_every,
                min_value=int(merge.low),
                max_value=int(merge.high),
                min_clamped=True,
                max_clamped=True,
                step=merge.step,
            )
            dpg.add_checkbox(
                label="add a control worker (a lane of its own that never merges)",
                tag="new_control",
            )
            dpg.add_input_text(
                label="race lanes",
                tag="new_lanes",
                hint="workers=4; workers=1,merge=off (a lane per ';', empty: no race)",
            )
            with dpg.tooltip("new_lanes"):
                dpg.add_text(
                    "A lane per ';', each KEY=VALUE,...: live knobs (iterations=2), its size\n"
                    "(workers=N; lanes without one share the workers above) and merge=off\n"
                    "(its workers never merge). When every lane gives its size, their sum is\n"
                    "the run's workers (times the replicas)."
                )
            dpg.add_input_int(label="replicas", tag="new_replicas", default_value=1, width=100)
            with dpg.tooltip("new_replicas"):
                dpg.add_text(
                    "Every race lane this many times, each copy its own workers, seeds and\n"
                    "merge pool (replica r of every lane on the same environment seeds): the\n"
                    "race names a leader only when its lead holds across them."
                )
            dpg.add_checkbox(
                label="reduced planning for CPU (128 samples x 2 iterations)",
                tag="new_cpu_planning",
                default_value=not cuda_available(),
            )
            dpg.add_combo(["auto", "cpu", "cuda"], label="device", tag="new_device")
            dpg.set_value("new_device", "auto")
            dpg.add_input_text(label="run directory", tag="new_dir", hint="runs/TASK-TIME")
            dpg.add_text("", tag="new_error", wrap=420)
            self.styles.bind("new_error", "danger")
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

    def apply(self, view: View) -> None:
        """Nothing in the dialogs follows the run."""

    def typing(self) -> bool:
        """True while a dialog with text fields is open, so shortcuts do not fire."""
        return dpg.is_item_shown("new_run") or dpg.is_item_shown("dir_dialog")

    def toggle_help(self, *_) -> None:
        (dpg.hide_item if dpg.is_item_shown("help") else dpg.show_item)("help")

    def show_new_run(self) -> None:
        dpg.set_value("new_error", "")
        if not dpg.get_value("new_size"):
            dpg.set_value("new_size", "1")
        dpg.show_item("new_run")

    def _start_new_run(self) -> None:
        try:
            make = new_run_from_dialog(
                task=dpg.get_value("new_gym_task").strip() or dpg.get_value("new_task"),
                model_size=int(dpg.get_value("new_size") or 1),
                workers=int(dpg.get_value("new_workers")),
                merge_every=int(dpg.get_value("new_merge")),
                control_worker=bool(dpg.get_value("new_control")),
                device=dpg.get_value("new_device") or "auto",
                run_dir=dpg.get_value("new_dir").strip() or None,
                cpu_planning=bool(dpg.get_value("new_cpu_planning")),
                lanes=dpg.get_value("new_lanes"),
                replicas=int(dpg.get_value("new_replicas")),
                obs=dpg.get_value("new_obs") or "state",
            ).create
        except Exception as err:  # bad input: shown in the dialog, nothing started
            dpg.set_value("new_error", str(err))
            return
        dpg.hide_item("new_run")
        self.controller.open(make)

    def pick_directory(self, purpose: str) -> None:
        dpg.set_item_user_data("dir_dialog", purpose)
        dpg.configure_item("dir_dialog", label=f"{purpose.capitalize()}: choose a run directory")
        dpg.show_item("dir_dialog")

    def _on_directory(self, sender, app_data) -> None:
        from viewer.runs import attach_run, resume_run

        path = app_data.get("file_path_name", "")
        purpose = dpg.get_item_user_data("dir_dialog")
        try:
            make = (attach_run if purpose == "attach" else resume_run)(path)
        except UserError as err:  # no run there: refused, and the run shown goes on
            self.controller.notices.put(f"refused: {err}")
            return
        self.controller.open(make)
