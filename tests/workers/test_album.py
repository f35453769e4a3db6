"""The album: the schedule keeps the start densely and the rest evenly within a fixed bound over
a long synthetic run, its files are whole and read back, and a resumed run keeps the same album
as an uninterrupted one (the schedule lives in the file names)."""

import numpy as np
import pytest

from workers.rundir.album import (
    EARLY,
    SPREAD,
    album_entries,
    forget_after,
    keep_in_album,
    plan,
    worker_entries,
)
from workers.rundir.replays import EpisodeReplay
from workers.training.member import Member


def episode(step: int, worker: int = 0, kind: str = "train", length: int = 20):
    rewards = np.full(length, step / 1000, np.float32)
    states = np.stack([np.array([0.01 * t, step / 1e6]) for t in range(length + 1)])
    return EpisodeReplay(states, rewards, worker, kind, step, step // 500, 0.01)


def run_schedule(steps):
    kept: list[int] = []
    for step in steps:
        keep, dropped = plan(kept, step)
        kept = [s for s in kept if s not in dropped] + ([step] if keep else [])
    return sorted(kept)


def test_a_long_run_keeps_its_start_densely_and_the_rest_evenly_within_the_bound():
    # Humanoid-walk's length: 1M agent steps, an episode every 500.
    steps = list(range(500, 1_000_001, 500))
    kept = run_schedule(steps)
    assert len(kept) <= EARLY + SPREAD
    assert kept[:EARLY] == steps[:EARLY], "the first episodes are all kept"
    spread = kept[EARLY:]
    assert len(spread) >= SPREAD // 2, "thinning halves at most"
    gaps = np.diff([kept[EARLY - 1], *spread, steps[-1]])
    assert gaps.max() <= 2.5 * gaps.mean(), f"evenly spread, gaps {gaps.min()}..{gaps.max()}"
    assert spread[-1] >= 1_000_000 - 2 * gaps.mean(), "the late run is covered too"


def test_a_short_run_keeps_every_episode():
    steps = list(range(125, 125 * 40 + 1, 125))  # the CPU demo: 40 episodes
    assert run_schedule(steps) == steps


def test_the_bound_holds_at_every_moment_and_for_any_episode_length():
    for every in (37, 125, 1000):
        kept: list[int] = []
        for step in range(every, 300 * every, every):
            keep, dropped = plan(kept, step)
            kept = [s for s in kept if s not in dropped] + ([step] if keep else [])
            assert len(kept) <= EARLY + SPREAD


def test_episodes_ending_at_the_same_step_are_kept_once():
    kept = run_schedule([100, 100, 200])
    assert kept == [100, 200]


def test_files_follow_the_schedule_and_read_back(tmp_path):
    steps = list(range(250, 250 * 200 + 1, 250))
    for step in steps:
        keep_in_album(tmp_path, episode(step))
    entries = worker_entries(tmp_path, 0)
    assert [e.step for e in entries] == run_schedule(steps)
    first = entries[0].load()
    assert first.step == 250 and first.states.dtype == np.float32 and first.length == 20
    assert first.ret == pytest.approx(20 * 0.25)
    leftovers = [p.name for p in (tmp_path / "album" / "worker-0").iterdir()]
    assert all(name.endswith(".npz") for name in leftovers), "no partial file left behind"


def test_kinds_and_workers_are_kept_apart_and_listed_by_step(tmp_path):
    for step in (300, 100, 200):
        keep_in_album(tmp_path, episode(step, worker=1))
        keep_in_album(tmp_path, episode(step + 10, worker=0, kind="eval"))
    both = album_entries(tmp_path)
    assert [(e.worker, e.kind, e.step) for e in both] == [
        (1, "train", 100),
        (0, "eval", 110),
        (1, "train", 200),
        (0, "eval", 210),
        (1, "train", 300),
        (0, "eval", 310),
    ]
    assert [e.step for e in album_entries(tmp_path, workers=[0])] == [110, 210, 310]
    assert [e.step for e in album_entries(tmp_path, kinds=("train",))] == [100, 200, 300]
    assert album_entries(tmp_path / "no-such-run") == []


def test_a_resumed_run_keeps_the_album_an_uninterrupted_one_keeps(tmp_path):
    steps = list(range(300, 300 * 150 + 1, 300))
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    for step in steps:
        keep_in_album(whole, episode(step))
    # The resumed run got to step 30000, crashed, and resumed from a checkpoint at 24000: the
    # steps after it are trained again, so their episodes are forgotten and come again.
    for step in [s for s in steps if s <= 30_000]:
        keep_in_album(resumed, episode(step))
    assert forget_after(resumed, 0, 24_000) > 0
    assert all(e.step <= 24_000 for e in worker_entries(resumed, 0))
    for step in [s for s in steps if s > 24_000]:
        keep_in_album(resumed, episode(step))
    assert [e.step for e in worker_entries(resumed, 0)] == [
        e.step for e in worker_entries(whole, 0)
    ]


def test_a_workers_finished_episodes_go_to_its_album(tmp_path):
    from workers.rundir.directory import RunDir

    member = Member(
        seed=0,
        buffer=None,
        run_dir=RunDir(tmp_path, metrics="worker-2.jsonl"),
        rng=np.random.default_rng(0),
    )
    ep = episode(500)
    member.keep_replay(ep.states, list(ep.rewards), "eval", 500, 0.01)
    member.keep_replay(None, [1.0], "train", 600, 0.01)  # an env with no poses: nothing kept
    assert [(e.worker, e.kind, e.step) for e in album_entries(tmp_path)] == [(2, "eval", 500)]
    member.forget_album_after(400)
    assert album_entries(tmp_path) == []
