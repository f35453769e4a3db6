"""Faults a run must survive: a killed worker, damaged knob records, torn checkpoints, corrupt
records, a vanished run directory, a full disk."""

import contextlib
import errno
import json
import os
import signal
import subprocess
from dataclasses import replace

import pytest
from conftest import events, wait_until
from conftest import tiny_run as tiny

import workers.run.knobs
import workers.run.owner
import workers.rundir.directory
from agent.errors import UserError, WeightsError
from viewer.model import RunModel
from workers.cli.headless import main
from workers.run.owner import Run, RunSettings
from workers.rundir.directory import (
    RunDir,
    atomic_write_json,
    load_checkpoint,
    load_state,
    previous_path,
    save_checkpoint,
)
from workers.rundir.knob_record import KnobStore
from workers.rundir.paths import checkpoint_path
from workers.rundir.records import (
    Crashed,
    Episode,
    KnobsApplied,
    KnobsRefused,
    Merge,
    Resumed,
    StartedFromMerged,
    Stop,
)
from workers.rundir.requests import RequestLog
from workers.training.disk_guard import DISK_RETRY_S


def test_killed_worker_is_noticed_at_once_restarted_and_merges_again(tmp_path, monkeypatch):
    # Without the monitor, the survivor waited the whole merge timeout for the dead worker at
    # every merge; the timeout here is long enough that such a wait shows in merge_ms. A longer
    # back-off than the default leaves the survivor time to merge alone before the restart.
    """A worker process killed by SIGKILL: the monitor notices at once, the survivor merges alone
    without waiting out the timeout, and the worker restarts from the merged weights and merges
    again. Only a real SIGKILL shows the death noticed through the process."""
    monkeypatch.setattr(workers.run.owner, "RESTART_BACKOFF_S", 8.0)
    settings = RunSettings(workers=2, merge_every=100, merge_timeout_s=30, max_restarts=2)
    run = Run.create(tmp_path / "run", tiny(100_000), settings)
    run.start()
    try:
        assert wait_until(lambda: len(events(run, Merge, 0)) >= 1, timeout=300)
        os.kill(run.workers.procs[1].process.pid, signal.SIGKILL)
        assert wait_until(lambda: events(run, Crashed, 1), timeout=30)
        crash = events(run, Crashed, 1)[0]
        assert crash.signal == "SIGKILL" and not crash.final
        assert "restarting it from the merged weights" in crash.message
        members = json.loads((run.path / "merge" / "members.json").read_text())
        assert members["workers"] == [0] or members["down"] == {}  # already back, or down
        notices = run.notices()
        assert any("worker 1 died (killed by SIGKILL" in n for n in notices), notices

        # The survivor's merges while worker 1 is down: nobody waited for it.
        def merges_without_1():
            return [m for m in events(run, Merge, 0) if m.time > crash.time]

        assert wait_until(lambda: merges_without_1(), timeout=60)
        # Restarted from the merged weights, it takes part in merges again.
        assert wait_until(lambda: events(run, StartedFromMerged, 1), timeout=120)
        restarted = events(run, StartedFromMerged, 1)[0]
        assert wait_until(
            lambda: any(
                m.participants == (0, 1) and m.time > restarted.time for m in events(run, Merge, 0)
            ),
            timeout=300,
        ), "the restarted worker never merged again"
        alone = [m for m in merges_without_1() if m.time < restarted.time]
        assert alone and all(m.participants == (0,) and 1 in m.left_out for m in alone)
        print("merges while worker 1 was down:", [m.merge_ms for m in alone])
        assert all(m.merge_ms < 1000 for m in alone), alone
        assert any("runs again" in n for n in run.notices())
    finally:
        run.stop()


def test_worker_that_keeps_dying_is_left_out_for_good(tmp_path):
    """A worker killed again after its one restart is left out for good while the survivor goes
    on: only real kills show the monitor counting deaths of processes and giving up."""
    settings = RunSettings(workers=2, merge_every=100, merge_timeout_s=30, max_restarts=1)
    run = Run.create(tmp_path / "run", tiny(100_000), settings)

    def restarted(old_pid):
        running = run.workers.progress()[1]["state"] not in ("starting", "crashed")
        return run.workers.procs[1].process.pid != old_pid and running

    run.start()
    try:
        assert wait_until(lambda: min(w["step"] for w in run.workers.progress()) >= 20, timeout=300)
        first = run.workers.procs[1].process.pid
        os.kill(first, signal.SIGKILL)
        assert wait_until(lambda: len(events(run, Crashed, 1)) == 1, timeout=30)
        assert wait_until(lambda: restarted(first), timeout=120)  # after the back-off
        os.kill(run.workers.procs[1].process.pid, signal.SIGKILL)
        assert wait_until(lambda: len(events(run, Crashed, 1)) == 2, timeout=30)
        final = events(run, Crashed, 1)[-1]
        assert final.final and "left out for good after 1 restart" in final.message
        members = json.loads((run.path / "merge" / "members.json").read_text())
        assert members["workers"] == [0] and "left out for good" in members["down"]["1"]
        assert not run.workers.restarting and run.workers.progress()[1]["state"] == "crashed"
        assert run.workers.progress()[0]["alive"], "the survivor goes on"
    finally:
        run.stop()


