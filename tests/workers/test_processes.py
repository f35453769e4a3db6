"""The owning run's worker processes (workers/run/processes.py WorkerProcesses) without
processes: `start_process` makes a FakeProcess per pack, the run's side (its settings, how it
saves them, the monitor's bookkeeping) is a small stand-in that records what it was asked, and
the run directory and the knob record are real (as a new run leaves them). Covered: what each
worker is started with, adding, removing and restarting a worker and the refusals before any of
them changes anything, a pack split apart, where a joining worker starts counting, the progress
rows, and the ends (join kills the stragglers, wait waits for a restart)."""

import threading
import time
from types import SimpleNamespace

import pytest
from conftest import tiny_config
from helpers.process_fakes import FakeProcess, link, make_run

import workers.run.processes
from agent.errors import UserError
from workers.race.control import RaceControl
from workers.run.processes import RunSide, WorkerProcesses
from workers.run.spawn import WorkerProcess
from workers.rundir.directory import save_state
from workers.rundir.knob_record import KnobStore, run_knobs
from workers.rundir.lanes import Lane, deal_lanes
from workers.rundir.paths import merged_path, pool_dir, weights_name
from workers.rundir.settings import RunSettings, read_record, write_settings

CFG = tiny_config(mlp_dim=32, enc_dim=16, latent_dim=16, num_samples=16, num_elites=4)


@pytest.fixture(autouse=True)
def close_sentinels():
    yield
    FakeProcess.close_all()


class Side:
    """The owning run as its processes see it, recording every call back into it."""

    def __init__(self, path, settings, layout=(), lanes=(), resumed=False):
        make_run(path, CFG, settings, layout, lanes)
        self.path, self.settings = path, settings
        self.saved: list[RunSettings] = []
        self.lanes_when_saved: list = []  # the race as the run reads it right after each save
        self.started: list[list[dict]] = []  # each process: its workers' specs
        self.workers_on_disk: list[int] = []  # run.json's workers when each process started
        self.by_hand: list[list[int]] = []
        self.removed: list[int] = []
        self.restarting = False
        self.pids = iter(range(1000, 2000))
        self.lock = threading.RLock()
        store = KnobStore(path)
        self.race = RaceControl(store, CFG, lambda: self.settings, self.in_force)
        self.workers = WorkerProcesses(
            RunSide(
                path,
                CFG,
                resumed,
                lock=self.lock,
                settings=lambda: self.settings,
                save_settings=self.save,
                merge_every=lambda: 40,
                race=self.race,
                start_process=self.start_process,
                restarting=lambda: self.restarting,
                restarted_by_hand=self.by_hand.append,
                removed=self.removed.append,
            )
        )

    def in_force(self):
        return 0, run_knobs(CFG, self.settings.merge_every)

    def save(self, settings):
        """As Run._save_settings: run.json, then the run's own settings."""
        write_settings(self.path, settings)
        self.settings = settings
        self.saved.append(settings)
        self.lanes_when_saved.append(self.race.record().lanes)

    def start_process(self, specs):
        process = FakeProcess(next(self.pids))
        self.started.append(specs)
        self.workers_on_disk.append(read_record(self.path)[1].workers)
        return [
            WorkerProcess(link(spec, "starting"), process, started=time.time()) for spec in specs
        ]

    def process(self, index):
        return self.workers.procs[index].process

    def runs(self, index, step, state="training"):
        self.workers.procs[index].link.set_state(state)
        self.workers.procs[index].link.set(step=step)

    def merged(self, step, lane=None, worker=None):
        """A merge of the pool (of `lane`) at `step`, or `worker`'s own published weights."""
        path = merged_path(self.path, lane)
        if worker is not None:
            path = pool_dir(self.path, lane) / weights_name(worker)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_state(path, {"step": step, "pool": 0})


