"""A training process's merge rounds (workers/training/merge_rounds.py) in-process: a real tiny
agent, the file backend in a temporary run directory, and the other processes' side as the
files they would have written (no process is started)."""

import dataclasses
import threading

import pytest
import torch
from conftest import tiny_config, wait_until
from helpers.process_fakes import FakeTrainer, link, make_run, records, worker_spec

from workers.merging.files import FileMergeBackend, write_members
from workers.rundir.directory import DirLock, load_state, save_state
from workers.rundir.knob_record import KnobStore
from workers.rundir.lanes import Lane
from workers.rundir.paths import promoted_path
from workers.rundir.records import Merge, MergeSkipped, MergeStopped
from workers.rundir.settings import RunSettings
from workers.training.first_weights import StartState
from workers.training.merge_rounds import PROMOTION_ROUND, MergeRounds
from workers.training.stop_training import StopTraining

CFG = tiny_config(mlp_dim=32, enc_dim=16, latent_dim=16, num_samples=16, num_elites=4)


@pytest.fixture(autouse=True)
def close_trainers():
    yield
    FakeTrainer.close_all()


def rounds_of(path, workers, merge_with, start=None, stopping=lambda: False):
    """The merge rounds of one process holding `workers` (a pack when more than one)."""
    trainer = FakeTrainer(CFG, path, workers)
    specs = [worker_spec(path, CFG, w, merge_with, merge_timeout_s=60) for w in workers]
    links = [link(spec) for spec in specs]

    def set_snapshot(**values):
        for each in links:
            each.set(**values)

    return MergeRounds(specs, trainer, set_snapshot, stopping, start), trainer, links


def shifted(state, by):
    """Other weights of the same model: every tensor moved by `by`."""
    return {k: v + by for k, v in state.items()}


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_lone_worker_publishes_its_weights_as_the_merged_ones_and_records_no_merge(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=1))
    rounds, trainer, links = rounds_of(tmp_path, [0], (0,))
    trainer.step = 40
    rounds.merge(4)
    merged = load_state(tmp_path / "merge" / "merged.pt")
    assert (merged["round"], merged["participants"], merged["step"], merged["pool"]) == (
        4,
        [0],
        40,
        0,
    )
    assert same(merged["model"], trainer.weights(0))  # for the showcase and an added worker
    assert records(tmp_path, 0, Merge) == [] and links[0].value("merges") == 0


def test_a_packs_workers_take_their_mean_on_the_device(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=2))
    rounds, trainer, links = rounds_of(tmp_path, [0, 1], (0, 1))
    first, second = trainer.weights(0), trainer.weights(1)
    rounds.merge(1)
    mean = {k: (first[k] + second[k]) / 2 for k in first}
    for k in (0, 1):
        assert all(torch.allclose(trainer.weights(k)[n], mean[n]) for n in mean)
        (merge,) = records(tmp_path, k, Merge)
        assert merge.participants == (0, 1) and merge.left_out == {}
        assert merge.distances[0] > 0 and merge.distances[1] > 0
        assert links[k].value("merges") == 1
    assert all(
        torch.allclose(t, mean[n])
        for n, t in load_state(tmp_path / "merge/merged.pt")["model"].items()
    )


def test_a_worker_of_another_process_is_averaged_in_through_its_file(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=2))
    rounds, trainer, _ = rounds_of(tmp_path, [0], (0, 1))
    own = trainer.weights(0)
    FileMergeBackend(tmp_path, [0, 1]).publish(1, 2, shifted(own, 1.0), step=70)
    trainer.step = 60
    rounds.merge(2)
    assert all(torch.allclose(v, own[k] + 0.5) for k, v in trainer.weights(0).items())
    (merge,) = records(tmp_path, 0, Merge)
    assert merge.participants == (0, 1) and merge.round == 2
    assert merge.distances[0] == pytest.approx(merge.distances[1])
    assert load_state(tmp_path / "merge/merged.pt")["step"] == 70  # the furthest participant's


