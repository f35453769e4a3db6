"""Merged-weight workers end to end: spawned processes, merging, live knobs, checkpoint and
resume, and the faults a run must survive."""

import json
import os
import signal
import threading
import time

import pytest
from conftest import events, wait_until
from conftest import tiny_run as tiny
from helpers.views import LIKE, task_view, unlike

from agent.errors import ConfigError, UserError
from workers.run.owner import Run, RunSettings
from workers.rundir.directory import load_state
from workers.rundir.paths import checkpoint_path
from workers.rundir.records import (
    Episode,
    KnobsApplied,
    Merge,
    Resumed,
    ShowcaseEpisode,
    StartedFromMerged,
    Stop,
)


def test_two_workers_merge_apply_knobs_checkpoint_and_resume(tmp_path):
    """Two spawned workers merge every round, apply a knob set mid-run, checkpoint and resume
    from their checkpoints with the knobs in force: only real worker processes show the whole
    loop through the run directory (hooks and rounds are unit-tested in-process)."""
    settings = RunSettings(workers=2, merge_every=100, checkpoint_every=10_000, merge_timeout_s=120)
    run = Run.create(tmp_path / "run", tiny(400), settings)
    run.start()
    assert wait_until(lambda: min(w["step"] for w in run.workers.progress()) >= 150)
    with pytest.raises(ConfigError, match="horizon"):
        run.knobs.set(horizon=99)
    version = run.knobs.set(horizon=2, merge_every=120)
    assert version == 1
    run.workers.wait()
    assert [w["state"] for w in run.workers.progress()] == ["done", "done"]
    for worker in (0, 1):
        applied = [e for e in events(run, KnobsApplied, worker) if e.version == 1]
        assert applied and applied[0].values["horizon"] == 2
        merges = events(run, Merge, worker)
        assert len(merges) >= 3 and all(m.participants == (0, 1) for m in merges)
        assert all(m.distances[0] >= 0 for m in merges)
    history = [json.loads(line) for line in (run.path / "knobs.jsonl").read_text().splitlines()]
    assert [h["version"] for h in history] == [0, 1]
    assert history[1]["changes"] == {"horizon": 2, "merge_every": 120}
    assert all((run.path / "checkpoints" / f"worker-{w}.pt").exists() for w in (0, 1))
    reader_events = run.new_events()
    assert {type(e) for e in reader_events} >= {Episode, Merge, Stop}
    assert run.new_events() == []

    # Resume continues from the checkpoints with the knobs in force.
    resumed = Run.resume(run.path, steps=500)
    resumed.start()
    resumed.workers.wait()
    for worker in (0, 1):
        assert events(resumed, Resumed, worker)[0].step == 400
        assert events(resumed, Stop, worker)[-1].step == 500


