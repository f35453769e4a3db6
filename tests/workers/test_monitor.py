"""The owning run's monitor (workers/run/monitor.py WorkerMonitor) without processes: each
worker's process is a FakeProcess the test ends by hand, the run's side (respawn, split,
join_step, members_changed, note) records what the monitor asked of it, the run directory is
real (as a new run leaves it) and the restarts fall due on a FakeClock. The tests drive
check() itself, one look at a time: a crash recorded in the worker's file and taken out of the
merges, restarts with a doubling back-off up to the allowance and then left out for good, a
worker that ended on purpose or was removed left alone, a fresh allowance after a restart by
hand, a pack restarted or split as a whole, a restarted worker followed until it merges again,
the run directory vanishing, the workers' own records passed on; and once the thread itself,
which sees an exit without being asked."""

import threading
import time

import pytest
from conftest import tiny_config, wait_until
from helpers.clock import FakeClock
from helpers.process_fakes import FakeProcess, link, make_run, records, worker_spec

from workers.run.monitor import WorkerMonitor
from workers.run.spawn import WorkerProcess
from workers.rundir.directory import RunDir
from workers.rundir.paths import metrics_name
from workers.rundir.records import Crashed, Error, KnobsRefused, Resumed
from workers.rundir.settings import RunSettings
from workers.training.spec import DOES_NOT_FIT, SPLIT_PACK

CFG = tiny_config(mlp_dim=32, enc_dim=16, latent_dim=16, num_samples=16, num_elites=4)
BACKOFF_S = 2.0


@pytest.fixture(autouse=True)
def close_sentinels():
    yield
    FakeProcess.close_all()


class Owner:
    """The owning run as the monitor sees it: the handles of its workers (one FakeProcess per
    pack), its settings, lock and stop event, and a record of every call back into it."""

    def __init__(self, path, settings, join_at=40, made=False):
        """`made`: the run directory is there already (else made as a new run leaves it)."""
        self.path, self.settings, self.join_at = path, settings, join_at
        if not made:
            make_run(path, CFG, settings)
        self.procs: dict[int, WorkerProcess] = {}
        self.lock, self.stop = threading.RLock(), threading.Event()
        self.notes: list[tuple[str, bool]] = []
        self.respawned: list[tuple[list[int], int]] = []
        self.split_off: list[list[int]] = []
        self.members_down: list[dict[int, str]] = []  # down() when members.json was rewritten
        self.clock = FakeClock()
        self.pids = iter(range(1000, 2000))
        self.monitor = WorkerMonitor(
            path,
            settings=lambda: self.settings,
            procs=self.procs,
            lock=self.lock,
            stop=self.stop,
            note=lambda text, in_record=False: self.notes.append((text, in_record)),
            respawn=self.respawn,
            split=self.split,
            join_step=lambda k: self.join_at,
            members_changed=lambda: self.members_down.append(self.monitor.down()),
            restart_backoff_s=BACKOFF_S,
            clock=self.clock,
        )
        self.monitor.mark_start()  # as Run.start: before the workers spawn
        for pack in settings.packs:
            self.spawn(pack, "training")

    def spawn(self, pack, state, join_step=0):
        """One process for `pack`, its workers in `state` (as WorkerProcesses._spawn)."""
        process = FakeProcess(next(self.pids))
        for index in pack:
            spec = worker_spec(self.path, CFG, index, self.settings.merging, join_step=join_step)
            self.procs[index] = WorkerProcess(link(spec, state), process, started=time.time())

    def respawn(self, pack, join_step):
        self.respawned.append((list(pack), join_step))
        self.spawn(pack, "starting", join_step)

    def split(self, handles):
        self.split_off.append([h.spec.index for h in handles])
        for h in handles:
            self.spawn([h.spec.index], "starting", h.spec.join_step)

    def restart_by_hand(self, index):
        """What WorkerProcesses.restart does: a fresh allowance, then the pack spawned."""
        pack = self.settings.pack_of(index)
        self.monitor.restarted_by_hand(pack)
        self.spawn(pack, "starting", self.join_at)

    def crash(self, index, exitcode=1, step=30):
        p = self.procs[index]
        p.link.set(step=step)
        p.process.end(exitcode)

    def runs(self, index, step):
        """Worker `index` is past its start: training at `step`."""
        self.procs[index].link.set_state("training")
        self.procs[index].link.set(step=step)

    def later(self, seconds):
        self.clock.sleep(seconds)
        self.monitor.check()

    def said(self, words):
        return [text for text, _ in self.notes if words in text]


def crashes(path, worker):
    return records(path, worker, Crashed)


