"""The torch.distributed merge: gloo on loopback, one process per rank."""

import os
import pickle
import subprocess
import sys
import textwrap

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import ROOT, free_port

from workers.merging.collective import NOT_FINITE, DistributedMergeBackend, init_group
from workers.merging.files import average_states

RANKS = 3


def state_of(rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s weights: different per rank, with an integer tensor that is not merged."""
    generator = torch.Generator().manual_seed(rank)
    return {
        "layer.weight": torch.randn(4, 3, generator=generator),
        "layer.bias": torch.randn(3, generator=generator).double(),
        "count": torch.tensor([rank]),
    }


def rank_main(rank: int, port: int, broken: int, pack: bool, results, wants=False) -> None:
    """One rank: with `pack`, rank 0 holds workers 0 and 1 as a pack (their mean, two
    members), the others one worker each; rank `broken`'s weights are not finite (with
    `wants` it asks for a participant's own weights, as its workers keep their policies)."""
    import os

    # What torchrun sets for each rank.
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(RANKS), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    init_group("cpu", timeout_s=30)
    try:
        workers = RANKS + pack
        backend = DistributedMergeBackend(list(range(workers)), workers, "cpu")
        if rank == 0 and pack:
            state, members = average_states([state_of(0), state_of(10)]), (0, 1)
        else:
            state, members = state_of(rank), (rank + pack,)
        if rank == broken:
            state = {**state, "layer.weight": state["layer.weight"] * float("inf")}
        own = {0: state_of(0), 1: state_of(10)} if rank == 0 and pack else {}
        result = backend.merge(
            7,
            state,
            members,
            step=100 * rank,
            own=lambda index: own.get(index, state_of(rank)),
            wants=wants and rank == broken,
        )
        # By value: a queued tensor is otherwise shared through this process, which may be
        # gone when the test reads it.
        results.put((rank, pickle.dumps(result)))
    finally:
        dist.destroy_process_group()


def run_ranks(broken: int, pack: bool = True, wants: bool = False) -> dict:
    ctx = mp.get_context("spawn")
    results, port = ctx.Queue(), free_port()
    procs = [
        ctx.Process(target=rank_main, args=(r, port, broken, pack, results, wants))
        for r in range(RANKS)
    ]
    for p in procs:
        p.start()
    found = {
        rank: pickle.loads(result) for rank, result in (results.get(timeout=60) for _ in procs)
    }
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return found


def test_three_ranks_of_one_worker_merge_to_the_mean_of_the_three():
    """Three ranks in spawned processes, one gloo group on loopback: each gets the mean of the
    three. Only real processes in a process group run the collective (the file merge's averaging
    has in-process tests)."""
    found = run_ranks(broken=-1, pack=False)
    expected = average_states([state_of(0), state_of(1), state_of(2)])
    for result in found.values():
        assert result.participants == [0, 1, 2] and set(result.distances) == {0, 1, 2}
        for key in ("layer.weight", "layer.bias"):
            torch.testing.assert_close(result.merged[key], expected[key])


def test_a_pack_on_one_rank_weighs_as_many_workers_as_it_holds():
    """A pack of 2 on rank 0 weighs as 2 workers in the all-reduce, integer tensors stay
    unaveraged, the lone workers' distances are known everywhere: only real ranks carry the
    members' counts across the group."""
    found = run_ranks(broken=-1)
    # Workers 0 and 1 in rank 0's pack, 2 and 3 alone: each worker weighs the same.
    states = [state_of(0), state_of(10), state_of(1), state_of(2)]
    expected = average_states(states)
    for rank, result in found.items():
        assert result.participants == [0, 1, 2, 3] and result.left_out == {}
        assert result.step == 200 and result.round == 7
        for key in ("layer.weight", "layer.bias"):
            torch.testing.assert_close(result.merged[key], expected[key])
        assert result.merged["layer.bias"].dtype == torch.float64
        assert torch.equal(result.merged["count"], torch.tensor([rank]))  # not averaged
        # The lone workers' distances from the mean, known on every rank (a pack's own
        # workers' it tells itself).
        assert set(result.distances) == {2, 3}


def test_a_rank_with_weights_that_are_not_finite_is_left_out_and_takes_the_mean():
    """A rank with weights that are not finite is left out of the mean and takes it: only real
    ranks show every rank agreeing on who was left out."""
    found = run_ranks(broken=1)
    expected = average_states([state_of(0), state_of(10), state_of(2)])
    for result in found.values():
        assert result.participants == [0, 1, 3] and result.left_out == {2: NOT_FINITE}
        torch.testing.assert_close(result.merged["layer.weight"], expected["layer.weight"])
    assert torch.isfinite(found[1].merged["layer.weight"]).all()  # reset from the mean
    assert all(result.source is None for result in found.values())  # nobody asked for one


def test_a_rank_that_keeps_its_policies_with_none_finite_gets_a_workers_own_weights():
    """Rank 1's one worker is not finite and its workers keep their policies: every rank gets
    the job's lowest participating worker's own weights (worker 0, in rank 0's pack, not the
    pack's mean), sent by rank 0 in one more collective that every rank joins."""
    found = run_ranks(broken=1, wants=True)
    for result in found.values():
        assert result.participants == [0, 1, 3] and result.left_out == {2: NOT_FINITE}
        for key in ("layer.weight", "layer.bias"):
            torch.testing.assert_close(result.source[key], state_of(0)[key])
        assert result.source["layer.bias"].dtype == torch.float64


# A rank's life in a fresh interpreter (nothing of torch.distributed imported yet): it joins
# its group, builds its agent (whose first optimizer imports torch._dynamo, which imports
# torch.distributed.nn) and leaves the group; then the threads it still runs.
RANK_LIFE = textwrap.dedent(
    """
    import os
    import torch.distributed as dist
    from agent.agent import TDMPC2
    from agent.config import make_config
    from workers.merging.collective import init_group

    init_group("cpu", timeout_s=30)
    TDMPC2(make_config(1, device="cpu", task="cartpole-balance"), 5, 1)
    dist.destroy_process_group()
    for task in sorted(os.listdir("/proc/self/task")):
        print(open(f"/proc/self/task/{task}/comm").read().strip())
    """
)


def test_a_rank_that_leaves_its_group_keeps_none_of_gloos_threads():
    """Once a rank destroyed its group, gloo's threads (and its store's) are gone: a group
    still held (by torch.distributed.nn's default arguments, imported after the group was
    made) keeps them to the interpreter's shutdown, which at times aborts the rank
    (std::terminate, exit -6). Only a fresh interpreter shows what the first import of
    torch._dynamo holds."""
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", RANK_LIFE],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    threads = done.stdout.split()
    assert threads and not [t for t in threads if "gloo" in t or "tcpstore" in t], threads
