"""Faults a run must survive: a killed worker, damaged knob records, torn checkpoints, corrupt
records, a vanished run directory, a full disk."""

import json
import os
import signal

from test_run import events, tiny, wait_until

import workers.run
from workers.run import Run, RunSettings


def test_killed_worker_is_noticed_at_once_restarted_and_merges_again(tmp_path, monkeypatch):
    # Without the monitor, the survivor waited the whole merge timeout for the dead worker at
    # every merge; the timeout here is long enough that such a wait shows in merge_ms. A longer
    # back-off than the default leaves the survivor time to merge alone before the restart.
    monkeypatch.setattr(workers.run, "RESTART_BACKOFF_S", 8.0)
    settings = RunSettings(workers=2, merge_every=100, merge_timeout_s=30, max_restarts=2)
    run = Run.create(tmp_path / "run", tiny(100_000), settings)
    run.start()
    try:
        assert wait_until(lambda: len(events(run, "merge", 0)) >= 1, timeout=300)
        os.kill(run._procs[1].process.pid, signal.SIGKILL)
        assert wait_until(lambda: events(run, "crashed", 1), timeout=30)
        crash = events(run, "crashed", 1)[0]
        assert crash["signal"] == "SIGKILL" and not crash["final"]
        assert "restarting it from the merged weights" in crash["message"]
        members = json.loads((run.path / "merge" / "members.json").read_text())
        assert members["workers"] == [0] or members["down"] == {}  # already back, or down
        notices = run.notices()
        assert any("worker 1 died (killed by SIGKILL" in n for n in notices), notices

        # The survivor's merges while worker 1 is down: nobody waited for it.
        def merges_without_1():
            return [m for m in events(run, "merge", 0) if m["time"] > crash["time"]]

        assert wait_until(lambda: merges_without_1(), timeout=60)
        # Restarted from the merged weights, it takes part in merges again.
        assert wait_until(lambda: events(run, "started_from_merged", 1), timeout=120)
        restarted = events(run, "started_from_merged", 1)[0]
        assert wait_until(
            lambda: any(
                m["participants"] == [0, 1] and m["time"] > restarted["time"]
                for m in events(run, "merge", 0)
            ),
            timeout=300,
        ), "the restarted worker never merged again"
        alone = [m for m in merges_without_1() if m["time"] < restarted["time"]]
        assert alone and all(m["participants"] == [0] and "1" in m["left_out"] for m in alone)
        print("merges while worker 1 was down:", [m["merge_ms"] for m in alone])
        assert all(m["merge_ms"] < 1000 for m in alone), alone
        assert any("runs again" in n for n in run.notices())
    finally:
        run.stop()


def test_worker_that_keeps_dying_is_left_out_for_good(tmp_path):
    settings = RunSettings(workers=2, merge_every=100, merge_timeout_s=30, max_restarts=1)
    run = Run.create(tmp_path / "run", tiny(100_000), settings)

    def restarted(old_pid):
        running = run.progress()[1]["state"] not in ("starting", "crashed")
        return run._procs[1].process.pid != old_pid and running

    run.start()
    try:
        assert wait_until(lambda: min(w["step"] for w in run.progress()) >= 20, timeout=300)
        first = run._procs[1].process.pid
        os.kill(first, signal.SIGKILL)
        assert wait_until(lambda: len(events(run, "crashed", 1)) == 1, timeout=30)
        assert wait_until(lambda: restarted(first), timeout=120)  # after the back-off
        os.kill(run._procs[1].process.pid, signal.SIGKILL)
        assert wait_until(lambda: len(events(run, "crashed", 1)) == 2, timeout=30)
        final = events(run, "crashed", 1)[-1]
        assert final["final"] and "left out for good after 1 restart" in final["message"]
        members = json.loads((run.path / "merge" / "members.json").read_text())
        assert members["workers"] == [0] and "left out for good" in members["down"]["1"]
        assert not run.restarting and run.progress()[1]["state"] == "crashed"
        assert run.progress()[0]["alive"], "the survivor goes on"
    finally:
        run.stop()