def test_start_spawns_each_pack_in_one_process_with_its_own_seed_and_the_knobs_in_force(tmp_path):
    run = Side(tmp_path, RunSettings(workers=3, pack=2), resumed=True)
    run.workers.start(nice=5)
    assert [[s.index for s in specs] for specs in run.started] == [[0, 1], [2]]
    specs = [s for specs in run.started for s in specs]
    assert [s.cfg["seed"] for s in specs] == [CFG.seed, CFG.seed + 1000, CFG.seed + 2000]
    assert {(s.merge_every, s.nice, s.resume, s.start_from_merged) for s in specs} == {
        (40, 5, True, False)
    }
    assert run.workers.started and sorted(run.workers.pids()) == [1000, 1000, 1001]
    assert run.saved == []  # starting changes nothing of the run's record


def test_a_worker_is_added_from_the_merged_weights_at_the_step_of_the_slowest_merging_worker(
    tmp_path,
):
    run = Side(tmp_path, RunSettings(workers=2))
    with pytest.raises(UserError, match="start the run"):
        run.workers.add()
    run.workers.start(nice=0)
    with pytest.raises(UserError, match="no[ne]* yet"):
        run.workers.add()
    assert run.saved == [] and len(run.started) == 2  # refused: nothing written or started
    run.merged(step=80)
    run.runs(0, 130)
    run.runs(1, 110)
    assert run.workers.add() == 2
    assert run.settings.workers == 3 and run.settings.added == 1
    assert run.workers_on_disk[-1] == 3  # run.json tells of it before it starts
    (spec,) = run.started[-1]
    assert (spec.index, spec.start_from_merged, spec.resume, spec.join_step) == (
        2,
        True,
        False,
        110,
    )


def test_a_worker_added_to_a_race_is_in_run_json_before_its_lane_and_the_run_never_doubts_it(
    tmp_path,
):
    settings = RunSettings(workers=3)
    lanes = (Lane(), Lane(size=1))
    layout = deal_lanes(settings.merging, lanes)
    run = Side(tmp_path, RunSettings(workers=3, lanes=layout), layout, lanes)
    run.workers.start(nice=0)
    run.merged(step=20, lane=1)
    assert run.workers.add(lane=1) == 3
    # Between run.json and the lane, the run still reads the race as it was (not as damage).
    assert run.lanes_when_saved == [layout]
    assert run.race.record().lanes == (layout[0], (*layout[1], 3))
    assert run.workers_on_disk[-1] == 4


def test_a_worker_still_starting_is_not_whom_a_new_one_joins_and_without_any_the_merge_is(
    tmp_path,
):
    run = Side(tmp_path, RunSettings(workers=2))
    run.workers.start(nice=0)
    run.merged(step=80)
    run.runs(0, 10, state="starting")
    run.runs(1, 5, state="starting")
    assert run.workers.join_step(2) == 80
    run.runs(1, 120)
    assert run.workers.join_step(2) == 120


def test_in_a_lane_that_never_merges_a_worker_counts_from_its_own_published_weights(tmp_path):
    settings = RunSettings(workers=4)
    lanes = (Lane(), Lane(size=1, merges=False))
    layout = deal_lanes(settings.merging, lanes)
    run = Side(tmp_path, RunSettings(workers=4, lanes=layout), layout, lanes)
    run.workers.start(nice=0)
    solo = layout[1][0]
    run.merged(step=300, lane=1, worker=solo)
    run.merged(step=200, lane=0)
    for k in layout[0]:
        run.runs(k, 250)
    assert run.workers.join_step(solo) == 300
    assert run.workers.join_step(layout[0][0]) == 250


def test_a_removed_worker_is_told_to_leave_after_the_run_and_the_monitor_know(tmp_path):
    run = Side(tmp_path, RunSettings(workers=3))
    run.workers.start(nice=0)
    run.workers.remove(1)
    assert run.removed == [1] and run.settings.removed == (1,)
    assert read_record(tmp_path)[1].removed == (1,)
    assert run.workers.procs[1].leave.is_set() and not run.workers.procs[0].leave.is_set()
    run.process(1).end(0)
    states = {w["worker"]: w["state"] for w in run.workers.progress()}
    assert states == {0: "starting", 1: "removed", 2: "starting"}


