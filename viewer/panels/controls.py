"""The run's buttons under the knobs: pause, checkpoint, stop, restart what crashed, add or
remove a worker. Each sends its command to the controller; nothing here waits."""

from __future__ import annotations

import dearpygui.dearpygui as dpg

from viewer.controller import Controller
from viewer.view import View
from workers.door import AddWorker, Checkpoint, Pause, RemoveWorker, RestartWorker, Resume, Stop


class ControlsPanel:
    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.view: View = controller.view  # the last view applied (paused or not)

    def build(self) -> None:
        c = self.controller
        with dpg.group(horizontal=True):
            dpg.add_button(label="Pause training", tag="train_pause", callback=self._toggle_train)
            dpg.add_button(label="Save checkpoint", callback=c.sender(Checkpoint()))
            dpg.add_button(label="Stop run", callback=c.sender(Stop()))
            dpg.add_button(
                label="Restart crashed", tag="restart", callback=c.sender(RestartWorker())
            )
        with dpg.group(horizontal=True):
            dpg.add_button(label="Add worker", tag="add_worker", callback=c.sender(AddWorker()))
            with dpg.tooltip("add_worker"):
                dpg.add_text("A new worker starts from the merged weights at the others' step.")
            dpg.add_button(
                label="Remove worker", tag="remove_worker", callback=c.sender(RemoveWorker())
            )
            with dpg.tooltip("remove_worker"):
                dpg.add_text("The newest merging worker writes a checkpoint and leaves the run.")

    def apply(self, view: View) -> None:
        self.view = view
        crashed = any(r["state"] == "crashed" for r in view.workers)
        dpg.configure_item("restart", enabled=crashed)
        dpg.set_item_label("train_pause", "Resume training" if view.paused else "Pause training")

    def _toggle_train(self, *_) -> None:
        self.controller.send(Resume() if self.view.paused else Pause())
