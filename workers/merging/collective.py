"""Merging over torch.distributed: a merge round is one all-reduce.

Each process (a rank) holds some of the run's workers: one, or a pack. In a round it
contributes the sum of its participating workers' weights and how many they are, so that the
all-reduced sum divided by the all-reduced count is the plain mean over every participating
worker of the job, each weighing the same whether it trained alone or in a pack. A rank whose
weights are not finite contributes zeros and a count of zero, and takes the mean like the others
(it is reset from it). The weights travel as one flat buffer: one collective per round, plus a
small one for each worker's distance from the mean.

With the policy kept (merge_policy off) a mean holds an average of policies that never shared
weights, which no worker has. A rank whose workers keep their policies but none is finite asks
for one worker's own weights (a slot of the buffer counts the ranks that ask); in such a round
the rank holding the job's lowest participating worker sends them, in one more collective, and
the asking rank's workers take what that worker holds after the merge: its own policy with the
model it trained it with, as a reset worker does in a pack or over files (rank 0 publishes it).

gloo carries CPU tensors, NCCL CUDA tensors (one GPU per rank); the backend is chosen from the
device (`backend_for`). A collective waits at most the process group's timeout, so a rank that
died cannot hang the others for ever (torchrun's elastic restart then brings the group back).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from agent.errors import UserError
from workers.merging.files import MergeResult, State, distance, is_finite

# How long a collective (a merge round, the start-up checks) waits for the slowest rank. The
# ranks reach each round at about the same time; a rank that died is noticed by torchrun
# itself, which stops the others at once: this is the backstop for a rank that hangs.
COLLECTIVE_TIMEOUT_S = 300.0

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

    def merge(
        self,
        round_: int,
        state: State,
        members: tuple[int, ...],
        step: int,
        own: Callable[[int], State] | None = None,
        wants: bool = False,
    ) -> MergeResult:
        """Merge round `round_`: `state` is the mean of this rank's workers `members` (weights
        that are not finite, or no members: it contributes nothing, and still takes part in the
        collective, which every rank must). Returns the mean over every participating worker of
        the job, the same on every rank, with the largest step among the ranks. `wants`: this
        rank, with no finite worker, wants a participant's own weights (its workers keep their
        policies); when any rank does, every rank's result has the job's lowest participating
        worker's as `source`, sent by the rank holding it (`own`: a member's own weights by
        its index; without it, the rank's mean)."""
        ok = bool(members) and is_finite(state)
        keys = [k for k, t in state.items() if t.is_floating_point()]
        tensors = [state[k].detach().to(self.device, torch.float32) for k in keys]
        weights = _flatten_dense_tensors(tensors)
        weights = weights * len(members) if ok else torch.zeros_like(weights)
        # After the weights, one slot per worker of the job: 1 if it takes part; then the
        # number of ranks that want a participant's own weights.
        taking_part = torch.zeros(self.workers + 1, device=self.device)
        if ok:
            taking_part[list(members)] = 1.0
        taking_part[-1] = float(wants and not ok)
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
        source = None
        if buffer[-1] > 0.5:  # every rank sees the same count: all take part, or none
            held = ok and participants[0] in members
            mine = (own(participants[0]) if own else state) if held else None
            source = self._sent(mine, merged, keys, tensors)
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
            source=source,
        )

    def _sent(self, mine: State | None, like: State, keys: list[str], tensors) -> State:
        """One worker's own weights, from the one rank that holds them (`mine`; the others
        None): a sum to which every other rank adds zeros. Tensors that are not floating point
        are `like`'s."""
        if mine is None:
            flat = torch.zeros(sum(t.numel() for t in tensors), device=self.device)
        else:
            flat = _flatten_dense_tensors(
                [mine[k].detach().to(self.device, torch.float32) for k in keys]
            )
        dist.all_reduce(flat)
        sent = dict(like)
        for k, t in zip(keys, _unflatten_dense_tensors(flat, tensors)):
            sent[k] = t.to(like[k].device, like[k].dtype)
        return sent
