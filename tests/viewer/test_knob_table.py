"""One knob table (agent/knobs.py): a knob added there reaches the command line, validation,
the knob record, the agent and the window, with no other change. (Here, in the top room's tests,
because it crosses every room.)"""

import json

import pytest
from conftest import tiny_config

import agent.knobs
from agent.config import knobs_of, with_knobs
from agent.errors import ConfigError
from agent.knobs import KNOBS, Knob, knobs
from viewer.model import RunModel, window_knobs
from viewer.panels.knobs import knob_widgets
from workers.cli.flags import build_parser
from workers.rundir.knob_record import KnobStore, run_knobs, validate_knobs


@pytest.fixture
def min_std_knob(monkeypatch):
    """min_std (a Config field the planner reads) made a live knob by one line in the table."""
    knob = Knob("min_std", float, 0.01, 1.0, "MPPI minimum std")
    monkeypatch.setattr(agent.knobs, "KNOBS", (*agent.knobs.KNOBS, knob))
    return knob


def test_a_knob_added_to_the_table_appears_everywhere(min_std_knob, tmp_path):
    cfg = tiny_config()
    # The command line says it is live, with its range.
    help_text = " ".join(build_parser().format_help().split())
    assert "--min-std FLOAT Lower clamp of the MPPI sampling std. (default: 0.05; live knob in" in (
        help_text
    )
    # Validation and the agent: set live, range refused with one message.
    assert with_knobs(cfg, min_std=0.2).min_std == 0.2
    with pytest.raises(ConfigError, match=r"min_std must be in \[0.01, 1\], got 5"):
        with_knobs(cfg, min_std=5)
    assert knobs_of(cfg)["min_std"] == cfg.min_std
    # The knob record holds it from the start, and takes a change.
    store = KnobStore(tmp_path)
    store.initialise(cfg, merge_every=2500)
    assert json.loads((tmp_path / "knobs.json").read_text())["values"]["min_std"] == 0.05
    version = store.set(cfg, min_std=0.3)
    assert store.read() == (
        version,
        validate_knobs(cfg, {**knobs_of(cfg), "min_std": 0.3, "merge_every": 2500}),
    )
    # The window model has a row for it, labelled from the table.
    assert window_knobs()["min_std"] == "MPPI minimum std"
    model = RunModel(1, 100, None)
    rows = model.knob_rows({**store.read()[1]}, [{"worker": 0}])
    assert [r.label for r in rows if r.name == "min_std"] == ["MPPI minimum std"]
    # The window's knob panel builds a float slider for it.
    widget = next(w for w in knob_widgets() if w.name == "min_std")
    assert (widget.label, widget.low, widget.high, widget.kind) == (
        "MPPI minimum std",
        0.01,
        1.0,
        float,
    )


def test_every_layer_reads_its_knobs_from_the_table():
    cfg = tiny_config()
    # The agent's values are the agent layer's knobs; the run adds the workers' layer.
    assert set(knobs_of(cfg)) == set(knobs("agent"))
    assert set(run_knobs(cfg, 7)) == set(knobs()) and run_knobs(cfg, 7)["merge_every"] == 7
    # The window has a widget for each knob the table puts in it, in the table's order.
    assert [w.name for w in knob_widgets()] == [k.name for k in KNOBS if k.in_window]
    assert [w.label for w in knob_widgets()] == [k.title for k in KNOBS if k.in_window]
    # Every knob is refused one past its top with the table's range in the message.
    for knob in KNOBS:
        too_high = knob.high + 1
        wording = "must be on or off" if knob.kind is bool else r"must be in \["
        with pytest.raises(ConfigError, match=rf"{knob.name} {wording}") as refused:
            validate_knobs(cfg, {**run_knobs(cfg, 100), knob.name: too_high})
        assert knob.bounds in str(refused.value) and refused.value.field == knob.name
    # The command line says which flags are live, with the table's range.
    help_text = " ".join(build_parser().format_help().split())
    for knob in KNOBS:
        live = "live knob," if knob.kind is bool else "live knob in"
        assert f"{live} {knob.bounds}" in help_text, knob.name