def test_resume_with_damaged_knob_records_keeps_the_last_applied_values(tmp_path):
    # The run starts with merge_every 50 but runs with 100 (knob version 1). Knob record and
    # history both damaged: only the workers' checkpoints know 100 (before, a resumed worker
    # took 2500 from the code and stopped merging).
    """With both knob files damaged, a resumed run's workers go on with the values their
    checkpoints hold, and say so once: only workers resumed from real checkpoints show the values
    they carried across the restart."""
    settings = RunSettings(workers=2, merge_every=50, merge_timeout_s=120)
    run = Run.create(tmp_path / "run", tiny(200), settings)
    assert run.knobs.set(merge_every=100, horizon=2) == 1
    run.start()
    run.workers.wait()
    assert {m.round for m in events(run, Merge, 0)} == {1, 2}
    (run.path / "knobs.json").write_text("{not json")
    (run.path / "knobs.jsonl").write_text("garbage\n")

    resumed = Run.resume(run.path, steps=400)
    resumed.start()
    resumed.workers.wait()
    resumed_at = events(resumed, Resumed, 0)[0].time
    later = [m for m in events(resumed, Merge, 0) if m.time > resumed_at]
    assert sorted(m.round for m in later) == [3, 4]  # every 100 steps: 300, 400
    assert all(m.participants == (0, 1) for m in later)
    for worker in (0, 1):
        refused = events(resumed, KnobsRefused, worker)
        assert len(refused) == 1, refused
        assert refused[0].in_force["merge_every"] == 100
        assert refused[0].in_force["horizon"] == 2
        assert "knob record unreadable" in refused[0].message
    told = resumed.notices()
    assert f"warning: {run.path / 'knobs.jsonl'}: 1 damaged line" in told[0]  # on resume
    told = [n for n in told if "knob record" in n]
    assert len(told) == 1 and "merge_every=100" in told[0], told  # once, not per worker
    # Setting a knob writes a good record again, from the values in force (the workers').
    assert resumed.knobs.values() == (1, {**refused[0].in_force})
    assert resumed.knobs.set(horizon=3) == 2
    assert resumed.knobs.store.read() == (2, {**refused[0].in_force, "horizon": 3})


def test_knob_store_falls_back_to_the_newest_good_version(tmp_path):
    cfg = tiny(10)
    store = KnobStore(tmp_path)
    store.initialise(cfg, merge_every=100)
    store.set(cfg, merge_every=300)
    store.set(cfg, horizon=4)
    assert store.last_good(cfg) == (2, store.read()[1])
    # A value the agent refuses (hand-edited), then an unreadable file: the history holds.
    good = store.read()[1]
    (tmp_path / "knobs.json").write_text(
        json.dumps({"version": 3, "values": {**good, "horizon": 99}})
    )
    assert store.last_good(cfg)[1] == good
    (tmp_path / "knobs.json").write_text("")
    assert store.last_good(cfg) == (2, good)
    with open(tmp_path / "knobs.jsonl", "a") as f:
        f.write('{"version": 3, "changes": {"hori')  # a torn last line
    assert store.last_good(cfg) == (2, good)
    assert store.set(cfg, num_samples=32) == 3
    assert store.read()[1] == {**good, "num_samples": 32}


