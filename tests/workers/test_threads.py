"""The thread policy: torch threads per training process from the cores and the workers."""

import os

import pytest
import torch

from agent.errors import UserError
from workers.host.threads import (
    MAX_USEFUL,
    THREAD_ENV,
    apply_threads,
    available_cores,
    check_threads,
    choose_threads,
    policy_threads,
)


@pytest.mark.parametrize(
    "workers, cores, threads",
    [
        (1, 1, 1),
        (1, 2, 1),  # torch's default would take both cores: one is left for the rest
        (2, 2, 1),
        (3, 2, 1),  # more workers than cores: never 0
        (1, 4, 3),
        (2, 8, 3),
        (4, 16, 3),
        (1, 16, MAX_USEFUL),  # a small model gains little from more
        (1, 64, MAX_USEFUL),
    ],
)
def test_policy_shares_the_cores_and_leaves_one(workers, cores, threads):
    assert policy_threads(workers, cores) == threads


def test_choice_says_what_was_chosen_and_from_what():
    assert (
        choose_threads(2, cores=2).describe() == "torch threads: 1 per worker (2 cores, 2 workers)"
    )
    assert choose_threads(1, cores=8).describe() == "torch threads: 4 (8 cores, 1 training process)"
    asked = choose_threads(1, 2, cores=2)
    assert asked.threads == 2 and asked.requested
    assert asked.describe() == "torch threads: 2 (--threads; 2 cores, 1 training process)"


@pytest.mark.parametrize("bad", [0, -1, 3, 99])
def test_threads_outside_the_cores_are_refused(bad):
    with pytest.raises(UserError, match=rf"between 1 and 2 .* got {bad}"):
        check_threads(bad, cores=2)


@pytest.mark.parametrize("cores", [1, 2, 8])
def test_threads_from_one_to_all_the_cores_are_accepted_and_no_more(cores):
    # The bounds exactly: 1 and every core pass, one past either end is refused naming `cores`.
    for good in (None, 1, cores):
        check_threads(good, cores=cores)
    for bad in (0, cores + 1):
        with pytest.raises(UserError, match=rf"between 1 and {cores} .* got {bad}$"):
            check_threads(bad, cores=cores)


def test_threads_are_checked_against_this_process_s_cores_by_default(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(5)))  # under taskset
    check_threads(5)
    with pytest.raises(UserError, match=r"between 1 and 5 .* got 6$"):
        check_threads(6)


def test_available_cores_follow_the_affinity():
    assert available_cores() == len(os.sched_getaffinity(0))


def test_apply_sets_torch_and_the_environment_for_children(monkeypatch):
    before = torch.get_num_threads()
    for name in THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    try:
        apply_threads(1)
        assert torch.get_num_threads() == 1
        assert all(os.environ[name] == "1" for name in THREAD_ENV)
    finally:
        torch.set_num_threads(before)


def test_workers_get_the_policy_unless_the_run_says(tmp_path, tiny_cfg):
    from workers.run.owner import Run, RunSettings

    run = Run.create(tmp_path / "a", tiny_cfg, RunSettings(workers=2))
    assert run.workers._spec(0, resume=False).threads == policy_threads(2, available_cores())
    fixed = Run.create(tmp_path / "b", tiny_cfg, RunSettings(workers=2, threads_per_worker=2))
    assert fixed.workers._spec(1, resume=False).threads == 2
