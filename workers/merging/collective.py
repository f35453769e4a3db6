"""Merging over torch.distributed: a merge round is one all-reduce.

Each process (a rank) holds some of the run's workers: one, or a pack. In a round it
contributes the sum of its participating workers' weights and how many they are, so that the
all-reduced sum divided by the all-reduced count is the plain mean over every participating
worker of the job, each weighing the same whether it trained alone or in a pack. A rank whose
weights are not finite contributes zeros and a count of zero, and takes the mean like the others
(it is reset from it). The weights travel as one flat buffer: one collective per round, plus a
small one for each worker's distance from the mean.

gloo carries CPU tensors, NCCL CUDA tensors (one GPU per rank); the backend is chosen from the
device (`backend_for`). A collective waits at most the process group's timeout, so a rank that
died cannot hang the others for ever (torchrun's elastic restart then brings the group back).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from agent.errors import UserError
from workers.merging.files import MergeResult, State, distance, is_finite

NOT_FINITE = "non-finite weights"


def backend_for(device: torch.device | str) -> str:
    """The process-group backend for weights on `device`: NCCL for CUDA, gloo for the CPU."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_group(
    device: torch.device | str, timeout_s: float, rendezvous_s: float | None = None
) -> None:
    """Join the job's process group from torchrun's environment (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT) with a collective timeout of `timeout_s`, giving up on reaching
    the rendezvous after `rendezvous_s` (default: the same). With CUDA, `device`
    becomes the process's current GPU (NCCL stages the collectives of Python objects there).

    The group's keys go under a prefix of torchrun's restart count: after an elastic restart
    the ranks meet in the same store, and without it they would read the addresses of the
    ranks that died and fail to connect (seen with gloo on torch 2.13).

    torch.distributed.nn is imported before the group exists: its functions take
    `group=group.WORLD` as a default argument, evaluated at import, and torch._dynamo imports
    it (the first torch.optim.Adam imports torch._dynamo). Imported after the group was made,
    those defaults hold the group for good: destroy_process_group then leaves gloo's group and
    its threads to the interpreter's shutdown, which at times aborts the rank ("terminate
    called without an active exception", exit -6: a torchrun job that trained to its end
    failing). Imported first, they hold None."""
    import torch.distributed.nn  # noqa: F401  (see above: before init_process_group)

    if torch.device(device).type == "cuda":
        torch.cuda.set_device(device)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    timeout = datetime.timedelta(seconds=timeout_s)
    rendezvous_s = timeout_s if rendezvous_s is None else rendezvous_s
    # torchrun's agent serves the store itself; ranks started by hand: rank 0 does.
    served = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    try:
        with _quiet_stderr():  # c10d prints a C++ stack trace of each try: the line below says it
            store = dist.TCPStore(
                host,
                port,
                world,
                is_master=rank == 0 and not served,
                timeout=datetime.timedelta(seconds=rendezvous_s),
            )
    except (RuntimeError, TimeoutError) as err:  # DistStoreError is a RuntimeError
        raise UserError(
            f"rank {rank} cannot reach the rendezvous at {host}:{port} within {rendezvous_s:.0f} s "
            f"({str(err).splitlines()[0][:120]}): check MASTER_ADDR/--rdzv-endpoint and that "
            "rank 0 runs"
        ) from None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(
        backend_for(device),
        store=dist.PrefixStore(f"tdmpc2-live/attempt-{attempt}", store),
        rank=rank,
        world_size=world,
        timeout=timeout,
    )


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null meanwhile (what C++ code writes there included)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class DistributedMergeBackend:
    """The merge of one rank's workers with every other rank's, through an all-reduce."""

    def __init__(self, merging: list[int], workers: int, device: torch.device | str):
        """`merging`: the workers of the job that take part in merges (numbered 0..workers-1
        across ranks; a control worker does not); `device`: where this rank's weights are
        (CUDA for NCCL)."""
        self.merging, self.workers, self.device = sorted(merging), workers, torch.device(device)

    def merge(self, round_: int, state: State, members: tuple[int, ...], step: int) -> MergeResult:
        """Merge round `round_`: `state` is the mean of this rank's workers `members` (weights
        that are not finite, or no members: it contributes nothing, and still takes part in the
        collective, which every rank must). Returns the mean over every participating worker of
        the job, the same on every rank, with the largest step among the ranks."""
        ok = bool(members) and is_finite(state)
        keys = [k for k, t in state.items() if t.is_floating_point()]
        tensors = [state[k].detach().to(self.device, torch.float32) for k in keys]
        weights = _flatten_dense_tensors(tensors)
        weights = weights * len(members) if ok else torch.zeros_like(weights)
        # After the weights, one slot per worker of the job: 1 if it takes part.
        taking_part = torch.zeros(self.workers, device=self.device)
        if ok:
            taking_part[list(members)] = 1.0
        buffer = torch.cat([weights, taking_part])
        dist.all_reduce(buffer)
        newest = torch.tensor([float(step)], device=self.device)
        dist.all_reduce(newest, op=dist.ReduceOp.MAX)
        n = weights.numel()
        participants = [w for w in range(self.workers) if buffer[n + w] > 0.5]
        if not participants:
            raise RuntimeError(f"merge round {round_}: no worker of the job has finite weights")
        means = _unflatten_dense_tensors(buffer[:n] / len(participants), tensors)
        merged = dict(state)
        merged.update({k: t.to(state[k].device, state[k].dtype) for k, t in zip(keys, means)})
        # Each lone worker's distance from the mean (a pack tells its own workers'), and
        # whether it is known, gathered so that every rank can record every worker's.
        distances = torch.zeros(2 * self.workers, device=self.device)
        if ok and len(members) == 1:
            distances[members[0]] = distance(state, merged)
            distances[self.workers + members[0]] = 1.0
        dist.all_reduce(distances)
        return MergeResult(
            merged=merged,
            round=round_,
            participants=participants,
            left_out={w: NOT_FINITE for w in self.merging if w not in participants},
            distances={
                w: float(distances[w])
                for w in range(self.workers)
                if distances[self.workers + w] > 0.5
            },
            step=int(newest.item()),
        )
