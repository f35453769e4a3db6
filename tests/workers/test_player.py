"""Showcase controls (camera, weights source, episode reset) and attaching to a run that another
process started. Real processes: one tiny 2-worker run is shared by the tests of this module."""

import json
import os
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import tiny_run as tiny
from conftest import wait_until
from helpers.views import LIKE, task_view, unlike

from agent.agent import TDMPC2
from agent.envs import DMControlEnv
from agent.errors import ConfigError, UserError
from workers.merging.files import FileMergeBackend
from workers.run.owner import Run, RunSettings
from workers.rundir.directory import RunDir, load_state, save_state
from workers.rundir.records import Checkpoint, KnobsApplied, Merge
from workers.showcase.frames import FrameBuffer
from workers.showcase.pacing import Pace
from workers.showcase.shown_weights import ShownWeights, model_weights, weights_file

EPISODE = 200  # long enough that a reset is told apart from an episode's natural end


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    settings = RunSettings(workers=2, merge_every=50, checkpoint_every=10_000, merge_timeout_s=10)
    cfg = tiny(1_000_000, episode_length=EPISODE)
    run = Run.create(tmp_path_factory.mktemp("player") / "run", cfg, settings)
    run.start()
    yield run
    run.stop(timeout=30)


@pytest.fixture(scope="module")
def player(live):
    """The live run's player, with training paused: the nice-19 player gets the cores."""
    merge = live.path / "merge"
    assert wait_until(
        lambda: all((merge / f).exists() for f in ("merged.pt", "worker-1.pt")), timeout=120
    )
    live.pause()
    live.showcase.start(height=48, width=64, realtime=False)
    assert wait_until(lambda: live.showcase.read_frame() is not None, timeout=60)
    yield live
    live.showcase.stop()
    live.resume_training()


def newest(run: Run) -> tuple:
    """The newest frame and its info (a read while the player writes a frame gets None: retry)."""
    deadline = time.monotonic() + 10
    while (got := run.showcase.read_frame()) is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert got is not None, "no complete frame for 10 s"
    return got


def info(run: Run) -> dict:
    return newest(run)[1]


def test_camera_names_and_attach_refuses_other_directories(tmp_path):
    run = Run.create(tmp_path / "run", tiny(10), RunSettings(workers=1))
    assert run.showcase.camera_names() == ["fixed", "lookatcart"]
    with pytest.raises(UserError, match="not a multi-worker run"):
        Run.attach(tmp_path / "nothing-here")
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="not a multi-worker run"):
        Run.attach(tmp_path / "file")
    single = tmp_path / "single"
    single.mkdir()
    (single / "config.json").write_text(json.dumps({"config": {}}))  # a one-agent run
    with pytest.raises(UserError, match="not a multi-worker run"):
        Run.attach(single)
    assert not run.attached and Run.attach(run.path).attached