def test_a_worker_that_is_down_is_left_out_without_waiting_for_it(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=2))
    write_members(tmp_path, [0, 1], down={1: "crashed (killed by SIGKILL), restarting"})
    # Waiting for worker 1 would see this stop and end the round (the test after this one).
    rounds, trainer, _ = rounds_of(tmp_path, [0], (0, 1), stopping=lambda: True)
    own = trainer.weights(0)
    rounds.merge(1)
    (merge,) = records(tmp_path, 0, Merge)
    assert merge.participants == (0,)
    assert merge.left_out == {1: "crashed (killed by SIGKILL), restarting"}
    assert same(trainer.weights(0), own)


def test_a_stop_while_waiting_for_the_others_ends_the_round_unmerged(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=2))
    rounds, trainer, _ = rounds_of(tmp_path, [0], (0, 1), stopping=lambda: True)
    own = trainer.weights(0)
    with pytest.raises(StopTraining):
        rounds.merge(1)
    assert [r.round for r in records(tmp_path, 0, MergeStopped)] == [1]
    assert records(tmp_path, 0, Merge) == [] and same(trainer.weights(0), own)


def test_non_finite_weights_are_left_out_and_take_the_mean_of_the_others(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=2))
    rounds, trainer, _ = rounds_of(tmp_path, [0, 1], (0, 1))
    healthy = trainer.weights(0)
    with torch.no_grad():
        trainer.agent.model.state_dict()["encoder.layers.0.weight"][1, 0, 0] = float("nan")
    rounds.merge(1)
    (merge,) = records(tmp_path, 1, Merge)
    assert merge.participants == (0,) and merge.left_out == {1: "non-finite weights"}
    assert set(merge.distances) == {0}  # reset, not measured
    assert same(trainer.weights(1), healthy) and same(trainer.weights(0), healthy)

    with torch.no_grad():  # none finite: both take the pool's newest merged weights
        trainer.agent.model.state_dict()["encoder.layers.0.weight"][:, 0, 0] = float("inf")
    rounds.merge(2)
    assert same(trainer.weights(0), healthy) and same(trainer.weights(1), healthy)
    assert [r.reason for r in records(tmp_path, 0, MergeSkipped)] == [
        "own weights are not finite: took the pool's merged weights of round 1 (none of round 2"
        " came)"
    ]
    assert len(records(tmp_path, 0, Merge)) == 1  # a round nobody merged is no merge
    assert rounds.joining() is not None  # out of the mean until they update
    assert load_state(tmp_path / "merge/merged.pt")["round"] == 1
    with torch.no_grad():  # and with no merged weights at all, the round is skipped
        trainer.agent.model.state_dict()["encoder.layers.0.weight"][:, 0, 0] = float("inf")
    (tmp_path / "merge/merged.pt").unlink()
    rounds.merge(3)
    assert records(tmp_path, 0, MergeSkipped)[-1].reason == "own weights are not finite"


def test_a_joined_worker_takes_the_others_mean_until_it_has_updated(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=2))
    rounds, trainer, _ = rounds_of(tmp_path, [0], (0, 1), start=StartState(joined=True))
    other = FileMergeBackend(tmp_path, [0, 1])
    theirs = shifted(trainer.weights(0), 2.0)
    other.publish(1, 1, theirs)
    rounds.merge(1)
    (merge,) = records(tmp_path, 0, Merge)
    assert merge.participants == (1,)
    assert merge.left_out == {0: "joined the pool and has made no update of its own yet"}
    assert same(trainer.weights(0), theirs)
    trainer.updates += 1  # learned something of its own: in the mean from now on
    other.publish(1, 2, theirs)
    rounds.merge(2)
    assert records(tmp_path, 0, Merge)[-1].participants == (0, 1)


def test_a_lane_that_never_merges_publishes_its_own_weights_and_records_no_merge(tmp_path):
    lanes = (Lane(), Lane(merges=False))
    make_run(tmp_path, CFG, RunSettings(workers=2), ((0,), (1,)), lanes)
    rounds, trainer, _ = rounds_of(tmp_path, [1], (0, 1))
    assert rounds.follow(KnobStore(tmp_path).read_record())  # lane 1's pool
    trainer.step = 30
    rounds.merge(3)
    lane = tmp_path / "merge" / "lane-1"
    published = load_state(lane / "worker-1.pt")
    assert (published["round"], published["step"], published["pool"]) == (3, 30, 0)
    assert same(published["model"], trainer.weights(0))
    assert not (lane / "merged.pt").exists() and not (tmp_path / "merge/merged.pt").exists()
    assert records(tmp_path, 1, Merge) == []