def test_a_knob_change_reads_metrics_files_only_when_the_knob_record_is_damaged(
    tmp_path, monkeypatch
):
    run = Run.create(tmp_path / "run", tiny(10), RunSettings(workers=2, merge_every=50))
    read = []
    real = workers.run.knobs.tail_records
    monkeypatch.setattr(
        workers.run.knobs, "tail_records", lambda path: read.append(path) or real(path)
    )
    assert run.knobs.set(horizon=2) == 1 and read == []  # a good record: no file is read
    (run.path / "knobs.json").write_text("{not json")
    (run.path / "knobs.jsonl").write_text("garbage\n")
    # Both damaged: the values the workers recorded running with (none yet: the run's own).
    run.knobs.set(horizon=3)
    assert sorted(p.name for p in read) == ["worker-0.jsonl", "worker-1.jsonl"]
    assert (
        run.knobs.store.read()[1]["horizon"] == 3 and run.knobs.store.read()[1]["merge_every"] == 50
    )


def test_window_shows_a_refused_knob_record_on_the_knob_panel():
    model = RunModel(2)
    in_force = {"horizon": 5, "merge_every": 100}
    applied = KnobsApplied(step=0, time=1.0, version=2, values=in_force)
    refused = KnobsRefused(
        step=10,
        time=2.0,
        version=3,
        knob="horizon",
        value=99,
        in_force=in_force,
        in_force_version=2,
        message="knob record version 3 refused: horizon must be in [1, 16], got 99; "
        "horizon stays 5",
        reason="horizon must be in [1, 16], got 99",
    )
    model.ingest([replace(applied, worker=0), replace(applied, worker=1)])
    model.ingest([replace(refused, worker=0), replace(refused, worker=1)])
    progress = [{"worker": 0}, {"worker": 1}]
    rows = {r.name: r for r in model.knob_rows({"horizon": 99, "merge_every": 100}, progress)}
    assert rows["horizon"].error == "refused 99; 5 stays"
    assert rows["horizon"].applied_text == "refused 99; 5 stays"
    assert rows["merge_every"].error is None and rows["merge_every"].applied_text == "now 100"
    assert model.error_count == 1 and "horizon stays 5" in model.errors[-1]  # told once
    # An unreadable record: every other knob says the last good values stay.
    unreadable = replace(refused, version=None, knob=None, value=None, worker=0)
    model.ingest([unreadable])
    rows = {r.name: r for r in model.knob_rows({"horizon": 5, "merge_every": 100}, progress)}
    assert "last good values stay" in rows["merge_every"].applied_text
    assert rows["horizon"].error == "refused 99; 5 stays"
    # A newer good version applied clears the errors.
    model.ingest([replace(applied, version=4, worker=0)])
    assert all(r.error is None for r in model.knob_rows({"horizon": 5}, progress))
    # A crash the run recorded reaches the status line and Log tab.
    model.ingest([Crashed(worker=1, step=5, time=3.0, message="worker 1 died")])
    assert model.errors[-1] == "worker 1 died"


def test_checkpoint_keeps_the_previous_until_the_new_one_is_complete(tmp_path):
    path = tmp_path / "worker-0.pt"
    save_checkpoint(path, {"step": 100})
    save_checkpoint(path, {"step": 200})
    assert load_state(previous_path(path))["step"] == 100
    assert load_checkpoint(path) == ({"step": 200}, path, "")
    path.write_bytes(path.read_bytes()[:40])  # torn: a crash while it was copied
    state, used, why = load_checkpoint(path)
    assert state["step"] == 100 and used == previous_path(path) and "corrupt" in why
    path.unlink()
    assert load_checkpoint(path)[0]["step"] == 100
    previous_path(path).write_bytes(b"")
    with pytest.raises(WeightsError, match="no complete checkpoint"):
        load_checkpoint(path)


def test_resume_from_a_truncated_checkpoint_uses_the_previous_one(tmp_path):
    """A checkpoint cut in half after a real run: the resumed worker process falls back to the
    previous checkpoint and says so. Only a worker resuming from the files its run wrote shows
    the fallback chosen at start-up."""
    settings = RunSettings(workers=1, checkpoint_every=150)
    run = Run.create(tmp_path / "run", tiny(200), settings)
    run.start()
    run.workers.wait()
    ckpt = checkpoint_path(run.path, 0)
    assert load_state(ckpt)["step"] == 200 and load_state(previous_path(ckpt))["step"] == 150
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])

    resumed = Run.resume(run.path, steps=300)
    resumed.start()
    resumed.workers.wait()
    record = events(resumed, Resumed, 0)[-1]
    assert record.step == 150 and record.checkpoint == "worker-0.prev.pt"
    assert "worker-0.pt" in record.fallback and "at step 150" in record.fallback
    assert events(resumed, Stop, 0)[-1].step == 300
    told = [n for n in resumed.notices() if "previous checkpoint" in n]
    assert len(told) == 1 and told[0].startswith("warning: worker 0:"), told
    assert load_state(ckpt)["step"] == 300  # complete again