def test_merge_files_record_the_weights_step(tmp_path):
    state = {"w": torch.ones(2)}
    backends = [FileMergeBackend(tmp_path, [0, 1], timeout_s=5) for _ in range(2)]
    threads = [
        threading.Thread(target=backends[k].merge, args=(k, 1, state), kwargs={"step": 100 + k})
        for k in (0, 1)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    merged, _ = weights_file(tmp_path, -1)
    assert model_weights(load_state(merged))[1:] == (1, 101)  # round, the furthest step
    path, _ = weights_file(tmp_path, 0)
    assert path.name == "worker-0.pt" and model_weights(load_state(path))[1:] == (1, 100)
    assert weights_file(tmp_path, 2) is None  # no weights: the player shows it untrained


def test_attach_sees_events_progress_and_sets_knobs(live):
    """A Run attached to the run directory of a run owned elsewhere sees both workers' progress
    and events and sets a knob they apply: only the owner's spawned workers show the shared
    progress and the records crossing over."""
    live.resume_training()  # in case the player tests ran first
    attached = Run.attach(live.path)
    assert wait_until(
        lambda: min(w["step"] for w in attached.workers.progress()) >= 50, timeout=120
    )
    first = attached.workers.progress()
    assert [w["worker"] for w in first] == [0, 1]
    assert set(first[0]) == set(live.workers.progress()[0])  # the same keys as the owner's
    assert all(w["state"] in ("seeding", "pretraining", "training") for w in first), first
    assert all(w["alive"] for w in first)
    assert wait_until(
        lambda: all(
            now["step"] > before["step"]
            for now, before in zip(attached.workers.progress(), first, strict=True)
        ),
        timeout=60,
    )
    seen = attached.new_events()
    assert {e.worker for e in seen} >= {0, 1} and any(isinstance(e, Merge) for e in seen)
    version = attached.knobs.set(horizon=2)

    def applied() -> bool:
        seen.extend(attached.new_events())
        applied = [(e.worker, e.version) for e in seen if isinstance(e, KnobsApplied)]
        return all((w, version) in applied for w in (0, 1))

    assert wait_until(applied, timeout=60)
    assert [w["knob_version"] for w in attached.workers.progress()] == [version, version]
    assert all(w["merges"] >= 1 for w in attached.workers.progress())


def test_attached_run_asks_its_owner_to_pause_checkpoint_and_stop(live):
    """An attached Run asks the owner to pause, resume, checkpoint and stop through requests the
    owner serves; its own stop leaves the workers running. Only real workers show each request
    acted on by the processes."""
    attached = Run.attach(live.path)
    with pytest.raises(UserError, match="attached"):
        attached.start()  # workers are started by the owner only
    attached.pause()
    served = live.serve_requests()  # the owner's loop (command line or window) does this
    assert [(r.action, r.error) for r in served] == [("pause", None)]
    paused = lambda: [w["state"] for w in attached.workers.progress()] == ["paused", "paused"]  # noqa: E731
    assert wait_until(paused, timeout=60), attached.workers.progress()
    assert all(w["alive"] for w in attached.workers.progress())
    attached.resume_training()
    live.serve_requests()
    assert wait_until(lambda: not paused() and attached.workers.progress()[0]["alive"], timeout=60)
    attached.new_events()
    attached.checkpoint()
    live.serve_requests()
    saved: set = set()

    def saved_by_both() -> bool:
        saved.update(e.worker for e in attached.new_events() if isinstance(e, Checkpoint))
        return saved == {0, 1}

    assert wait_until(saved_by_both, timeout=60), saved
    with pytest.raises(UserError, match="not in the run"):
        attached.workers.remove(7)  # checked here: nothing is sent
    attached.request_stop()
    assert [r.action for r in live.serve_requests()] == ["stop"]  # the owner stops itself
    attached.stop()  # only a local player (none here): the workers go on
    at_stop = [w["step"] for w in live.workers.progress()]

    def trained_on() -> bool:
        """Steps on past where a stop would end them (a stopping worker ends its step only)."""
        return all(w["step"] >= s + 2 for w, s in zip(live.workers.progress(), at_stop))

    assert wait_until(trained_on, timeout=60), (at_stop, live.workers.progress())
    assert all(
        w["alive"] and w["state"] not in ("stopped", "done") for w in live.workers.progress()
    )


def test_showcase_camera_and_source_change_while_playing(player):
    """The showcase player's process takes a camera and a weights source chosen while it plays
    (and refuses bad ones here): only the real player process shows the shared controls reaching
    its frames."""
    frame, first = newest(player)
    assert frame.shape == (48, 64, 3)
    assert first["camera"] == 0 and first["source"] == -1
    assert first["weights_step"] >= 50 and first["weights_round"] >= 1  # merged after a merge

    player.showcase.choose(camera=1)
    assert wait_until(lambda: info(player)["camera"] == 1, timeout=60, poll=0.05)
    player.showcase.choose(source=1)
    assert wait_until(lambda: info(player)["source"] == 1, timeout=60, poll=0.05)
    shown = info(player)
    assert shown["weights_step"] >= 50 and shown["camera"] == 1

    with pytest.raises(ConfigError, match=r"camera must be in \[-1, 1\].*got 2"):
        player.showcase.choose(camera=2, source=0)
    with pytest.raises(ConfigError, match=r"camera must be in \[-1, 1\].*got -2"):
        player.showcase.choose(camera=-2)
    with pytest.raises(ConfigError, match=r"source must be -1 .* \[0, 1\], got 2"):
        player.showcase.choose(camera=0, source=2)
    with pytest.raises(ConfigError, match="source"):
        player.showcase.choose(source=True)
    assert player.showcase.settings() == {
        "camera": 1,
        "source": 1,
        "mode": "auto",
        "pin": None,
        "panes": "single",
    }
    with pytest.raises(ConfigError, match="mode must be one of auto, live, replay"):
        player.showcase.choose(mode="fast")
    # The frame after the one taken now is rendered after the refusals: it still shows (1, 1).
    taken = info(player)["sequence"]
    assert wait_until(lambda: info(player)["sequence"] != taken, timeout=30, poll=0.01)
    assert (info(player)["camera"], info(player)["source"]) == (1, 1)

    player.showcase.choose(camera=-1, source=-1)  # MuJoCo's free camera, the merged weights
    assert wait_until(
        lambda: (info(player)["camera"], info(player)["source"]) == (-1, -1), timeout=60
    )
    frame, shown = newest(player)
    free_view = task_view("cartpole-balance", 48, 64, rendered=(48, 64), camera=-1)
    assert unlike(frame, free_view, block=1) < LIKE, unlike(frame, free_view, block=1)
    assert shown["weights_step"] >= first["weights_step"]


def test_reset_showcase_starts_a_new_episode(player):
    """A reset asked of the playing showcase starts a new episode, recorded as no finished
    episode: only the real player process shows the reset event crossing to it mid-episode."""
    assert wait_until(lambda: 5 <= info(player)["step"] <= EPISODE // 4, timeout=30, poll=0.01)
    before = info(player)
    player.showcase.reset()
    assert wait_until(lambda: info(player)["episode"] > before["episode"], timeout=60, poll=0.01)
    after = info(player)
    assert after["episode"] == before["episode"] + 1 and after["step"] < EPISODE // 2
    # Ended by the reset, not by its time limit: no finished-episode record for it.
    log = player.path / "player.jsonl"  # written at the first finished episode
    lines = log.read_text().splitlines() if log.exists() else []
    finished = [json.loads(line) for line in lines if '"showcase_episode"' in line]
    assert before["episode"] not in [e["episode"] for e in finished]


def test_frame_buffer_renders_only_frames_the_reader_takes():
    frames = FrameBuffer(4, 6)
    try:
        assert frames.wanted()  # nothing written yet
        frames.write(np.full((4, 6, 3), 7, np.uint8), episode=0, step=1, weights_round=-1, ret=1.5)
        assert not frames.wanted() and frames.sequence() == 2
        frame, shown = frames.read()
        assert frames.wanted() and frame.mean() == 7 and shown["return"] == 1.5
        assert shown["pace"] == 1.0  # the default: real time
        frames.write(frame, episode=0, step=2, weights_round=-1, ret=2.0, pace=0.25)
        assert not frames.wanted() and frames.read()[1]["pace"] == 0.25
    finally:
        frames.close(unlink=True)


def test_pace_is_the_share_of_simulated_time_per_wall_second():
    slow = Pace(step_seconds=0.02, window_s=5.0)
    speeds = [slow.step(0.1 * i) for i in range(30)]  # 10 steps a wall second: 0.2 s simulated
    assert speeds[0] == 1.0 and abs(speeds[-1] - 0.2) < 1e-9 and slow.slow()
    fast = Pace(step_seconds=0.02)
    assert fast.step(0.0) == 1.0 and fast.step(0.001) == 1.0  # never reported above real time
    assert not fast.slow()


def test_player_notices_newer_weights_of_the_shown_source(live):
    # In slow motion the player switches to newer weights mid-episode: it must notice them.
    """The shown weights notice a newer merged.pt of the run: the run's workers give it a real
    merge file (the rest could be a unit test on a saved file)."""
    env = DMControlEnv(live.cfg.task)
    agent = TDMPC2(live.cfg, env.observation_space.shape[0], env.action_space.shape[0])
    env.close()
    log = RunDir(live.path, metrics="player-test.jsonl")
    shown = ShownWeights(agent, live.path, log)
    merged = live.path / "merge" / "merged.pt"
    assert wait_until(merged.exists, timeout=120)
    assert not shown.newer()  # nothing loaded yet
    shown.refresh(-1)
    assert shown.step >= 0 and not shown.newer()
    later = merged.stat().st_mtime + 10
    os.utime(merged, (later, later))  # as a new merge would
    assert shown.newer()
    shown.refresh(-1)
    assert not shown.newer()
    log.close()


def test_the_shown_weights_are_the_files_not_just_a_label(tmp_path):
    # Merge files hold one worker's networks (no pack dimension); the player's agent is a pack
    # of one: the weights must land in it, and a file for another model must not.
    cfg = tiny(10)
    env = DMControlEnv(cfg.task)
    dims = env.observation_space.shape[0], env.action_space.shape[0]
    env.close()
    agent, other = TDMPC2(cfg, *dims), TDMPC2(replace(cfg, seed=7), *dims)
    (tmp_path / "merge").mkdir()
    save_state(tmp_path / "merge" / "merged.pt", {"model": other.model_state(), "round": 3})
    log = RunDir(tmp_path, metrics="player-test.jsonl")
    shown = ShownWeights(agent, tmp_path, log)
    shown.refresh(-1)
    assert shown.round == 3
    assert all(torch.equal(agent.model_state()[k], v) for k, v in other.model_state().items())
    bigger = TDMPC2(replace(cfg, mlp_dim=cfg.mlp_dim * 2), *dims)
    save_state(tmp_path / "merge" / "merged.pt", {"model": bigger.model_state(), "round": 4})
    os.utime(tmp_path / "merge" / "merged.pt", (time.time() + 10, time.time() + 10))
    shown.refresh(-1)  # refused and logged; the last good weights stay
    assert shown.round == 3
    log.close()
    errors = [
        json.loads(line) for line in (tmp_path / "player-test.jsonl").read_text().splitlines()
    ]
    assert "weights do not match this model size" in errors[-1]["message"]


def steps_played(run: Run, seconds: float) -> int:
    """Agent steps the showcase played in `seconds`, from the frames it showed."""

    def position() -> int:
        shown = info(run)
        return shown["episode"] * EPISODE + shown["step"]  # episodes run to their time limit

    start, deadline, last = position(), time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        last = position()  # each read lets the player render its next frame
        time.sleep(0.02)
    return last - start


def test_paused_training_lifts_the_showcase_budget(player):
    """With training paused the player process plays more than 3x the steps it plays under its
    CPU budget while training runs, and the free time is not charged to the budget when
    training resumes: only real processes competing for the cores show the budget lifted. The
    player runs at nice 19, so under the other tests' load a 3 s window may find no core free:
    free play is measured again (up to a minute) until one does."""
    player.showcase.choose(mode="live")  # auto mode would turn a budgeted slow player to a replay
    try:
        budgeted = steps_while_training(player)
        windows = []
        assert wait_until(
            lambda: windows.append(steps_played(player, 3.0)) or windows[-1] > 3 * budgeted,
            timeout=60,
        ), (windows, budgeted)
        assert steps_while_training(player) > 0, "the free time was charged to the budget"
    finally:
        player.showcase.choose(mode="auto")


def steps_while_training(run: Run) -> int:
    """Steps the player plays in 3 s while training runs (under its CPU budget)."""
    run.resume_training()
    try:
        return steps_played(run, 3.0)
    finally:
        run.pause()


def test_the_showcase_replays_a_workers_finished_episode_at_real_speed(player):
    """Mode replay: the newest finished episode of the chosen source, from its recorded poses;
    the pose shown follows the wall clock at 1x and the pace the frames report is the one
    measured. Only the player process against a real clock shows it."""
    replay = player.path / "replays" / "worker-0.npz"
    if not replay.exists():  # training is paused here: let worker 0 finish an episode
        player.resume_training()
        assert wait_until(replay.exists, timeout=180)
        player.pause()
    player.showcase.choose(source=0, mode="replay")
    assert wait_until(lambda: info(player).get("replay") == 1, timeout=60, poll=0.05)

    def fresh() -> tuple[dict, float]:
        """The next frame rendered after this call (one is rendered once the last is taken)."""
        taken = info(player)["sequence"]
        assert wait_until(lambda: info(player)["sequence"] != taken, timeout=30, poll=0.01)
        return info(player), time.monotonic()

    def moved_on(first: dict) -> bool:
        """Half a second of poses played since `first` (25 agent steps), or it ended (held,
        looped or other weights): a pair of frames whose speed can be measured, or none."""
        now = info(player)
        ended = now["step"] < first["step"] or now["weights_step"] != first["weights_step"]
        return now["step"] >= first["step"] + 25 or now["step"] >= EPISODE or ended

    measured = []
    for _ in range(6):  # a pair of frames inside one episode (it plays 4 s, then 1 s held)
        first, t_first = fresh()
        assert wait_until(lambda first=first: moved_on(first), timeout=30, poll=0.01)
        later, t_later = fresh()
        assert later["replay"] == 1 and later["replay_worker"] == 0
        assert later["replay_length"] == EPISODE and later["step"] <= EPISODE
        if later["weights_step"] == first["weights_step"] and later["step"] < EPISODE:
            if later["step"] >= first["step"]:
                # 50 poses a second at cartpole's 0.02 s per agent step
                speed = (later["step"] - first["step"]) * 0.02 / (t_later - t_first)
                measured.append((speed, later["pace"]))
    # The pace measured from the frames shown is 1x, and the pace the frames report is it.
    assert measured and all(0.7 < speed < 1.3 for speed, _ in measured), measured
    assert all(abs(said - speed) < 0.3 for speed, said in measured), measured
    player.showcase.choose(mode="live")
    assert wait_until(lambda: info(player).get("replay") == 0, timeout=60, poll=0.05)
    player.showcase.choose(source=-1, mode="auto")