def test_a_race_starts_from_the_merged_weights_of_the_pool_left(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=2))
    store = KnobStore(tmp_path)
    rounds, trainer, _ = rounds_of(tmp_path, [0], (0, 1))
    merged = shifted(trainer.weights(0), 3.0)
    FileMergeBackend(tmp_path, [0, 1]).publish_merged(5, merged, [0, 1], 50)
    store.start_race(CFG, ((0,), (1,)), (Lane(), Lane()))
    trainer.step = 55
    assert rounds.follow(store.read_record())
    assert same(trainer.weights(0), merged)
    assert rounds.pool_state() == {"pool": 1, "lane": 0, "pool_base": 55}
    assert rounds.backend.dir == tmp_path / "merge" / "lane-0"
    assert not rounds.follow(store.read_record())  # the same pool: nothing taken again


def test_a_race_does_not_take_merged_weights_of_another_pool(tmp_path):
    """merged.pt from before a promotion without weights (pool 0) while the worker is in the
    promotion's pool 2: a new race leaves its weights as they are."""
    make_run(tmp_path, CFG, RunSettings(workers=2))
    rounds, trainer, _ = rounds_of(tmp_path, [0], (0, 1), start=StartState(pool=2))
    own = trainer.weights(0)
    FileMergeBackend(tmp_path, [0, 1], pool=0).publish_merged(5, shifted(own, 3.0), [0, 1], 50)
    record = KnobStore(tmp_path).read_record()
    race = KnobStore.new_race(CFG, record.values, ((0,), (1,)), (Lane(), Lane()), 3)
    assert rounds.follow(race)
    assert same(trainer.weights(0), own)


def test_a_promotion_gives_every_worker_the_winners_weights_as_they_are_then(tmp_path):
    """Lane 0 (worker 0 here, worker 1 in another process) wins: its weights at the promotion
    are a last merge round of its workers' current weights, not its last merged file (up to
    merge_every steps old). Lane 1's pack, following first, waits for them; every worker takes
    them, and worker 2 restarted later from a checkpoint of the race takes them too, though the
    winners have trained on since."""
    layout = ((0, 1), (2, 3))
    make_run(tmp_path, CFG, RunSettings(workers=4, merge_every=30), layout, (Lane(), Lane()))
    store = KnobStore(tmp_path)
    winner, winning, _ = rounds_of(tmp_path, [0], (0, 1, 2, 3))
    loser, losing, _ = rounds_of(tmp_path, [2, 3], (0, 1, 2, 3))  # lane 1, a pack
    for rounds in (winner, loser):
        rounds.follow(store.read_record())
    now = winning.weights(0)
    stale = shifted(now, -1.0)
    FileMergeBackend(tmp_path, [0, 1], lane=0, pool=0).publish_merged(4, stale, [0, 1], 120)
    other = shifted(now, 0.5)  # worker 1's weights, as its process hands them in
    FileMergeBackend(tmp_path, [0, 1], lane=0, pool=0).publish(1, PROMOTION_ROUND, other, 130)
    version = store.promote(CFG, 0)
    waiting = threading.Thread(target=loser.follow, args=(store.read_record(),))
    waiting.start()
    assert winner.follow(store.read_record())
    waiting.join(30)
    assert not waiting.is_alive()
    mean = {k: (now[k] + other[k]) / 2 for k in now}
    for weights in (winning.weights(0), losing.weights(0), losing.weights(1)):
        assert all(torch.allclose(weights[k], mean[k]) for k in mean)
    assert load_state(tmp_path / "merge" / f"promoted-{version}.pt")["pool"] == version
    lane = load_state(tmp_path / "merge" / "lane-0" / "merged.pt")["model"]  # not `stale`
    assert all(torch.allclose(lane[k], mean[k]) for k in mean)
    winning.set_weights(0, shifted(mean, 2.0))  # the winner trains on
    restarted, again, _ = rounds_of(tmp_path, [2], (0, 1, 2, 3), start=StartState(lane=1))
    assert restarted.follow(store.read_record())
    assert all(torch.allclose(again.weights(0)[k], mean[k]) for k in mean)