def test_a_crashed_worker_is_recorded_left_out_of_the_merges_and_restarted_when_due(tmp_path):
    run = Owner(tmp_path, RunSettings(workers=2, max_restarts=3))
    run.monitor.check()
    assert crashes(tmp_path, 0) == crashes(tmp_path, 1) == [] and run.notes == []
    assert not run.monitor.restarting

    run.crash(1, exitcode=1, step=30)
    run.monitor.check()
    [crash] = crashes(tmp_path, 1)
    assert (crash.step, crash.exitcode, crash.signal, crash.last_error) == (30, 1, None, None)
    assert (crash.restarts, crash.final) == (0, False)
    assert crash.message.startswith("worker 1 died (exit code 1)")
    assert "restarting it from the merged weights in 2 s (restart 1 of 3)" in crash.message
    assert run.notes == [(crash.message, True)]  # told as well as recorded
    assert crashes(tmp_path, 0) == []
    # Out of the merges at once: down() holds it when members.json is rewritten.
    assert run.monitor.down() == {1: "crashed (exit code 1), restarting"}
    assert run.members_down == [{1: "crashed (exit code 1), restarting"}]
    assert run.monitor.restarting

    run.later(BACKOFF_S - 0.25)
    assert run.respawned == []
    run.later(0.25)
    assert run.respawned == [([1], 40)]  # its pack, from the merged weights at the others' step
    assert run.procs[1].process.is_alive()
    run.later(100)  # seen once: neither recorded nor restarted again
    assert run.respawned == [([1], 40)] and len(crashes(tmp_path, 1)) == 1


def test_a_restarted_worker_follows_the_others_step_and_merges_again_once_it_runs(tmp_path):
    run = Owner(tmp_path, RunSettings(workers=2))
    run.crash(1)
    run.later(0)
    run.later(BACKOFF_S)
    assert run.respawned == [([1], 40)]
    run.join_at = 55  # the others went on while it starts: it is told their step
    run.monitor.check()
    assert run.procs[1].join.value == 55
    assert run.monitor.down() == {1: "crashed (exit code 1), restarting"}
    assert run.monitor.restarting and run.said("runs again") == []

    run.runs(1, step=57)
    run.monitor.check()
    assert run.monitor.down() == {} and run.members_down[-1] == {}
    assert len(run.members_down) == 2  # left out, then back in
    assert run.said("runs again") == ["worker 1 runs again from step 57: it merges again"]
    assert not run.monitor.restarting
    run.monitor.check()
    assert len(run.said("runs again")) == 1 and len(run.members_down) == 2


def test_restarts_back_off_doubling_until_the_allowance_is_spent_then_it_is_left_out(tmp_path):
    run = Owner(tmp_path, RunSettings(workers=2, max_restarts=2))
    for restart, delay in enumerate([BACKOFF_S, 2 * BACKOFF_S]):
        run.crash(1)
        run.later(0)
        assert f"in {delay:g} s (restart {restart + 1} of 2)" in crashes(tmp_path, 1)[-1].message
        run.later(delay - 0.25)
        assert len(run.respawned) == restart
        run.later(0.25)
        assert len(run.respawned) == restart + 1
        run.runs(1, step=100 * (restart + 1))
        run.monitor.check()
        assert run.monitor.down() == {}

    run.crash(1, exitcode=-9)  # killed: the third crash is past the allowance of 2
    run.later(0)
    first, second, last = crashes(tmp_path, 1)
    assert [c.restarts for c in (first, second, last)] == [0, 1, 2]
    assert [c.final for c in (first, second, last)] == [False, False, True]
    assert (last.exitcode, last.signal) == (-9, "SIGKILL")
    assert "worker 1 died (killed by SIGKILL)" in last.message
    assert "left out for good after 2 restarts" in last.message
    assert run.monitor.down() == {1: "crashed (killed by SIGKILL): left out for good"}
    assert not run.monitor.restarting
    run.later(1000)
    assert len(run.respawned) == 2


@pytest.mark.parametrize(
    "max_restarts, exitcode, then, down",
    [
        (
            0,
            1,
            "automatic restarts are off (--max-restarts 0): restart it by hand",
            "crashed (exit code 1): left out for good",
        ),
        (3, DOES_NOT_FIT, "not restarted: it would not fit again", "out of GPU memory: left out"),
    ],
)
def test_a_crash_that_is_not_restarted_says_why(tmp_path, max_restarts, exitcode, then, down):
    run = Owner(tmp_path, RunSettings(workers=2, max_restarts=max_restarts))
    run.crash(0, exitcode=exitcode)
    run.later(0)
    [crash] = crashes(tmp_path, 0)
    assert crash.final and crash.restarts == 0 and crash.message.endswith(then)
    assert run.monitor.down() == {0: down}
    assert not run.monitor.restarting
    run.later(1000)
    assert run.respawned == []


