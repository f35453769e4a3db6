"""The timeline and the panes, on the window's side: album entries become points with their
recorded returns, the slider stands on the pinned episode (else the newest), a chart click
pins the nearest episode or says why not, each pane's label, and the panel's widgets send the
commands (built without a display: Dear PyGui items and callbacks need no viewport)."""

from types import SimpleNamespace

import dearpygui.dearpygui as dpg
import pytest

from viewer.panels.timeline import PANE_LABELS, TimelinePanel
from viewer.series import Series
from viewer.timeline import (
    TimelinePoint,
    chart_pick,
    pane_label,
    pane_roles,
    slider_index,
    timeline_points,
)
from viewer.view import View
from workers.door import AlbumEntry, PaneInfo, PinEpisode, ShowPanes


def series(*points: tuple[float, float]) -> Series:
    s = Series()
    for step, value in points:
        s.append(step, 0.0, value)
    return s


def album() -> list[TimelinePoint]:
    entries = [
        AlbumEntry(0, "train", 128, None),
        AlbumEntry(1, "train", 130, None),
        AlbumEntry(0, "eval", 500, None),
        AlbumEntry(0, "train", 2000, None),
    ]
    returns = {0: series((128, 5.0), (1000, 30.0), (2000, 80.0)), 1: series((130, 7.5))}
    evals = {0: series((500, 12.0))}
    return timeline_points(entries, returns, evals)  # type: ignore[arg-type]


def test_album_entries_become_points_with_their_recorded_returns():
    points = album()
    assert [(p.worker, p.kind, p.step, p.ret) for p in points] == [
        (0, "train", 128, 5.0),
        (1, "train", 130, 7.5),
        (0, "eval", 500, 12.0),
        (0, "train", 2000, 80.0),
    ]
    missing = timeline_points([AlbumEntry(3, "train", 64, None)], {}, {})  # type: ignore[arg-type]
    assert missing[0].ret is None and "return ?" in missing[0].label()
    assert points[2].label() == "step 500  ·  worker 0's evaluation  ·  return 12.0"
    assert points[2].pin == PinEpisode(0, "eval", 500)


def test_the_slider_stands_on_the_pinned_episode_else_on_the_newest():
    points = album()
    assert slider_index(points, None) == 3
    assert slider_index(points, (1, "train", 130)) == 1
    assert slider_index(points, (1, "train", 999)) == 3  # thinned out since: the newest
    assert slider_index([], None) == 0


def test_a_chart_click_pins_the_nearest_episode_within_reach():
    points = album()
    assert chart_pick(points, 1900, wall_axis=False) == (points[3], "")
    assert chart_pick(points, 131, wall_axis=False)[0] == points[1]
    point, why = chart_pick(points, 1200, wall_axis=False)  # reach: 5 % of 1,872 steps, >= 100
    assert point is None and why == "refused: the album keeps no episode near step 1,200"
    assert chart_pick(points, 500, wall_axis=True)[1].startswith("refused: pick an episode")
    assert chart_pick([], 500, wall_axis=False)[1].endswith("has no episode yet")


def test_each_pane_says_whose_episode_and_a_lanes_pane_its_knobs():
    assert pane_label(PaneInfo(1, 2, 4096, 812.34, -1)) == (
        "worker 1 eval, step 4,096\nreturn 812.3"
    )
    lane = pane_label(PaneInfo(2, 1, 300, 12.0, 1), {1: {"merge_every": 1000}})
    assert lane == "lane 1: merge_every=1000\nworker 2 train, step 300\nreturn 12.0"
    assert pane_label(PaneInfo(0, 1, 64, 1.0, -1), role="then").startswith("then: worker 0")
    assert pane_roles(4, "then-now-4") == ["then", "later", "later", "now"]
    assert pane_roles(2, "lanes") == ["", ""]
    assert pane_label(PaneInfo(lane=0)) == "lane 0: no episode yet"
    assert pane_label(PaneInfo()) == "no episode yet"


@pytest.fixture
def panel():
    sent: list = []
    notices: list[str] = []
    controller = SimpleNamespace(send=sent.append, options=SimpleNamespace(wall_axis=False))
    panel = TimelinePanel(controller, notices.append)  # type: ignore[arg-type]
    dpg.create_context()
    with dpg.window():
        panel.build()
    yield panel, sent, notices
    dpg.destroy_context()


def test_the_panel_sends_pins_panes_and_newest_as_commands(panel):
    panel, sent, notices = panel
    points = album()
    panel.apply(View(version=1, phase="running", album=points, pin=None))
    assert dpg.get_item_configuration("timeline")["max_value"] == 3
    assert dpg.get_value("timeline") == 3 and panel.label().startswith("newest episodes")
    slide = dpg.get_item_callback("timeline")
    slide("timeline", 0)
    slide("timeline", 0)  # the same point again (a drag's repeats): sent once
    assert sent == [PinEpisode(0, "train", 128)]
    panel.apply(View(version=2, phase="running", album=points, pin=(0, "train", 128)))
    assert dpg.get_value("timeline") == 0 and panel.label().startswith("pinned (looping): step 128")
    dpg.get_item_callback("timeline_newest")("timeline_newest", None)
    dpg.get_item_callback("panes")("panes", PANE_LABELS["then-now-2"])
    assert sent[1:] == [PinEpisode(), ShowPanes("then-now-2")]
    panel.pick_at(2010.0)
    panel.pick_at(1200.0)
    assert sent[-1] == PinEpisode(0, "train", 2000)
    assert notices == ["refused: the album keeps no episode near step 1,200"]


def test_the_controller_lists_the_album_at_most_once_a_second(monkeypatch):
    import viewer.controller as controller_module
    from viewer.controller import ALBUM_S, Controller
    from viewer.model import RunModel

    listed: list[int] = []

    def source_album(path, source):
        listed.append(source)
        return [AlbumEntry(0, "train", 64, None)]

    clock = [1000.0]
    monkeypatch.setattr(controller_module, "source_album", source_album)
    monkeypatch.setattr(controller_module.time, "monotonic", lambda: clock[0])
    controller = Controller((48, 64))
    try:
        run, model = SimpleNamespace(path="run"), RunModel(1)
        points = controller._album_points(run, model, -1)  # type: ignore[arg-type]
        controller._album_points(run, model, -1)  # type: ignore[arg-type]
        assert listed == [-1] and points[0].step == 64
        controller._album_points(run, model, 0)  # type: ignore[arg-type]  # another source: now
        clock[0] += ALBUM_S
        controller._album_points(run, model, 0)  # type: ignore[arg-type]
        assert listed == [-1, 0, 0]
    finally:
        controller.shutdown(timeout=10)