def test_a_promotion_that_nobody_makes_falls_back_to_the_lanes_newest_merged(tmp_path):
    """The winning lane's workers never follow (all stopped): the others wait out the merge
    timeout, then take the lane's newest merged weights."""
    layout = ((0,), (1,))
    make_run(tmp_path, CFG, RunSettings(workers=2), layout, (Lane(), Lane()))
    store = KnobStore(tmp_path)
    trainer = FakeTrainer(CFG, tmp_path, [1])
    spec = worker_spec(tmp_path, CFG, 1, (0, 1), merge_timeout_s=0.5)
    rounds = MergeRounds([spec], trainer, lambda **_: None, lambda: False)
    rounds.follow(store.read_record())
    last = shifted(trainer.weights(0), 4.0)
    FileMergeBackend(tmp_path, [0], lane=0, pool=0).publish_merged(3, last, [0], 90)
    store.promote(CFG, 0)
    assert rounds.follow(store.read_record())
    assert same(trainer.weights(0), last)


@pytest.mark.parametrize("weights", [True, False])
def test_a_promotion_of_a_lane_that_never_merged_takes_its_workers_own_weights(tmp_path, weights):
    """The promoted worker's process publishes its own weights as they are at the promotion
    (not those of its last round); without weights every worker keeps its own."""
    layout, lanes = ((0,), (1,)), (Lane(), Lane(merges=False))
    make_run(tmp_path, CFG, RunSettings(workers=2), layout, lanes)
    store = KnobStore(tmp_path)
    rounds, trainer, _ = rounds_of(tmp_path, [0], (0, 1))
    solo, alone, _ = rounds_of(tmp_path, [1], (0, 1))
    for each in (rounds, solo):
        each.follow(store.read_record())
    own = trainer.weights(0)
    winner = alone.weights(0)
    FileMergeBackend(tmp_path, [1], lane=1, pool=0).publish(1, 4, shifted(winner, 5.0))
    store.promote(CFG, 1, weights=weights, from_worker=1 if weights else None)
    trainer.step = 130
    assert solo.follow(store.read_record())
    assert rounds.follow(store.read_record())
    assert same(trainer.weights(0), winner if weights else own)  # values only: weights stay
    assert rounds.pool_state() == {"pool": 1, "lane": None, "pool_base": 130}


def test_a_stop_while_the_winners_last_round_waits_leaves_the_promotion_without_an_error(tmp_path):
    """Worker 0 of the winning lane follows the promotion while a stop is asked and its lane
    mate (another process) has handed nothing in: the last round is cancelled, no file is
    written and the worker keeps its weights for its checkpoint instead of failing."""
    layout = ((0, 1), (2,))
    make_run(tmp_path, CFG, RunSettings(workers=3), layout, (Lane(), Lane()))
    store = KnobStore(tmp_path)
    rounds, trainer, _ = rounds_of(tmp_path, [0], (0, 1, 2), stopping=lambda: True)
    rounds.follow(store.read_record())
    own = trainer.weights(0)
    version = store.promote(CFG, 0)
    assert rounds.follow(store.read_record())
    assert same(trainer.weights(0), own)
    assert not (tmp_path / "merge" / f"promoted-{version}.pt").exists()