def test_the_last_error_a_worker_recorded_since_its_start_is_named(tmp_path):
    run = Owner(tmp_path, RunSettings(workers=2))
    log = RunDir(tmp_path, metrics=metrics_name(0))
    started = run.procs[0].started
    log.log(Error(message="an old failure", time=started - 60))  # before this process: not it
    run.crash(0)
    run.later(0)
    assert crashes(tmp_path, 0)[-1].last_error is None
    run.later(BACKOFF_S)
    run.procs[0].started = time.time() - 1  # the new process; it records its error, then dies
    log.log(Error(message="CUDA error: an illegal memory access\n  at line 3"))
    log.close()
    run.crash(0)
    run.later(0)
    crash = crashes(tmp_path, 0)[-1]
    assert crash.last_error == "CUDA error: an illegal memory access"
    assert "(exit code 1; last error: CUDA error: an illegal memory access)" in crash.message


@pytest.mark.parametrize("state", ["done", "stopped"])
def test_a_worker_that_ended_on_purpose_is_neither_recorded_nor_restarted(tmp_path, state):
    run = Owner(tmp_path, RunSettings(workers=2))
    run.procs[1].link.set_state(state)
    run.crash(1, exitcode=0)
    run.later(0)
    run.later(1000)
    assert crashes(tmp_path, 1) == [] and run.notes == [] and run.respawned == []
    assert run.monitor.down() == {} and run.members_down == []


def test_a_worker_removed_by_hand_is_not_waited_for_nor_restarted(tmp_path):
    run = Owner(tmp_path, RunSettings(workers=3))
    run.crash(2)  # crashed, its restart pending; then the user takes it out
    run.later(0)
    assert run.monitor.down() == {2: "crashed (exit code 1), restarting"}
    run.monitor.removed(2)
    run.settings = RunSettings(workers=3, removed=(2,))
    assert run.monitor.down() == {} and not run.monitor.restarting
    run.later(1000)
    assert run.respawned == []

    run.monitor.removed(1)  # running when removed: it leaves, and its exit is no crash
    run.settings = RunSettings(workers=3, removed=(2, 1))
    run.crash(1, exitcode=1)
    run.later(0)
    run.later(1000)
    assert crashes(tmp_path, 1) == [] and run.respawned == []
    assert run.monitor.down() == {} and not run.monitor.restarting


def test_a_restart_by_hand_gives_a_fresh_allowance(tmp_path):
    run = Owner(tmp_path, RunSettings(workers=2, max_restarts=1))
    run.crash(1)
    run.later(0)
    run.later(BACKOFF_S)
    run.crash(1)
    run.later(0)
    assert crashes(tmp_path, 1)[-1].final  # its one automatic restart spent

    run.restart_by_hand(1)
    assert run.monitor.restarting  # down until it runs
    run.runs(1, step=80)
    run.monitor.check()
    assert run.monitor.down() == {}
    assert run.said("runs again") == ["worker 1 runs again from step 80: it merges again"]
    run.crash(1)
    run.later(0)
    crash = crashes(tmp_path, 1)[-1]
    assert (crash.restarts, crash.final) == (0, False)
    assert "in 2 s (restart 1 of 1)" in crash.message
    run.later(BACKOFF_S)
    assert run.respawned == [([1], 40), ([1], 40)]


def test_a_restart_by_hand_replaces_the_automatic_one_pending(tmp_path):
    run = Owner(tmp_path, RunSettings(workers=2))
    run.crash(0)
    run.later(0)
    run.restart_by_hand(0)
    run.later(1000)
    assert run.respawned == []  # the pack runs already: the monitor spawns nothing more
    run.runs(0, step=10)
    run.monitor.check()
    assert run.monitor.down() == {} and not run.monitor.restarting
    run.crash(0)  # the automatic restart that was pending did not count against it
    run.later(0)
    assert crashes(tmp_path, 0)[-1].restarts == 0


def test_a_pack_is_recorded_per_worker_and_restarted_as_a_whole(tmp_path):
    run = Owner(tmp_path, RunSettings(workers=3, pack=2))  # packs [0, 1] and [2]
    assert run.procs[0].process is run.procs[1].process
    run.crash(0)  # the pack's one process
    run.later(0)
    assert len(crashes(tmp_path, 0)) == len(crashes(tmp_path, 1)) == 1
    assert crashes(tmp_path, 2) == []
    assert set(run.monitor.down()) == {0, 1}
    run.later(BACKOFF_S)
    assert run.respawned == [([0, 1], 40)]  # once, for both
    run.runs(0, step=50)
    run.runs(1, step=50)
    run.monitor.check()
    assert run.monitor.down() == {}


