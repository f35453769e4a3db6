"""A training process's hooks (workers/training/hooks.py) in-process: a trainer with a real tiny
agent and no env (the test advances its step), real files in a temporary run directory, and
threading's events for the run's. Knobs, merge rounds, checkpoints, pause and stop."""

import dataclasses
import json
import threading

import pytest
import torch
from conftest import tiny_config, wait_until
from helpers.process_fakes import FakeTrainer, hooks_process, make_run, records, run_steps

import workers.training.fast_path as fast_path
from agent.self_check import Trial, Verdict
from workers.merging.files import write_members
from workers.rundir.directory import load_state
from workers.rundir.knob_record import KnobStore, run_knobs
from workers.rundir.lanes import Lane
from workers.rundir.records import (
    Checkpoint,
    KnobsApplied,
    KnobsRefused,
    Merge,
    Pause,
    Resume,
    SelfCheck,
)
from workers.rundir.settings import RunSettings
from workers.training.first_weights import StartState, _checkpoint_state
from workers.training.spec import STATES
from workers.training.stop_training import StopTraining

CFG = tiny_config(mlp_dim=32, enc_dim=16, latent_dim=16, num_samples=16, num_elites=4)


@pytest.fixture(autouse=True)
def close_trainers():
    yield
    FakeTrainer.close_all()


def process(path, workers=(0,), merge_with=(), merge_every=10, start=None, **spec_fields):
    return hooks_process(path, CFG, workers, merge_with, merge_every, start, **spec_fields)


steps = run_steps


def test_each_knob_version_is_applied_once_at_the_step_it_is_seen(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=1, merge_every=10))
    p = process(tmp_path)
    steps(p, 3)
    KnobStore(tmp_path).set(CFG, horizon=2, merge_every=20)
    steps(p, 6)
    applied = records(tmp_path, 0, KnobsApplied)
    assert [(a.version, a.step, a.lane) for a in applied] == [(0, 0, None), (1, 4, None)]
    assert applied[0].values == run_knobs(CFG, 10)
    assert applied[1].values == {**run_knobs(CFG, 10), "horizon": 2, "merge_every": 20}
    assert p.trainer.agent.cfg.horizon == 2 and p.hooks.merge_every == 20
    snapshot = {n: p.links[0].value(n) for n in ("knob_version", "step", "steps_per_s", "state")}
    assert snapshot == {"knob_version": 1, "step": 6, "steps_per_s": 12.5, "state": 2.0}


def test_a_refused_value_leaves_the_values_in_force_and_is_recorded_once(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=1, merge_every=10))
    p = process(tmp_path)
    good = KnobStore(tmp_path).read_record()
    bad = dataclasses.replace(good, version=1, values={**good.values, "horizon": 99})
    (tmp_path / "knobs.json").write_text(json.dumps(bad.to_json()))  # by hand: not validated
    steps(p, 3)
    (refused,) = records(tmp_path, 0, KnobsRefused)
    assert (refused.version, refused.knob, refused.value, refused.step) == (1, "horizon", 99, 1)
    assert "horizon" in refused.reason and refused.in_force == run_knobs(CFG, 10)
    assert refused.in_force_version == 0
    assert refused.message.endswith(f"; horizon stays {CFG.horizon}")
    assert p.trainer.agent.cfg.horizon == CFG.horizon and p.links[0].value("knob_version") == 0

    KnobStore(tmp_path).set(CFG, horizon=4)  # written from the last good values: version 2
    steps(p, 4)
    assert [a.version for a in records(tmp_path, 0, KnobsApplied)] == [0, 2]
    assert p.trainer.agent.cfg.horizon == 4


def test_an_unreadable_knob_record_keeps_the_checkpoints_values_and_says_so_once(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=1, merge_every=10))
    (tmp_path / "knobs.json").write_text("{not json")
    (tmp_path / "knobs.jsonl").write_text("garbage\n")
    p = process(tmp_path, start=StartState(knob_version=1, merge_every=100))
    steps(p, 3)
    (refused,) = records(tmp_path, 0, KnobsRefused)
    assert refused.version is None and refused.knob is None
    assert refused.in_force["merge_every"] == 100 and refused.in_force_version == 1
    assert "knob record unreadable" in refused.message and "merge_every=100" in refused.message
    assert records(tmp_path, 0, KnobsApplied) == []


