"""The run directory's typed records: one writer, one reader; events kept, snapshots coalesced."""

import json
import math
from pathlib import Path

import pytest
from conftest import ROOT

from workers.run.tail import RecordTail
from workers.rundir.directory import RunDir
from workers.rundir.lines import parse_lines
from workers.rundir.records import (
    RECORD_TYPES,
    Checkpoint,
    Crashed,
    DiskResumed,
    Episode,
    Error,
    Eval,
    FirstUpdate,
    KnobsApplied,
    KnobsRefused,
    Merge,
    MergeSkipped,
    MergeStopped,
    Pause,
    Pretraining,
    Record,
    Request,
    Resume,
    Resumed,
    RunDirGone,
    Seeding,
    SelfCheck,
    ShowcaseEpisode,
    StartedFresh,
    StartedFromMerged,
    StartedFromWeights,
    Stop,
    Train,
    parse_records,
    record_from_json,
)

ONE_OF_EACH = [
    Train(step=9, updates=4, steps_per_s=2.5, losses={"pi_loss": 0.25, "value_loss": 1.5}),
    Seeding(step=1),
    Pretraining(step=100, updates=37),
    Episode(step=50, ret=12.5, length=50, env=1),
    Eval(step=100, ret=3.0, returns=(2.0, 4.0)),
    ShowcaseEpisode(episode=3, ret=7.0, weights_round=2, source=-1, weights_step=200),
    FirstUpdate(step=100, seconds=4.2),
    Merge(
        step=300,
        round=3,
        participants=(0, 2),
        left_out={1: "behind (round 2 < 3)"},
        distances={0: 0.5, 2: 0.25},
        merge_ms=12.5,
    ),
    MergeSkipped(step=300, round=3, reason="own weights are not finite"),
    MergeStopped(step=300, round=3),
    KnobsApplied(step=0, version=1, values={"horizon": 3, "merge_every": 2500, "bf16": True}),
    KnobsRefused(
        step=5,
        version=None,
        knob=None,
        reason="unreadable",
        in_force={"horizon": 3},
        in_force_version=1,
        message="knob record unreadable: ...",
    ),
    StartedFresh(step=0),
    StartedFromMerged(step=250),
    StartedFromWeights(step=0, file="start.pt"),
    Resumed(step=150, checkpoint="worker-0.prev.pt", fallback="worker-0.pt is torn"),
    Checkpoint(step=150, path="/run/checkpoints/worker-0.pt"),
    Pause(step=10),
    Resume(step=10),
    Stop(step=500, reason="done"),
    DiskResumed(step=7, path="/run/worker-0.jsonl", error="No space", paused_s=3.5),
    Error(message="RuntimeError: boom", traceback="Traceback ..."),
    RunDirGone(message="the run directory vanished"),
    Crashed(step=80, message="worker 1 died", exitcode=-9, signal="SIGKILL", restarts=1),
    SelfCheck(
        step=0,
        path="compile",
        pack=4,
        bf16=False,
        asked="auto",
        sound=True,
        seconds=97.5,
        compile_seconds=95.25,
        trials=("graphs raised RuntimeError: ...", "compile agrees with the plain path"),
        message="workers 0, 1, 2, 3 (a pack): fast path: compiled without CUDA graphs ...",
    ),
]


def test_every_kind_reads_back_as_it_was_written(tmp_path):
    assert {type(r) for r in ONE_OF_EACH} == set(RECORD_TYPES.values()), "a kind without example"
    log = RunDir(tmp_path)
    for record in ONE_OF_EACH:
        assert log.log(record) is record
    log.close()
    read = RunDir(tmp_path).read_metrics()
    assert read == ONE_OF_EACH
    assert RunDir(tmp_path).read_metrics(Merge) == [ONE_OF_EACH[7]]
    # The file name says whose records they are: the worker is not written.
    assert all("worker" not in json.loads(line) for line in (tmp_path / "metrics.jsonl").open())


def test_not_finite_numbers_are_written_as_null_and_read_back_as_nan():
    record = Episode(step=1, ret=math.inf, length=2)
    line = json.dumps(record.to_json(), allow_nan=False)  # strict JSON, no Infinity
    read = record_from_json(json.loads(line))
    assert json.loads(line)["ret"] is None and math.isnan(read.ret)


@pytest.mark.parametrize(
    "line",
    [
        '{"kind": "episode", "step": 1, "time": 1.0, "ret": 2.0}',  # no length
        '{"kind": "episode", "step": "x", "time": 1.0, "ret": 2.0, "length": 3}',
        '{"kind": "episode", "step": true, "time": 1.0, "ret": 2.0, "length": 3}',
        '{"kind": "merge", "step": 1, "time": 1.0, "round": 1, "distances": {"a": 1.0}}',
        '{"kind": "eval", "step": 1, "time": 1.0, "ret": 2.0, "returns": "12"}',
        '{"step": 1}',
        "[1, 2]",
        "not json",
        '{"kind": "episode", "st',
    ],
)
def test_a_line_that_is_no_record_is_counted_as_damaged(line):
    good = json.dumps(Stop(step=3, reason="done").to_json())
    records, damaged = parse_records(f"{good}\n{line}\n{good}\n".encode())
    assert damaged == 1 and [r.step for r in records] == [3, 3]


def test_a_kind_from_a_newer_version_is_passed_over_not_damage():
    newer = '{"kind": "gpu_temperature", "step": 1, "time": 1.0, "celsius": 60}'
    assert parse_records(newer.encode()) == ([], 0)


def test_requests_read_back_and_refuse_unknown_actions():
    sent = Request(action="remove_worker", worker=2, time=5.0)
    line = json.dumps(sent.to_json())
    assert parse_lines(f"{line}\n".encode(), Request) == ([sent], 0)
    assert parse_lines(b'{"action": "format_disk", "time": 1.0}\n', Request) == ([], 1)
    with pytest.raises(ValueError, match="unknown request"):
        Request(action="format_disk")


def test_the_tail_keeps_every_event_and_the_newest_snapshot(tmp_path):
    log = RunDir(tmp_path, metrics="worker-0.jsonl")
    tail = RecordTail(tmp_path)
    for step in (1, 2, 3):
        log.log(Episode(step=step, ret=float(step), length=1))
        log.log(Train(step=step, updates=step, steps_per_s=float(step)))
    log.log(Pretraining(step=3, updates=9))
    tail.poll(workers=1)
    taken = tail.take()
    assert [r.step for r in taken if isinstance(r, Episode)] == [1, 2, 3]
    assert [r.step for r in taken if isinstance(r, Train)] == [3]  # latest wins
    assert {r.worker for r in taken} == {0}
    seen = tail.seen(0)
    assert seen.step == 3 and seen.phase == "pretraining" and seen.updates == 9
    assert seen.last_return == 3.0 and seen.steps_per_s == 3.0
    assert tail.take() == []
    log.log(Stop(step=4, reason="done"))
    log.close()
    tail.poll(workers=1)
    assert [type(r) for r in tail.take()] == [Stop] and tail.seen(0).ended == "done"


def test_no_module_but_the_records_reads_or_writes_a_record_kind_by_name():
    """The one reader and writer: a record's kind is spelled in workers/rundir/records.py only."""
    offenders = []
    for path in sorted(ROOT.glob("*/**/*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in ("agent", "workers", "viewer", "bench"):
            if relative != Path("workers/rundir/records.py") and '"kind"' in path.read_text():
                offenders.append(str(relative))
    assert offenders == []
    assert all(issubclass(cls, Record) and cls.KIND == kind for kind, cls in RECORD_TYPES.items())
