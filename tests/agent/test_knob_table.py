"""One knob table (agent/knobs.py): a knob added there reaches the command line, validation,
the knob record, the agent and the window model, with no other change."""

import json
import pickle

import pytest
from conftest import tiny_config

import agent.knobs
from agent.config import knobs_of, with_knobs
from agent.errors import ConfigError
from agent.knobs import Knob, KnobValues, knobs
from viewer.model import RunModel, window_knobs
from viewer.panels.knobs import knob_widgets
from workers.cli.flags import build_parser
from workers.rundir.knob_record import KnobStore, validate_knobs


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


def test_the_table_is_what_the_layers_use():
    table = knobs()
    assert list(table)[0] == "merge_every" and table["merge_every"].layer == "workers"
    assert set(knobs("agent")) == set(table) - {"merge_every"}
    assert table["temperature"].kind is float and not table["temperature"].in_window
    with pytest.raises(ConfigError, match=r"merge_every must be in \[1, 10000000\], got 0"):
        validate_knobs(tiny_config(), {"merge_every": 0})
    with pytest.raises(ConfigError, match="horizon must be a whole number"):
        with_knobs(tiny_config(), horizon=2.5)


def test_knob_values_are_frozen_checked_once_and_travel_between_processes():
    cfg = tiny_config()
    values = validate_knobs(cfg, {**knobs_of(cfg), "merge_every": 3000})
    assert isinstance(values, KnobValues) and values["merge_every"] == 3000
    assert values == {**knobs_of(cfg), "merge_every": 3000}  # reads as the dict it was made of
    with pytest.raises(AttributeError, match="frozen"):
        values.horizon = 9
    with pytest.raises(TypeError):
        values["horizon"] = 9  # no item assignment either
    assert pickle.loads(pickle.dumps(values)) == values  # to a worker process and back
    assert json.loads(json.dumps(dict(values))) == values
    with pytest.raises(ConfigError, match=r"horizon must be in \[1, 16\]"):
        KnobValues({"horizon": 17})
    with pytest.raises(ConfigError, match="not a live knob: batch_size"):
        KnobValues({"batch_size": 64})
    # Checks across fields need the config: validate_knobs makes them.
    with pytest.raises(ConfigError, match="num_elites"):
        validate_knobs(cfg, {**knobs_of(cfg), "num_elites": cfg.num_samples + 1})