@pytest.mark.parametrize(
    "lanes, reason",
    [(((0,), (1, 5)), "names worker 5"), (((0,), ()), "lane 1 has no worker")],
)
def test_a_record_whose_lanes_do_not_fit_run_json_is_refused(tmp_path, lanes, reason):
    make_run(tmp_path, CFG, RunSettings(workers=2, merge_every=10))
    write_members(tmp_path, [0, 1], down={1: "elsewhere"})  # nobody waits for worker 1
    p = process(tmp_path, merge_with=(0, 1))
    good = KnobStore(tmp_path).read_record()
    bad = dataclasses.replace(good, version=1, lanes=lanes, lane_values=(good.values,) * 2)
    (tmp_path / "knobs.json").write_text(json.dumps(bad.to_json()))
    steps(p, 2)
    (refused,) = records(tmp_path, 0, KnobsRefused)
    assert reason in refused.reason and refused.version == 1 and refused.knob is None
    assert "the last good values stay" in refused.message
    assert p.hooks.rounds.pool_state() == {"pool": 0, "lane": None, "pool_base": 0}


def test_a_merging_worker_left_out_of_every_lane_is_refused(tmp_path):
    # Worker 1 merges (run.json) and is in no lane: it would merge with nobody's pool.
    make_run(tmp_path, CFG, RunSettings(workers=3, merge_every=10))
    write_members(tmp_path, [0, 1, 2], down={1: "elsewhere", 2: "elsewhere"})
    p = process(tmp_path, merge_with=(0, 1, 2))
    good = KnobStore(tmp_path).read_record()
    bad = dataclasses.replace(good, version=1, lanes=((0,), (2,)), lane_values=(good.values,) * 2)
    (tmp_path / "knobs.json").write_text(json.dumps(bad.to_json()))
    steps(p, 2)
    (refused,) = records(tmp_path, 0, KnobsRefused)
    assert "worker 1 of the run is in no lane" in refused.reason


def test_merge_rounds_fall_every_merge_every_steps_and_a_new_value_recounts_them(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=2, merge_every=10))
    p = process(tmp_path, workers=(0, 1), merge_with=(0, 1))  # a pack: the round is real
    steps(p, 35)
    KnobStore(tmp_path).set(CFG, merge_every=4)  # seen at step 36: round 36 // 4 = 9
    steps(p, 45)
    for worker in (0, 1):
        merges = records(tmp_path, worker, Merge)
        assert [(m.step, m.round) for m in merges] == [
            (10, 1),
            (20, 2),
            (30, 3),
            (40, 10),
            (44, 11),
        ]
        assert all(m.participants == (0, 1) for m in merges)
    assert p.links[0].value("merges") == 5
    first, second = p.trainer.weights(0), p.trainer.weights(1)
    assert all(torch.equal(first[k], second[k]) for k in first)  # merged at step 44


def test_a_race_counts_its_rounds_from_the_step_its_pools_began(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=2, merge_every=10))
    p = process(tmp_path, merge_with=(0, 1))
    rounds = []  # the rounds the hooks start (merge_rounds.py does them: its own tests)
    p.hooks.rounds.merge = lambda round_, _every: rounds.append((p.trainer.step, round_))
    steps(p, 25)
    KnobStore(tmp_path).start_race(CFG, ((0,), (1,)), (Lane({"merge_every": 7}), Lane()))
    steps(p, 45)  # the race seen at step 26: lane 0's pool, every 7 steps from there
    assert rounds == [(10, 1), (20, 2), (33, 1), (40, 2)]
    assert p.hooks.rounds.pool_state() == {"pool": 1, "lane": 0, "pool_base": 26}
    assert records(tmp_path, 0, KnobsApplied)[-1].lane == 0


def test_checkpoints_every_checkpoint_every_steps_and_when_asked(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=1, merge_every=10))
    p = process(tmp_path, merge_with=(0,), checkpoint_every=20)
    steps(p, 45)
    p.links[0].checkpoint.set()
    steps(p, 60)
    assert [c.step for c in records(tmp_path, 0, Checkpoint)] == [20, 40, 46, 60]
    assert not p.links[0].checkpoint.is_set()  # each request is served once
    saved = load_state(tmp_path / "checkpoints" / "worker-0.pt")
    assert (saved["step"], saved["knob_version"], saved["merge_every"]) == (60, 0, 10)
    assert (saved["pool"], saved["lane"], saved["pool_base"]) == (0, None, 0)


def test_a_pause_holds_the_worker_between_steps_applies_knobs_and_resumes(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=1, merge_every=10))
    p = process(tmp_path)
    steps(p, 2)
    p.pause.set()
    worker = threading.Thread(target=steps, args=(p, 3))
    worker.start()
    paused = STATES.index("paused")
    assert wait_until(lambda: p.links[0].value("state") == paused, timeout=30, poll=0.01)
    assert [r.step for r in records(tmp_path, 0, Pause)] == [3]
    KnobStore(tmp_path).set(CFG, horizon=2)  # a paused worker still takes new values
    assert wait_until(lambda: p.trainer.agent.cfg.horizon == 2, timeout=30, poll=0.01)
    assert worker.is_alive() and p.trainer.step == 3
    p.pause.clear()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert [r.step for r in records(tmp_path, 0, Resume)] == [3]
    assert p.links[0].value("state") == STATES.index("training")