def test_a_worker_coming_after_a_promotion_and_a_merge_takes_the_pools_newest_weights(tmp_path):
    """A worker restarted (or resumed) from a checkpoint of the race after the promotion's pool
    has merged: it takes that pool's newest merged weights, not the promotion's (older by a
    merge), and counts its rounds as the pool's slowest worker does (the step it starts at),
    so that its rounds are the pool's in number and in time."""
    layout = ((0,), (1,))
    make_run(tmp_path, CFG, RunSettings(workers=2), layout, (Lane(), Lane()))
    store = KnobStore(tmp_path)
    late, trainer, _ = rounds_of(tmp_path, [1], (0, 1), start=StartState(lane=1))
    own = trainer.weights(0)
    version = store.promote(CFG, 0)
    promoted = {"model": shifted(own, 1.0), "step": 100, "pool": version}
    save_state(promoted_path(tmp_path, version), promoted)
    pool = FileMergeBackend(tmp_path, [0, 1], pool=version)
    pool.base = 95  # worker 0 entered the pool at step 95 and merged round 3 at 155
    pool.publish(0, 3, shifted(own, 2.0), 155)
    pool.publish_merged(3, shifted(own, 2.0), [0], 155)
    trainer.step = 155
    assert late.follow(store.read_record())
    assert same(trainer.weights(0), shifted(own, 2.0))
    assert late.pool_state() == {"pool": version, "lane": None, "pool_base": 95}


def test_a_promoted_lane_that_keeps_its_policies_hands_on_one_workers_own(tmp_path):
    """merge_policy off in the winning lane (a pack of workers 0 and 1): the promotion's
    weights are worker 0's as it would hold them after a last round, its own policy with the
    lane's mean world model, never an average of two policies that never shared weights; the
    lane's merged.pt ends as the same."""
    cfg = dataclasses.replace(CFG, merge_policy=False)
    layout = ((0, 1), (2,))
    make_run(tmp_path, cfg, RunSettings(workers=3), layout, (Lane(), Lane()))
    store = KnobStore(tmp_path)
    trainer = FakeTrainer(cfg, tmp_path, [0, 1])
    specs = [worker_spec(tmp_path, cfg, w, (0, 1, 2), merge_timeout_s=5) for w in (0, 1)]
    rounds = MergeRounds(specs, trainer, lambda **_: None, lambda: False)
    rounds.follow(store.read_record())
    trainer.set_weights(1, shifted(trainer.weights(1), 0.5))
    own = [trainer.weights(k) for k in (0, 1)]
    version = store.promote(cfg, 0)
    assert rounds.follow(store.read_record())
    promoted = load_state(promoted_path(tmp_path, version))["model"]
    for name, value in promoted.items():
        mean = (own[0][name] + own[1][name]) / 2
        expected = own[0][name] if name.startswith("pi.") else mean
        assert torch.allclose(value, expected, atol=1e-6), name
    lane = load_state(tmp_path / "merge" / "lane-0" / "merged.pt")["model"]
    assert same(lane, promoted)  # the lane's last published: what the promotion hands on


def test_a_promoted_lane_over_two_processes_that_keeps_its_policies_hands_on_one_set(tmp_path):
    """merge_policy off, the winning lane's workers 0 and 1 in two processes following the
    promotion at once: only the process of the lane's lowest participant writes what the
    promotion hands on (worker 0's own policy with the lane's mean); both workers end on it,
    and so do the lane's merged.pt and the promotion file (each process wrote its own before)."""
    cfg = dataclasses.replace(CFG, merge_policy=False)
    make_run(tmp_path, cfg, RunSettings(workers=3), ((0, 1), (2,)), (Lane(), Lane()))
    store = KnobStore(tmp_path)
    processes = []
    for w in (0, 1):
        trainer = FakeTrainer(cfg, tmp_path, [w])
        spec = worker_spec(tmp_path, cfg, w, (0, 1, 2), merge_timeout_s=20)
        rounds = MergeRounds([spec], trainer, lambda **_: None, lambda: False)
        rounds.follow(store.read_record())
        processes.append((rounds, trainer))
    second = processes[1][1]
    second.set_weights(0, shifted(second.weights(0), 0.5))
    own = [trainer.weights(0) for _, trainer in processes]
    version = store.promote(cfg, 0)
    record = store.read_record()
    following = [threading.Thread(target=r.follow, args=(record,)) for r, _ in processes]
    for thread in following:
        thread.start()
    for thread in following:
        thread.join(60)
    promoted = load_state(promoted_path(tmp_path, version))["model"]
    for name, value in promoted.items():
        mean = (own[0][name] + own[1][name]) / 2
        expected = own[0][name] if name.startswith("pi.") else mean
        assert torch.allclose(value, expected, atol=1e-6), name
    assert all(same(trainer.weights(0), promoted) for _, trainer in processes)
    assert same(load_state(tmp_path / "merge" / "lane-0" / "merged.pt")["model"], promoted)


