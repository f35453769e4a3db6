"""Knob values as the run passes them on: validated once into a frozen KnobValues that crosses
process boundaries unchanged (workers/rundir/knob_record.py validate_knobs)."""

import json
import pickle

import pytest
from conftest import tiny_config

from agent.config import knobs_of
from agent.errors import ConfigError
from agent.knobs import KnobValues
from workers.rundir.knob_record import validate_knobs


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
    # An on/off knob takes a bool (or 0/1: a JSON reader's, a slider's), nothing else.
    assert KnobValues({"bf16": 1, "merge_policy": False}) == {"bf16": True, "merge_policy": False}
    with pytest.raises(ConfigError, match="merge_policy must be on or off, got 'yes'"):
        KnobValues({"merge_policy": "yes"})
    # Checks across fields need the config: validate_knobs makes them.
    with pytest.raises(ConfigError, match="num_elites"):
        validate_knobs(cfg, {**knobs_of(cfg), "num_elites": cfg.num_samples + 1})