@pytest.mark.parametrize(
    ("settings", "index", "why"),
    [
        (RunSettings(workers=2), 5, "not in the run"),
        (RunSettings(workers=2, removed=(1,)), 0, "at least one worker"),
        (RunSettings(workers=3, pack=2), 0, "a pack"),
    ],
)
def test_a_worker_that_cannot_leave_is_refused_with_nothing_changed(tmp_path, settings, index, why):
    run = Side(tmp_path, settings)
    run.workers.start(nice=0)
    with pytest.raises(UserError, match=why):
        run.workers.remove(index)
    assert run.saved == [] and run.removed == []
    assert not any(p.leave.is_set() for p in run.workers.procs.values())


def test_a_lanes_last_worker_cannot_leave(tmp_path):
    settings = RunSettings(workers=3)
    lanes = (Lane(), Lane(size=1))
    layout = deal_lanes(settings.merging, lanes)
    run = Side(tmp_path, RunSettings(workers=3, lanes=layout), layout, lanes)
    run.workers.start(nice=0)
    with pytest.raises(UserError, match="last worker"):
        run.workers.remove(layout[1][0])
    assert run.saved == [] and run.removed == []


def test_a_dead_pack_is_restarted_by_hand_as_a_whole_from_the_merged_weights(tmp_path):
    run = Side(tmp_path, RunSettings(workers=4, pack=2))
    run.workers.start(nice=0)
    with pytest.raises(UserError, match="still running"):
        run.workers.restart(1)
    run.merged(step=60)
    run.runs(2, 90)
    run.runs(3, 95)
    run.process(0).end(1)
    assert [w["state"] for w in run.workers.progress()][:2] == ["crashed", "crashed"]
    assert run.workers.dead() == [0, 1] and run.workers.dead() == []  # told once
    run.workers.restart(1)
    assert run.by_hand == [[0, 1]]
    specs = run.started[-1]
    assert [(s.index, s.resume, s.start_from_merged, s.join_step) for s in specs] == [
        (0, True, True, 90),
        (1, True, True, 90),
    ]
    run.process(0).end(1)  # the new process dies too: told again
    assert run.workers.dead() == [0, 1]


def test_a_removed_worker_is_not_restarted(tmp_path):
    run = Side(tmp_path, RunSettings(workers=3))
    run.workers.start(nice=0)
    run.workers.remove(2)
    run.process(2).end(0)
    with pytest.raises(UserError, match="was removed"):
        run.workers.restart(2)
    assert run.by_hand == [] and len(run.started) == 3


def test_a_split_pack_starts_each_worker_alone_as_it_was_and_the_run_keeps_them_apart(tmp_path):
    run = Side(tmp_path, RunSettings(workers=2, pack=2))
    run.workers.start(nice=0)
    handles = [run.workers.procs[0], run.workers.procs[1]]
    handles[1].join.value = 70  # the pack had agreed to join its pool at step 70
    run.workers.split(handles)
    assert run.settings.apart == (0, 1) and read_record(tmp_path)[1].apart == (0, 1)
    assert [[s.index for s in specs] for specs in run.started[1:]] == [[0], [1]]
    assert [specs[0].join_step for specs in run.started[1:]] == [0, 70]
    assert run.workers.procs[0].process is not run.workers.procs[1].process


def test_join_kills_what_has_not_ended_and_wait_waits_for_a_restart(tmp_path, monkeypatch):
    run = Side(tmp_path, RunSettings(workers=2))
    run.workers.start(nice=0)
    run.runs(0, 50, state="stopped")
    run.process(0).end(0)
    killed = []
    straggler = run.process(1)
    straggler.kill = lambda: (killed.append(straggler.pid), straggler.end(-9))
    run.workers.join(timeout=0.0)
    assert killed == [1001]
    assert [w["state"] for w in run.workers.progress()] == ["stopped", "crashed"]
    # Nothing runs, but the monitor is about to restart a worker: wait polls until it did.
    run.restarting = True
    polls = []

    def sleep(seconds):
        polls.append(seconds)
        run.restarting = len(polls) < 3

    monkeypatch.setattr(workers.run.processes, "time", SimpleNamespace(sleep=sleep))
    run.workers.wait(poll_s=0.25)
    assert polls == [0.25, 0.25, 0.25]