def test_killed_worker_is_left_out_and_can_restart(tmp_path):
    """A worker process killed by SIGKILL is seen as crashed, the survivor merges without it
    after the bounded wait, and a restart by hand counts on from the survivor's step. Only a real
    kill shows no metrics line left half-written."""
    settings = RunSettings(
        workers=2, merge_every=50, checkpoint_every=10_000, merge_timeout_s=2, max_restarts=0
    )  # restarted by hand here (tests/workers/test_reliability.py: automatically)
    run = Run.create(tmp_path / "run", tiny(600), settings)
    run.start()
    assert wait_until(lambda: min(w["step"] for w in run.workers.progress()) >= 120)
    victim = run.workers.progress()[1]
    os.kill(run.workers.procs[1].process.pid, signal.SIGKILL)
    assert wait_until(lambda: run.workers.progress()[1]["state"] == "crashed", timeout=30)
    assert run.workers.dead() == [1] and run.workers.dead() == []
    # Worker 0 goes on and merges without the dead one (after the bounded wait).
    assert wait_until(
        lambda: any(m.participants == (0,) for m in events(run, Merge, 0)), timeout=120
    )
    run.workers.restart(1)
    assert wait_until(
        lambda: run.workers.progress()[1]["state"] in ("seeding", "training"), timeout=60
    )
    run.stop()
    restarted = events(run, StartedFromMerged, 1)
    # It counts on from the step of the worker that kept going, so their merge rounds line up.
    assert restarted and victim["step"] > 0 and restarted[0].step >= 120
    lines = (run.path / "worker-1.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines), "a metrics line was half-written"


def test_bad_run_input(tmp_path):
    with pytest.raises(ConfigError, match=r"workers must be in \[1, 256\]"):
        RunSettings(workers=0)
    with pytest.raises(UserError, match="unknown task"):
        Run.create(tmp_path / "a", tiny(10, task="walker-fly"), RunSettings())
    with pytest.raises(UserError, match="not a multi-worker run"):
        Run.resume(tmp_path / "nothing-here")
    # A damaged knob record no longer stops a resume: tests/workers/test_reliability.py


def test_showcase_player_renders_merged_policy_into_shared_memory(tmp_path):
    """The showcase player process plays the merged weights live into shared memory: the frame
    shows the run's task (compared with cartpole rendered as the player does), episodes are
    recorded, and rendering pauses. Only the real player process shows this."""
    settings = RunSettings(workers=2, merge_every=50, checkpoint_every=10_000, merge_timeout_s=10)
    run = Run.create(tmp_path / "run", tiny(100_000), settings)
    run.start()
    assert wait_until(lambda: (run.path / "merge" / "merged.pt").exists(), timeout=180)
    run.pause()  # the nice-19 player gets the cores: its CPU budget is lifted (test_player.py)
    with pytest.raises(ConfigError, match="frame size"):
        run.showcase.start(height=4, width=4)
    run.showcase.choose(mode="live")  # the planner acting (auto would replay on this CPU budget)
    run.showcase.start(height=60, width=80, realtime=False)
    assert wait_until(lambda: run.showcase.read_frame() is not None, timeout=120)
    frame, info = run.showcase.read_frame()
    assert frame.shape == (60, 80, 3)
    cartpole = task_view("cartpole-balance", 60, 80, rendered=(60, 80))
    shown = unlike(frame, cartpole, block=1)  # rendered at this size: pixel by pixel
    assert shown < LIKE, shown  # the run's task: not a blank frame, not another task's
    assert info["weights_round"] >= 1
    # Rendering paused while the newest frame waits untaken (the player draws none until it is
    # taken: none is being drawn), then taken: from now on a frame is wanted, and none comes.
    complete = lambda seq: seq > info["sequence"] and seq % 2 == 0  # noqa: E731
    assert wait_until(lambda: complete(run.showcase.frame_sequence()), timeout=60, poll=0.01)
    run.showcase.pause_rendering()
    _, last = run.showcase.read_frame()
    # A whole episode played after that frame's is recorded (the player plays on), and drew
    # no frame though at least 50 steps would each have drawn one at up to 30 a second.
    episodes: list[int] = []

    def next_episode_recorded() -> bool:
        episodes.extend(
            e.episode
            for e in run.new_events()
            if isinstance(e, ShowcaseEpisode) and e.worker == "player"
        )
        return max(episodes, default=-1) > last["episode"]

    assert wait_until(next_episode_recorded, timeout=120, poll=0.05), episodes
    assert run.showcase.frame_sequence() == last["sequence"], "rendering did not pause"
    run.stop()
    assert all(w["state"] == "stopped" for w in run.workers.progress())


def test_control_worker_never_merges(tmp_path):
    settings = RunSettings(workers=3, control_worker=True)
    run = Run.create(tmp_path / "run", tiny(10), settings)
    specs = [run.workers._spec(i, resume=False) for i in range(3)]
    assert [s.merge_with for s in specs] == [(0, 1), (0, 1), ()]
    assert len({s.cfg["seed"] for s in specs}) == 3, "each worker has its own seed"
    # A lone worker has the merge backend (it publishes its weights as the merged ones and
    # merges once a worker is added); workers added later come after the control worker.
    alone = Run.create(tmp_path / "one", tiny(10), RunSettings(workers=1))
    assert alone.workers._spec(0, resume=False).merge_with == (0,)
    grown = RunSettings(workers=5, control_worker=True, added=2, removed=[0])
    assert grown.control_index == 2 and grown.merging == [1, 3, 4] and grown.removed == (0,)


def test_auto_iterations_become_a_live_knob_holding_the_base_count(tmp_path):
    # iterations=0 means 6: the run records that number, so the knob record is valid and a
    # later change of another knob is accepted. The planner adds 2 from 20 action dims to any
    # value, as the reference does, so the record holds 6 for humanoid too (it plans 8).
    walker = Run.create(tmp_path / "w", tiny(10, task="walker-walk", iterations=0), RunSettings())
    assert walker.cfg.iterations == 6
    assert walker.knobs.store.read()[1]["iterations"] == 6
    assert walker.knobs.set(horizon=4) == 1
    humanoid = Run.create(
        tmp_path / "h", tiny(10, task="humanoid-walk", iterations=0), RunSettings()
    )
    assert humanoid.knobs.store.read()[1]["iterations"] == 6
    assert humanoid.cfg.resolved_iterations(21) == 8


def test_stop_during_pretraining_checkpoints_and_resume_finishes_it(tmp_path):
    # Pretraining is seed_steps updates in one go (minutes on a CPU with real presets); a stop
    # must end it at once with a checkpoint, and a resumed run does only the updates left.
    """A stop during the seed_steps pretraining updates ends them at once with a checkpoint, and
    a resumed worker does only the updates left: only a real worker process shows the stop
    reaching it inside the pretraining loop."""
    seed_steps = 3000
    run = Run.create(
        tmp_path / "run", tiny(seed_steps + 100, seed_steps=seed_steps), RunSettings(workers=1)
    )
    run.start()
    assert wait_until(lambda: run.workers.progress()[0]["updates"] >= 20, timeout=300)
    assert run.workers.progress()[0]["state"] == "pretraining"
    run.stop(timeout=120)
    assert (
        run.workers.progress()[0]["state"] == "stopped"
        and run.workers.progress()[0]["exitcode"] == 0
    )
    ckpt = load_state(checkpoint_path(run.path, 0), "cpu")
    assert not ckpt["pretrained"] and 20 <= ckpt["pretrain_updates"] < seed_steps
    assert ckpt["updates"] == ckpt["pretrain_updates"]

    resumed = Run.resume(run.path)
    resumed.start()
    resumed.workers.wait()
    final = load_state(checkpoint_path(run.path, 0), "cpu")
    assert final["pretrained"] and final["pretrain_updates"] == seed_steps
    # One update per step after pretraining (steps_per_update 1), not a second full pretraining.
    assert final["updates"] == seed_steps + (final["step"] - ckpt["step"])


def test_add_and_remove_workers_mid_run(tmp_path):
    """A worker process added mid-run starts from the merged weights at the others' step, one
    removed leaves the rounds, an attached watcher follows both, and a resume skips the removed
    one. Only real processes started and ended mid-run show it."""
    settings = RunSettings(workers=2, merge_every=50, checkpoint_every=10_000, merge_timeout_s=30)
    run = Run.create(tmp_path / "run", tiny(700), settings)
    with pytest.raises(UserError, match="start the run"):
        run.workers.add()
    run.start()
    with pytest.raises(UserError, match="merged weights"):
        run.workers.add()  # nothing merged yet to start it from
    assert wait_until(lambda: (run.path / "merge" / "merged.pt").exists())
    watcher = Run.attach(run.path)  # a window attached to the run follows its workers
    assert len(watcher.workers.progress()) == 2
    slowest = min(w["step"] for w in run.workers.progress())
    assert run.workers.add() == 2
    assert json.loads((run.path / "run.json").read_text())["workers"] == 3
    assert len(watcher.workers.progress()) == 3
    joined = lambda: events(run, StartedFromMerged, 2)  # noqa: E731
    assert wait_until(lambda: joined(), timeout=120)
    assert joined()[0].step >= slowest, "the new worker counts on from the others' step"
    assert wait_until(
        lambda: any(m.participants == (0, 1, 2) for m in events(run, Merge, 0)), timeout=240
    ), "the added worker never took part in a merge"

    run.workers.remove(0)
    with pytest.raises(UserError, match="not in the run"):
        run.workers.remove(0)
    assert wait_until(lambda: run.workers.progress()[0]["state"] == "removed", timeout=60)
    run.workers.wait()
    # Rounds after worker 0's last one (a record's time is when its merge ended, so worker 1's
    # record of the round worker 0 took part in may come after worker 0 left).
    last_round_of_0 = max(m.round for m in events(run, Merge, 0))
    later = [m for m in events(run, Merge, 1) if m.round > last_round_of_0]
    wrong = [m for m in later if m.participants != (1, 2) or 0 in m.left_out]
    assert later and not wrong, wrong
    assert [w["state"] for w in run.workers.progress()] == ["removed", "done", "done"]
    assert [w["state"] for w in watcher.workers.progress()] == ["removed", "done", "done"]
    with pytest.raises(UserError, match="no process is training this run"):
        watcher.pause()  # nobody would serve the request

    resumed = Run.resume(run.path, steps=800)
    assert resumed.settings.active == [1, 2]
    resumed.start()
    assert sorted(resumed.workers.procs) == [1, 2], "a removed worker is not resumed"
    resumed.stop()
    with pytest.raises(UserError, match="at least one worker"):
        alone = Run.create(tmp_path / "one", tiny(10), RunSettings(workers=1))
        alone.workers.remove(0)


def test_attached_view_follows_phases_pause_and_stop_from_the_records(tmp_path):
    run = Run.create(tmp_path / "run", tiny(1000), RunSettings(workers=1))
    watcher = Run.attach(run.path)
    log = run.path / "worker-0.jsonl"

    def record(kind, **fields):
        with open(log, "a") as f:
            f.write(json.dumps({"kind": kind, "time": time.time(), **fields}) + "\n")
        return watcher.workers.progress()[0]

    assert watcher.workers.progress()[0]["state"] == "attached-idle"  # nothing heard yet
    assert not watcher.resting  # maybe still starting: not known to rest
    assert record("seeding", step=40)["state"] == "seeding"
    seen = record("pretraining", step=99, updates=250)
    assert (seen["state"], seen["updates"], seen["alive"]) == ("pretraining", 250, True)
    assert record("train", step=150, updates=1150, steps_per_s=3.5)["state"] == "training"
    assert not watcher.resting
    assert record("pause", step=150)["state"] == "paused"
    assert watcher.resting  # nothing trains: this view's showcase may use the cores
    assert record("checkpoint", step=150)["state"] == "paused"  # still paused
    assert record("resume", step=150)["state"] == "training"
    assert not watcher.resting
    seen = record("stop", step=151, reason="stopped")
    assert (seen["state"], seen["alive"], watcher.resting) == ("stopped", False, True)


def test_a_stop_while_the_monitor_is_starting_does_not_fail(tmp_path):
    # Ctrl+C inside threading.Thread.start() leaves a monitor that is not running yet.
    run = Run.create(tmp_path / "run", tiny(10), RunSettings(workers=1))
    run.monitor.thread = threading.Thread(target=lambda: None)
    run.stop(timeout=1)  # joining an unstarted thread raised RuntimeError
    assert run._stop.is_set()