def test_a_process_whose_workers_are_all_non_finite_takes_the_pools_merged_weights(tmp_path):
    """One worker a process, worker 1's weights NaN: its file says so for the round, worker 0
    merges at once without waiting for it (a wait would see the stop and end the round), and
    worker 1 takes what worker 0 publishes, with a new Adam, instead of training on NaN and
    holding every round up for the merge timeout."""
    make_run(tmp_path, CFG, RunSettings(workers=2))
    healthy, kept, _ = rounds_of(tmp_path, [0], (0, 1), stopping=lambda: True)
    broken, lost, _ = rounds_of(tmp_path, [1], (0, 1))
    with torch.no_grad():
        lost.agent.model.state_dict()["encoder.layers.0.weight"][0, 0, 0] = float("nan")
    waiting = threading.Thread(target=broken.merge, args=(1,))
    waiting.start()
    assert wait_until(lambda: (tmp_path / "merge" / "worker-1.pt").exists(), 30, 0.05)
    healthy.merge(1)
    waiting.join(30)
    assert not waiting.is_alive()
    (merge,) = records(tmp_path, 0, Merge)
    assert merge.participants == (0,) and merge.left_out == {1: "non-finite weights"}
    assert same(lost.weights(0), kept.weights(0))
    (taken,) = records(tmp_path, 1, Merge)
    assert taken.participants == (0,) and taken.left_out == {1: "non-finite weights"}
    assert "took the pool's merged weights" in taken.note
    assert records(tmp_path, 1, MergeSkipped) == []


def test_a_merge_file_lock_waits_its_own_time_not_the_merge_timeout(tmp_path):
    """A merge timeout of 10 ms is how long a round waits for the others, not how long a file
    lock may be held by a reader loading a model: a publish behind a held lock is still
    waiting a second later (it raised filelock.Timeout after 10 ms) and writes once the holder
    lets go, instead of failing the worker."""
    backend = FileMergeBackend(tmp_path, [0, 1], timeout_s=0.01)
    state = {"w": torch.ones(3)}
    backend.publish(0, 1, state)
    failed = []

    def publish() -> None:
        try:
            backend.publish(0, 2, state)
        except Exception as err:  # the worker's crash, before
            failed.append(err)

    with DirLock(str(tmp_path / "merge" / "worker-0.pt") + ".lock", timeout=1):  # a reader
        publishing = threading.Thread(target=publish, daemon=True)
        publishing.start()
        assert not wait_until(lambda: not publishing.is_alive(), timeout=1.0, poll=0.02)
    publishing.join(60)
    assert not failed and backend.read(0)[0] == 2


def test_with_the_policy_kept_only_the_lowest_participants_process_publishes(tmp_path):
    """merge_policy off, one worker a process: worker 1's process merges round 1 with worker
    0's file and leaves merged.pt to worker 0's process (else merged.pt would be worker 0's
    policy one round and worker 1's the next, as each process published its own)."""
    cfg = dataclasses.replace(CFG, merge_policy=False)
    make_run(tmp_path, cfg, RunSettings(workers=2))
    trainer = FakeTrainer(cfg, tmp_path, [1])
    spec = worker_spec(tmp_path, cfg, 1, (0, 1), merge_timeout_s=60)
    rounds = MergeRounds([spec], trainer, lambda **_: None, lambda: False)
    theirs = shifted(trainer.weights(0), 1.0)
    FileMergeBackend(tmp_path, [0, 1]).publish(0, 1, theirs, step=10)
    rounds.merge(1)
    assert records(tmp_path, 1, Merge)[-1].participants == (0, 1)
    assert not (tmp_path / "merge" / "merged.pt").exists()
    first, _, _ = rounds_of(tmp_path, [0], (0, 1))
    first.trainer.set_weights(0, theirs)
    FileMergeBackend(tmp_path, [0, 1]).publish(1, 2, trainer.weights(0), step=20)
    first.merge(2)
    assert same(load_state(tmp_path / "merge" / "merged.pt")["model"], first.trainer.weights(0))