def _lines(path):
    return path.read_bytes().splitlines()


def test_damaged_metrics_lines_are_skipped_with_a_warning(tmp_path, capsys):
    run = Run.create(tmp_path / "run", tiny(10), RunSettings(workers=1))
    log = run.path / "worker-0.jsonl"
    good = [json.dumps(Episode(time=1.0, step=s, ret=1.0, length=9).to_json()) for s in (50, 100)]
    bad = json.dumps({"kind": "episode", "time": 1.0, "step": "x", "ret": 1.0, "length": 9})
    log.write_text(f"{good[0]}\nnot json at all\n[1, 2]\n{bad}\n{good[1]}\n" + '{"kind": "epi')
    watcher = Run.attach(run.path)
    assert [e.step for e in watcher.new_events()] == [50, 100]
    assert watcher.notices() == [f"warning: {log}: 3 damaged lines (torn, or not a record) skipped"]
    # A resumed worker's writer ends the torn line first: its records stay whole.
    writer = RunDir(run.path, metrics="worker-0.jsonl")
    writer.log(Episode(step=150, ret=2.0, length=1))
    writer.close()
    assert [e.step for e in watcher.new_events()] == [150]
    assert "1 damaged line " in watcher.notices()[0]
    assert len(writer.read_metrics(Episode)) == 3
    assert "4 damaged lines" in capsys.readouterr().err


def test_a_torn_request_line_loses_no_later_request(tmp_path):
    log = RequestLog(tmp_path)
    log.path.write_text('{"action": "pau')
    log.send("checkpoint")
    assert [r.action for r in log.receive()] == ["checkpoint"] and log.skipped == 1


def test_damaged_run_records_are_one_clear_error_naming_the_file(tmp_path, capsys):
    run = Run.create(tmp_path / "run", tiny(10), RunSettings(workers=2, merge_every=300))
    for index in (0, 1):
        (run.path / f"worker-{index}.jsonl").write_text("")
    settings = (run.path / "run.json").read_text()
    (run.path / "run.json").write_text(settings[:20])
    with pytest.raises(UserError, match="run.json is damaged") as err:
        Run.resume(run.path)
    assert """echo '{"workers": 2, "merge_every": 300}' >""" in str(err.value)
    assert main(["--headless", "--resume", str(run.path)]) == 2
    out = capsys.readouterr().err.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("error: ") and "run.json is damaged" in out[0]
    with pytest.raises(UserError, match="run.json is damaged"):
        Run.attach(run.path)
    (run.path / "run.json").write_text(settings)
    config = run.path / "config.json"
    horizon = f'"horizon": {run.cfg.horizon}'
    assert horizon in config.read_text()
    config.write_text(config.read_text().replace(horizon, '"horizon": "three"'))
    with pytest.raises(UserError, match="config.json is damaged .*restore it from a backup"):
        Run.resume(run.path)
    config.write_text("")
    with pytest.raises(UserError, match="config.json is damaged \\(not JSON"):
        Run.resume(run.path)


def test_resume_writes_a_damaged_members_record_again(tmp_path):
    run = Run.create(tmp_path / "run", tiny(10), RunSettings(workers=2))
    members = run.path / "merge" / "members.json"
    members.write_text('{"work')
    resumed = Run.resume(run.path)
    assert json.loads(members.read_text())["workers"] == [0, 1]
    assert any("members.json was damaged" in n for n in resumed.notices())


def test_a_run_directory_moved_away_mid_run_stops_the_workers(tmp_path):
    """The run directory renamed under running workers: both exit with code 3, nothing is made
    where it was, the owner says so once. Only real worker processes writing into a vanished
    directory show this."""
    settings = RunSettings(workers=2, merge_every=50)
    run = Run.create(tmp_path / "run", tiny(100_000), settings)
    run.start()
    try:
        assert wait_until(lambda: min(w["step"] for w in run.workers.progress()) >= 20, timeout=300)
        moved = tmp_path / "moved"
        os.rename(run.path, moved)
        assert wait_until(lambda: not any(w["alive"] for w in run.workers.progress()), timeout=60)
        made = sorted(str(p) for p in run.path.rglob("*")) if run.path.exists() else None
        assert made is None, f"a partial run was made where the directory was: {made}"
        assert [w["state"] for w in run.workers.progress()] == ["stopped", "stopped"]
        assert [p.process.exitcode for p in run.workers.procs.values()] == [3, 3]
        assert not run.workers.restarting
        told = [n for n in run.notices() if "vanished" in n]
        assert len(told) == 1 and told[0].startswith(f"error: the run directory {run.path}")
        for worker in (0, 1):  # the records that were written moved with the directory
            lines = [json.loads(line) for line in _lines(moved / f"worker-{worker}.jsonl")]
            assert lines[-1]["kind"] == "run_dir_gone" and "vanished" in lines[-1]["message"]
    finally:
        run.stop()