def test_a_pack_its_self_check_found_unsound_is_split_not_counted_a_crash(tmp_path):
    run = Owner(tmp_path, RunSettings(workers=4, pack=3))  # packs [0, 1, 2] and [3]
    run.crash(0, exitcode=SPLIT_PACK)
    run.later(0)
    assert run.split_off == [[0, 1, 2]]  # once, when every member's end is seen
    assert run.said("go on in a process each") == [
        "workers 0, 1, 2 go on in a process each: the self-check found their pack unsound"
    ]
    assert all(crashes(tmp_path, k) == [] for k in range(4))
    assert run.monitor.down() == {} and run.members_down == []
    run.later(1000)
    assert run.respawned == [] and run.split_off == [[0, 1, 2]]
    assert len({id(run.procs[k].process) for k in range(3)}) == 3


def test_a_stopping_run_neither_records_nor_restarts_nor_splits(tmp_path):
    run = Owner(tmp_path, RunSettings(workers=3, pack=2))  # packs [0, 1] and [2]
    run.crash(2)
    run.later(0)
    run.stop.set()  # the run stops: what ends now ends on purpose
    run.crash(0, exitcode=SPLIT_PACK)
    run.later(1000)
    assert run.respawned == [] and run.split_off == []
    assert crashes(tmp_path, 0) == crashes(tmp_path, 1) == []
    assert len(crashes(tmp_path, 2)) == 1  # before the stop


def test_a_control_worker_that_crashes_is_restarted_but_never_waited_for(tmp_path):
    run = Owner(tmp_path, RunSettings(workers=2, control_worker=True))  # 1 never merges
    run.crash(1)
    run.later(0)
    assert len(crashes(tmp_path, 1)) == 1
    assert run.monitor.down() == {} and run.members_down == []
    run.later(BACKOFF_S)
    assert run.respawned == [([1], 40)]


def test_a_vanished_run_directory_stops_the_run_and_nothing_more_is_written(tmp_path):
    path = tmp_path / "run"
    run = Owner(path, RunSettings(workers=2))
    assert run.monitor.check_run_dir() is None and not run.stop.is_set()
    run.crash(0)
    run.later(0)
    run.later(BACKOFF_S)  # worker 0 restarted: it runs again by the next look
    run.runs(0, step=70)
    told, rewritten = len(run.notes), len(run.members_down)
    path.rename(tmp_path / "moved")
    run.crash(1)  # a worker's end seen in the same look
    run.monitor.check()
    gone = run.monitor.gone
    assert gone is not None and str(path) in gone and "--resume NEW_PATH" in gone
    assert run.stop.is_set()
    assert run.notes[told:] == [(f"error: {gone}", False)]  # nor "runs again", nor a crash
    assert len(run.members_down) == rewritten  # members.json is not rewritten
    assert run.monitor.check_run_dir() == gone and len(run.notes) == told + 1  # said once
    assert not path.exists() and crashes(tmp_path / "moved", 1) == []
    run.later(1000)
    assert run.respawned == [([0], 40)] and len(run.notes) == told + 1


def test_a_run_directory_replaced_by_another_of_its_name_counts_as_vanished(tmp_path):
    path = tmp_path / "run"
    run = Owner(path, RunSettings(workers=1))
    path.rename(tmp_path / "moved")
    path.mkdir()
    assert run.monitor.check_run_dir() is not None and run.stop.is_set()


def test_what_the_workers_recorded_since_the_start_is_told_once(tmp_path):
    make_run(tmp_path, CFG, RunSettings(workers=2))
    old = RunDir(tmp_path, metrics=metrics_name(0))
    old.log(Resumed(step=10, checkpoint="ckpt-old.pt"))  # an earlier owner's: not told again
    old.close()
    run = Owner(tmp_path, RunSettings(workers=2), made=True)
    refused = dict(version=3, knob="horizon", value=99, reason="out of range", message="refused")
    for k in (0, 1):
        log = RunDir(tmp_path, metrics=metrics_name(k))
        log.log(Resumed(step=120 + k, checkpoint=f"ckpt-{k}.pt"))
        log.log(KnobsRefused(**refused))  # every worker refuses the one record
        log.close()
    run.monitor.check()
    run.monitor.check()
    assert run.said("resumed from") == [
        "worker 0 resumed from step 120 (ckpt-0.pt)",
        "worker 1 resumed from step 121 (ckpt-1.pt)",
    ]
    assert run.notes.count(("refused", True)) == 1


def test_the_monitor_thread_sees_an_exit_without_being_asked_and_ends_with_the_run(tmp_path):
    run = Owner(tmp_path, RunSettings(workers=2))
    run.monitor.start()
    try:
        run.crash(1)
        assert wait_until(
            lambda: run.monitor.down() == {1: "crashed (exit code 1), restarting"}, 10
        )
        assert len(crashes(tmp_path, 1)) == 1
    finally:
        run.stop.set()
        run.monitor.join(10)
    assert not run.monitor.thread.is_alive()