def nan(trainer) -> None:
    with torch.no_grad():  # straight into the pack: checked_model_state refuses a NaN
        trainer.agent.model.state_dict()["encoder.layers.0.weight"][:, 0, 0] = float("nan")


def test_a_non_finite_process_ahead_of_the_pool_takes_its_newest_weights(tmp_path):
    """Worker 1 (NaN) sits out round 5 while worker 0's process has merged only round 4:
    after the merge timeout it takes round 4's merged weights rather than stay NaN."""
    make_run(tmp_path, CFG, RunSettings(workers=2))
    rounds, trainer, _ = rounds_of(tmp_path, [1], (0, 1))
    rounds.backend.timeout_s = 0.5
    pool = shifted(trainer.weights(0), 1.0)
    FileMergeBackend(tmp_path, [0, 1]).publish(0, 4, pool, step=40)
    FileMergeBackend(tmp_path, [0, 1]).publish_merged(4, pool, [0], 40)
    nan(trainer)
    rounds.merge(5)
    assert same(trainer.weights(0), pool)
    (skipped,) = records(tmp_path, 1, MergeSkipped)
    assert skipped.reason.endswith(
        "took the pool's merged weights of round 4 (none of round 5 came)"
    )
    assert records(tmp_path, 1, Merge) == []


def test_processes_that_are_all_non_finite_do_not_wait_out_the_timeout(tmp_path):
    """Both processes NaN in round 2: each sees the other's file of the round with nothing
    finite, stops waiting for a merge nobody will publish (a timeout of 600 s), and both take
    the pool's round-1 weights."""
    make_run(tmp_path, CFG, RunSettings(workers=2))
    pairs = [rounds_of(tmp_path, [w], (0, 1))[:2] for w in (0, 1)]
    good = shifted(pairs[0][1].weights(0), 0.5)
    FileMergeBackend(tmp_path, [0, 1]).publish_merged(1, good, [0, 1], 10)
    for rounds, trainer in pairs:
        rounds.backend.timeout_s = 600
        nan(trainer)
    both = [threading.Thread(target=rounds.merge, args=(2,), daemon=True) for rounds, _ in pairs]
    for thread in both:
        thread.start()
    for thread in both:
        thread.join(120)  # the timeout would be 600 s
    assert not any(thread.is_alive() for thread in both)
    for w, (_, trainer) in enumerate(pairs):
        assert same(trainer.weights(0), good)
        assert "of round 1 (none of round 2 came)" in records(tmp_path, w, MergeSkipped)[-1].reason


def test_a_non_finite_process_of_a_promoted_lane_holds_nobody_up(tmp_path, monkeypatch):
    """Lane 0's worker 1 is NaN at the promotion: its process files the last round as such,
    so worker 0's process writes the promotion without waiting (a wait would see its stop and
    write nothing), and worker 1 takes the promoted weights with a new Adam (its moments are
    likely NaN too), out of the mean until it updates."""
    layout = ((0, 1), (2,))
    make_run(tmp_path, CFG, RunSettings(workers=3), layout, (Lane(), Lane()))
    store = KnobStore(tmp_path)
    writer, first, _ = rounds_of(tmp_path, [0], (0, 1, 2), stopping=lambda: True)
    broken, second, _ = rounds_of(tmp_path, [1], (0, 1, 2))
    for rounds in (writer, broken):
        rounds.follow(store.read_record())
    nan(second)
    reset, reset_adam = [], second.agent._reset_adam
    monkeypatch.setattr(second.agent, "_reset_adam", lambda ws: reset.append(ws) or reset_adam(ws))
    version = store.promote(CFG, 0)
    waiting = threading.Thread(target=broken.follow, args=(store.read_record(),))
    waiting.start()
    lane = tmp_path / "merge" / "lane-0" / "worker-1.pt"
    filed = lambda: lane.exists() and load_state(lane)["round"] == PROMOTION_ROUND  # noqa: E731
    assert wait_until(filed, 60, 0.05)
    assert writer.follow(store.read_record())
    waiting.join(60)
    promoted = load_state(promoted_path(tmp_path, version))["model"]
    assert same(promoted, first.weights(0)) and same(second.weights(0), promoted)
    assert reset == [[0]] and broken.joining() is not None