def test_a_full_disk_keeps_every_whole_line_and_retries_the_write(tmp_path, monkeypatch):
    # Injected at the write call: the first two appends are cut short by a full disk.
    run_dir = RunDir(tmp_path)
    run_dir.log(Episode(step=1, ret=1.0, length=1))
    real_write, failures, waits = os.write, [2], []

    def full_disk_write(fd, data):
        if failures[0] and len(data) > 1:
            failures[0] -= 1
            real_write(fd, data[: len(data) // 2])  # half a line reaches the file
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(workers.rundir.directory.os, "write", full_disk_write)
    with pytest.raises(OSError, match="No space"):  # nobody waits for space: the error stands
        run_dir.log(Episode(step=2, ret=2.0, length=1))
    run_dir.on_write_error = lambda err, path, size: waits.append((err.errno, path.name, size))
    run_dir.log(Episode(step=3, ret=3.0, length=1))
    run_dir.close()
    assert waits and waits[0][:2] == (errno.ENOSPC, "metrics.jsonl") and waits[0][2] > 20
    lines = _lines(tmp_path / "metrics.jsonl")
    assert [json.loads(line)["step"] for line in lines] == [1, 3]  # no half line left
    # An atomic write that fails keeps the previous file and leaves no temporary one.
    save_checkpoint(tmp_path / "w.pt", {"step": 1})
    monkeypatch.setattr(workers.rundir.directory.os, "replace", _raise_enospc)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path / "w.pt", {"step": 2})
    with pytest.raises(OSError):
        atomic_write_json(tmp_path / "knobs.json", {"version": 9})
    assert load_state(tmp_path / "w.pt") == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "w.pt"]


def _raise_enospc(*args):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MB file system of its own (a tmpfs: needs root), unmounted after the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("mounting a small tmpfs needs root (the injected-error test covers this)")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_pauses_training_until_space_is_freed(small_disk):
    """A real small tmpfs filled under a running worker (needs root, else skipped): training
    pauses with whole lines and checkpoint kept, and goes on by itself when space is freed. Only
    a real full disk shows every write path of the process holding."""
    settings = RunSettings(workers=1, merge_every=50, checkpoint_every=50, tensorboard=False)
    run = Run.create(small_disk / "run", tiny(100_000), settings)
    run.start()
    try:
        assert wait_until(lambda: run.workers.progress()[0]["step"] >= 120, timeout=300)
        ballast = small_disk / "ballast"
        with open(ballast, "wb") as f:  # fill the disk
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
        assert wait_until(lambda: run.workers.progress()[0]["state"] == "disk full", timeout=120)
        blocked = run.workers.progress()[0]
        assert wait_until(lambda: any("paused" in n for n in run.notices()), timeout=10)
        log = small_disk / "run" / "worker-0.jsonl"
        before = [json.loads(line) for line in _lines(log)]  # every line whole
        ckpt = checkpoint_path(run.path, 0)
        kept = load_checkpoint(ckpt)[0]["step"]  # the newest complete checkpoint stays
        # Still paused once it tried again and failed (each try sets the heartbeat anew).
        tried = run.workers.progress()[0]["heartbeat"]
        assert wait_until(lambda: run.workers.progress()[0]["heartbeat"] > tried, timeout=30)
        assert run.workers.progress()[0]["state"] == "disk full"
        assert run.workers.progress()[0]["step"] == blocked["step"]

        ballast.unlink()  # space again: training goes on by itself
        assert wait_until(
            lambda: run.workers.progress()[0]["step"] >= blocked["step"] + 60, timeout=120
        )
        assert any("writes again" in n for n in run.notices())
    finally:
        run.stop()
    after = [json.loads(line) for line in _lines(log)]
    assert after[: len(before)] == before
    resumed = [r for r in after if r["kind"] == "disk_resumed"]
    assert len(resumed) == 1 and resumed[0]["paused_s"] >= DISK_RETRY_S  # through a retry
    assert load_checkpoint(ckpt)[0]["step"] > kept
