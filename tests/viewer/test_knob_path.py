"""A knob's path from the window's slider to the planner, followed call by call as the program
runs it: the window's half on a real run whose processes never start (the knob panel in a Dear
PyGui context without a viewport, the controller's thread, the run's one dispatch, the knob
record on disk), then a worker's half in this process (its hooks after an agent step, the record
read and checked, the agent's config, a plan). Each call that ARCHITECTURE.md draws must be one
the program made on that way, the CPU's eager path a worker takes."""

import re
import sys
import threading
from pathlib import Path

import dearpygui.dearpygui as dpg
import pytest
import torch
from conftest import tiny_run
from helpers.process_fakes import OBS_DIM, FakeTrainer, link, worker_spec

from viewer.controller import Controller
from viewer.panels import TextStyles
from viewer.panels.knobs import KNOB_DEBOUNCE_S, KnobsPanel
from workers.door import Run, RunSettings
from workers.rundir.knob_record import KnobStore
from workers.training.hooks import WorkerHooks

ROOT = Path(__file__).resolve().parents[2]
ROOMS = tuple(str(ROOT / room) for room in ("agent", "workers", "viewer"))


def drawn_path() -> list[tuple[str, str]]:
    """ARCHITECTURE.md's knob path: (caller, callee) per numbered line."""
    text = (ROOT / "ARCHITECTURE.md").read_text().split("## A knob")[1].split("\n## ")[0]
    return re.findall(r"^\d+\. `([\w.]+)` -> `([\w.]+)`", text, flags=re.M)


class Calls:
    """Who called whom (qualified names) among the rooms' functions, in every thread, while on."""

    def __init__(self) -> None:
        self.made: set[tuple[str, str]] = set()

    def _profile(self, frame, event, arg):
        if event == "call" and frame.f_back is not None:
            callee, caller = frame.f_code, frame.f_back.f_code
            if callee.co_filename.startswith(ROOMS) and caller.co_filename.startswith(ROOMS):
                self.made.add((caller.co_qualname, callee.co_qualname))

    def __enter__(self) -> "Calls":
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)
        threading.setprofile(None)


@pytest.fixture
def knob_panel():
    dpg.create_context()
    try:
        yield dpg
    finally:
        dpg.destroy_context()


def test_a_knob_takes_the_path_architecture_md_draws(tmp_path, knob_panel):
    path = drawn_path()
    assert len(path) <= 8 and path[-1][1] == "plan", path
    run = Run.create(tmp_path / "run", tiny_run(100), RunSettings(workers=1, pack=1))
    # A worker of the run, in this process: its hooks applied the first version at its start.
    trainer = FakeTrainer(run.cfg, run.path, [0])
    spec = worker_spec(run.path, run.cfg, 0, merge_every=run.settings.merge_every)
    events = [threading.Event() for _ in range(3)]
    hooks = WorkerHooks([link(spec, "training")], trainer, *events)
    horizon = 2 if run.cfg.horizon != 2 else 3
    try:
        with Calls() as calls:
            controller = Controller((48, 64))
            controller._run = run  # the run as opened, without starting its processes
            with dpg.window():
                styles = TextStyles()
                styles.load()
                panel = KnobsPanel(controller.send, styles)
                panel.build()
            panel._on_knob(None, horizon, "horizon")  # the slider's callback
            panel.pending_since -= KNOB_DEBOUNCE_S  # it has come to rest
            panel.flush()
            assert controller.notices.get(timeout=60) == f"knobs v1: horizon={horizon}"
            trainer.step += 1
            hooks.after_step(trainer)
            trainer.agent.act(torch.zeros(OBS_DIM))
        controller.shutdown(timeout=30)
    finally:
        FakeTrainer.close_all()
    assert KnobStore(run.path).read()[1]["horizon"] == horizon
    assert trainer.agent.plan_knobs().horizon == horizon
    assert trainer.agent._warm_mean.shape[2] == horizon  # the plan the worker acted on
    missing = [
        (caller, callee)
        for caller, callee in path
        if not any(
            c == caller and made.rpartition(".")[2] == callee.rpartition(".")[2]
            for c, made in calls.made
        )
    ]
    assert missing == [], sorted(c for c in calls.made if c[0] in dict(path))