def test_the_promotion_file_is_written_once_the_first_writer_wins(tmp_path):
    """Two processes of a promoted lane that each timed out on the other both write: the
    first to claim the file writes it (a claim created exclusively; a write of its own tried
    again after a full disk stays its own), the other learns so and writes nothing."""
    path = tmp_path / "promoted-3.pt"
    save_state(path, {"model": {"w": torch.ones(2)}}, exclusive=True)
    save_state(path, {"model": {"w": torch.full((2,), 2.0)}}, exclusive=True)  # its own again
    (tmp_path / ".other.pt.claim").write_bytes(b"1")  # another process's claim of another file
    other = tmp_path / "other.pt"
    with pytest.raises(FileExistsError):
        save_state(other, {"model": {"w": torch.zeros(2)}}, exclusive=True)
    assert torch.equal(load_state(path)["model"]["w"], torch.full((2,), 2.0))
    assert not other.exists() and not list(tmp_path.glob("*.tmp"))


def test_the_losing_writer_of_a_promotion_publishes_nothing(tmp_path):
    """Worker 0, the promoted lane's lowest participant, finds another process's claim on the
    promotion file (it wrote first, each having timed out on the other): it writes neither the
    promotion file nor the lane's merged.pt, and takes the lane's weights when none come."""
    layout = ((0, 1), (2,))
    make_run(tmp_path, CFG, RunSettings(workers=3), layout, (Lane(), Lane()))
    store = KnobStore(tmp_path)
    rounds, trainer, _ = rounds_of(tmp_path, [0], (0, 1, 2))
    rounds.follow(store.read_record())
    rounds.backend.timeout_s = 0.3
    lane = FileMergeBackend(tmp_path, [0, 1], lane=0, pool=0)
    last = shifted(trainer.weights(0), 1.0)
    lane.publish_merged(4, last, [0, 1], 40)
    version = store.promote(CFG, 0)
    claim = promoted_path(tmp_path, version)
    claim.with_name(f".{claim.name}.claim").write_bytes(b"1")
    spec = dataclasses.replace(rounds.specs[0], merge_timeout_s=0.3)
    rounds.specs = [spec]
    assert rounds.follow(store.read_record())
    assert not claim.exists()
    assert load_state(tmp_path / "merge" / "lane-0" / "merged.pt")["round"] == 4
    assert same(trainer.weights(0), last)


def test_a_pack_taking_a_races_weights_resets_only_its_non_finite_worker(tmp_path, monkeypatch):
    """A pack of workers 0 and 1 starting a race, worker 1 NaN: both take the merged weights
    of the pool they leave, only worker 1 gets a new Adam, and the pack stays in the mean."""
    make_run(tmp_path, CFG, RunSettings(workers=2))
    store = KnobStore(tmp_path)
    rounds, trainer, _ = rounds_of(tmp_path, [0, 1], (0, 1))
    merged = shifted(trainer.weights(0), 3.0)
    FileMergeBackend(tmp_path, [0, 1]).publish_merged(5, merged, [0, 1], 50)
    with torch.no_grad():
        trainer.agent.model.state_dict()["encoder.layers.0.weight"][1, 0, 0] = float("nan")
    reset, reset_adam = [], trainer.agent._reset_adam
    monkeypatch.setattr(trainer.agent, "_reset_adam", lambda ws: reset.append(ws) or reset_adam(ws))
    store.start_race(CFG, ((0, 1),), (Lane(),))
    assert rounds.follow(store.read_record())
    assert same(trainer.weights(0), merged) and same(trainer.weights(1), merged)
    assert reset == [[1]] and rounds.joining() is None
