"""A training process's start-up self-check (workers/training/fast_path.py) and what the run
does with its verdict: the record and its line, a pack found unsound split into a process per
worker (run.json keeps them apart), a torchrun rank's pack stopped instead."""

import dataclasses
import json
import threading
from types import SimpleNamespace

import pytest
from conftest import events
from conftest import tiny_run as tiny
from helpers.faults import mix_up_workers

import workers.training.process as worker_module
from workers.run.owner import Run, RunSettings
from workers.run.spawn import worker_spec
from workers.run.worker_notices import WorkerNotices
from workers.rundir.directory import RunDir
from workers.rundir.records import Crashed, Error, MergeSkipped, SelfCheck
from workers.rundir.settings import read_record
from workers.training.spec import SNAPSHOT_FIELDS, SPLIT_PACK, STATES, WorkerLink


def _links(run, settings, workers, **spec):
    specs = [
        dataclasses.replace(worker_spec(run.path, run.cfg, settings, k, 100), **spec)
        for k in workers
    ]
    return [
        WorkerLink(s, [0.0] * len(SNAPSHOT_FIELDS), threading.Event(), threading.Event())
        for s in specs
    ]


@pytest.fixture
def in_process(monkeypatch):
    """worker_main run in the test's own process (its signals and threads left alone)."""
    monkeypatch.setattr(worker_module, "child_signals", lambda: None)
    monkeypatch.setattr(worker_module, "apply_threads", lambda threads: None)


@pytest.fixture
def mixed_up_pack(monkeypatch):
    """A CPU pack whose threads hand each worker's results to another: unsound."""
    mix_up_workers(monkeypatch)


def test_an_unsound_pack_records_why_and_ends_to_be_split(tmp_path, in_process, mixed_up_pack):
    settings = RunSettings(workers=2, pack=2)
    run = Run.create(tmp_path / "run", tiny(100, bf16=True), settings)
    links = _links(run, settings, (0, 1))
    with pytest.raises(SystemExit) as exited:
        worker_module.worker_main(links, threading.Event(), threading.Event())
    assert exited.value.code == SPLIT_PACK
    checks = events(run, SelfCheck)
    assert [c.worker for c in checks] == [0, 1] and checks[0].message == checks[1].message
    check = checks[0]
    assert (check.path, check.pack, check.asked, check.sound) == ("split", 2, "auto", True)
    assert check.trials[0].startswith("eager bf16 disagrees: ")
    assert check.trials[1].startswith("eager float32 disagrees: ")
    assert check.message.startswith("workers 0, 1 (a pack): fast path: one process per worker")
    assert not events(run, Error)  # not a crash
    assert [link.value("state") for link in links] == [STATES.index("starting")] * 2


def test_a_torchrun_ranks_unsound_pack_stops_with_the_line(tmp_path, in_process, mixed_up_pack):
    settings = RunSettings(workers=2, pack=2)
    run = Run.create(tmp_path / "run", tiny(100), settings)
    links = _links(run, settings, (0, 1), distributed=True)
    with pytest.raises(SystemExit) as exited:
        worker_module.worker_main(links, threading.Event(), threading.Event())
    assert exited.value.code == 1
    (check,) = events(run, SelfCheck, worker=0)
    assert check.path == "eager" and not check.sound
    (error,) = events(run, Error, worker=0)
    assert error.message.startswith("PackUnsound: workers 0, 1 (a pack): fast path: eager, a pack")
    assert "nothing simpler to fall back to" in error.message
    assert error.message.endswith("run one worker per process (a torchrun rank each)")


def test_workers_split_apart_train_alone_and_a_resume_keeps_them_so(tmp_path):
    settings = RunSettings(workers=5, pack=2, apart=[3])
    assert settings.packs == [[0, 1], [2], [3], [4]]
    assert RunSettings(workers=4, pack=2, apart=(0, 1)).packs == [[0], [1], [2, 3]]
    assert RunSettings(workers=4, pack=4, apart=(1,), removed=(2,)).packs == [[0, 3], [1]]
    run = Run.create(tmp_path / "run", tiny(100), RunSettings(workers=3, pack=3))
    run._save_settings(dataclasses.replace(run.settings, apart=(0, 2)))
    assert json.loads((run.path / "run.json").read_text())["apart"] == [0, 2]
    assert read_record(run.path)[1].packs == [[1], [0], [2]]


class _Ended:
    """A worker process that ended with `code` (the monitor reads exitcode and is_alive)."""

    def __init__(self, code):
        self.exitcode, self.sentinel = code, None

    def is_alive(self):
        return False


def test_the_monitor_starts_a_split_packs_workers_apart_as_they_were_started(tmp_path):
    run = Run.create(tmp_path / "run", tiny(100), RunSettings(workers=3, pack=2))
    spawned = []
    run.workers._spawn = lambda specs: spawned.append(specs)
    process = _Ended(SPLIT_PACK)
    for k in (0, 1):
        spec = dataclasses.replace(run.workers._spec(k, resume=True), join_step=40)
        run.workers.procs[k] = SimpleNamespace(
            spec=spec,
            process=process,
            handled=False,
            join=SimpleNamespace(value=60),
            value=lambda field: 0.0,
            started=0.0,
        )
    run.workers.procs[2] = SimpleNamespace(
        process=_Ended(None), handled=True, spec=run.workers._spec(2, False)
    )
    run.monitor.check()
    assert [[s.index for s in specs] for specs in spawned] == [[0], [1]]
    assert all(specs[0].resume and specs[0].join_step == 60 for specs in spawned)
    assert run.settings.apart == (0, 1) and read_record(run.path)[1].apart == (0, 1)
    assert run.notices() == [
        "workers 0, 1 go on in a process each: the self-check found their pack unsound"
    ]
    assert not run.monitor.down() and not run.monitor.restarting  # not a crash
    assert not events(run, Crashed)


def test_the_command_line_hears_each_processs_line_once(tmp_path):
    run_dir = RunDir(tmp_path, metrics="worker-0.jsonl")
    other = RunDir(tmp_path, metrics="worker-1.jsonl")
    told = []
    notices = WorkerNotices(
        tmp_path, lambda: RunSettings(workers=2), lambda text, in_record=False: told.append(text)
    )
    line = "workers 0, 1 (a pack): fast path: eager, a pack of 2 on threads, bf16 (...)"
    for log in (run_dir, other):
        log.log(
            SelfCheck(
                step=0,
                path="eager",
                pack=2,
                bf16=True,
                asked="auto",
                sound=True,
                seconds=0.1,
                message=line,
            )
        )
    notices.scan_records()
    notices.scan_records()
    assert told == [line]


def test_the_command_line_hears_a_skipped_merge_round_once(tmp_path):
    """A round a worker skipped (its weights not finite, say, and what it took instead) is
    told once per round and reason, however many workers of a pack recorded it."""
    told = []
    notices = WorkerNotices(
        tmp_path, lambda: RunSettings(workers=2), lambda text, in_record=False: told.append(text)
    )
    reason = "own weights are not finite: took the pool's merged weights of round 1"
    for name in ("worker-0.jsonl", "worker-1.jsonl"):
        RunDir(tmp_path, metrics=name).log(MergeSkipped(step=20, round=2, reason=reason))
    notices.scan_records()
    assert told == [f"worker 0, merge round 2 skipped: {reason}"]