@pytest.mark.parametrize("event", ["stop", "leave", "terminated"])
def test_a_stop_ends_training_between_steps(tmp_path, event):
    make_run(tmp_path, CFG, RunSettings(workers=1, merge_every=10))
    p = process(tmp_path)
    steps(p, 2)
    {"stop": p.stop, "leave": p.links[0].leave, "terminated": p.terminated}[event].set()
    with pytest.raises(StopTraining):
        steps(p, 3)


def test_a_stop_ends_a_pause(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=1, merge_every=10))
    p = process(tmp_path)
    p.pause.set()
    ended = []

    def train():
        try:
            steps(p, 1)
        except StopTraining:
            ended.append("stopped")

    worker = threading.Thread(target=train)
    worker.start()
    paused = STATES.index("paused")
    assert wait_until(lambda: p.links[0].value("state") == paused, timeout=30, poll=0.01)
    p.stop.set()
    worker.join(timeout=30)
    assert ended == ["stopped"]


def test_bf16_turned_on_mid_run_is_self_checked_first_and_recorded_once(tmp_path):
    """A process that started in float32 (its start-up check never compared bf16) is given
    bf16 by a knob: before its next step it checks bf16 on its path against the plain path,
    records the verdict as the start-up check does, and computes in bf16 once it agrees. Off
    and on again, no second check."""
    make_run(tmp_path, CFG, RunSettings(workers=1, merge_every=10))
    p = process(tmp_path)
    steps(p, 2)
    assert not p.trainer.agent.cfg.bf16 and records(tmp_path, 0, SelfCheck) == []
    KnobStore(tmp_path).set(CFG, bf16=True)
    steps(p, 3)
    (check,) = records(tmp_path, 0, SelfCheck)
    assert check.step == 3 and check.bf16 and check.sound
    assert check.trials[0].startswith("eager bf16 agrees with the plain path")
    assert check.message.startswith("worker 0: bf16 turned on; fast path: eager, bf16")
    assert p.trainer.agent.cfg.bf16 and records(tmp_path, 0, KnobsApplied)[-1].values["bf16"]
    KnobStore(tmp_path).set(CFG, bf16=False)
    steps(p, 4)
    KnobStore(tmp_path).set(CFG, bf16=True)
    steps(p, 5)
    assert len(records(tmp_path, 0, SelfCheck)) == 1 and p.trainer.agent.cfg.bf16


def test_a_checks_drop_of_bf16_survives_a_resume_and_any_knob_record(tmp_path, monkeypatch):
    """The mid-run check finds bf16 disagreeing here: the process stays in float32 (and says
    so in the values it applies), its checkpoint keeps the drop, and the process resumed from
    it stays in float32 when a later knob record asks for bf16 again, without checking again."""
    make_run(tmp_path, CFG, RunSettings(workers=1, merge_every=10))
    p = process(tmp_path)

    def disagrees(agent, path, by_hand=False):
        trials = (Trial(path, "disagrees", "pi_loss of worker 0: 2 against 1"),)
        return Verdict(agent.path, (*trials, Trial(agent.path, "plain")))

    monkeypatch.setattr(fast_path, "check_switch", disagrees)
    KnobStore(tmp_path).set(CFG, bf16=True)
    steps(p, 2)
    (check,) = records(tmp_path, 0, SelfCheck)
    assert not check.bf16 and "eager bf16 disagrees" in check.trials[0]
    assert not p.trainer.agent.cfg.bf16
    assert records(tmp_path, 0, KnobsApplied)[-1].values["bf16"] is False
    p.hooks.checkpoint()
    saved = load_state(tmp_path / "checkpoints" / "worker-0.pt")
    assert saved["bf16_refused"] is True

    def never(*_args, **_kwargs):
        raise AssertionError("checked again")

    monkeypatch.setattr(fast_path, "check_switch", never)
    resumed = process(tmp_path, start=_checkpoint_state(saved))
    KnobStore(tmp_path).set(CFG, horizon=2)  # a later record, bf16 still on in it
    steps(resumed, 4)
    assert not resumed.trainer.agent.cfg.bf16 and resumed.trainer.agent.cfg.horizon == 2
    assert records(tmp_path, 0, KnobsApplied)[-1].values["bf16"] is False
