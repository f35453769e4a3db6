"""Weight merging: a plain mean of the workers' networks, behind one small backend interface
(a merge rule may step from that mean: agent/pack/merge_rule.py, workers/merging/outer.py).

What is averaged: every floating-point tensor of the world model (encoder, dynamics, reward,
termination, policy, Qs, target Qs) and the running Q scale. What is not: each worker keeps its
own Adam moments, buffer and RNG. A worker whose weights are not finite is left out.

The file backend (one machine): each worker writes its weights for merge round r into
merge/worker-K.pt (atomic rename, under a file lock), waits a bounded time for the others to
reach round r, averages the set it found and writes merge/merged.pt. A slow or dead worker is
left out of that round, never waited for past the timeout. Who takes part is read from
merge/members.json before each merge (the run rewrites it when a worker is added or removed),
so a removed worker is not waited for and an added one joins the next round. Each file also
records the agent step of its weights (merged.pt: the largest among the participants), which the
showcase shows.
A pack of workers in one process (agent/agent.py) averages its own workers first and takes part
as one file: the mean of its finite workers, how many they are, and which indices it covers.
A torch.distributed backend would do the same merge with an all-reduce.
Over 300 lines because the mean and the file protocol that gathers its inputs share one page.

In a race each lane is a pool of its own (merge/lane-L/): its workers merge only with each
other. Every file carries the pool's number (the knob version that formed it), so that a new
pool never takes an old pool's weights for this round's. A worker that joined a pool and has
made no update since is left out of the mean (its weights are the pool's own, unchanged) and
takes the others' mean.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from agent.errors import WeightsError
from workers.merging.outer import Part
from workers.rundir.directory import (
    LOCK_TIMEOUT_S,
    DirLock,
    atomic_write_json,
    load_state,
    save_state,
)
from workers.rundir.paths import (
    MERGED,
    members_path,
    merge_dir,
    merged_path,
    pool_dir,
    weights_name,
)

State = dict[str, torch.Tensor]


def _floats(state: State) -> list[torch.Tensor]:
    return [t for t in state.values() if t.is_floating_point()]


def is_finite(state: State) -> bool:
    # One sum per tensor: NaN and inf propagate, and it is far cheaper than isfinite on every
    # element of a few million weights.
    sums = torch.stack([t.sum(dtype=torch.float64) for t in _floats(state)])
    return bool(torch.isfinite(sums).all())


def average_states(states: list[State], counts: list[int] | None = None) -> State:
    """Element-wise mean of several model state dicts of the same shapes. `counts`: how many
    workers each state is the mean of (a pack's), so that every worker weighs the same."""
    if not states:
        raise ValueError("nothing to average")
    counts = counts or [1] * len(states)
    keys = states[0].keys()
    for other in states[1:]:
        if other.keys() != keys:
            raise WeightsError("workers' weights have different keys: not the same model")
    floats = [k for k in keys if states[0][k].is_floating_point()]
    total = [states[0][k].clone() for k in floats]
    if counts[0] != 1:
        torch._foreach_mul_(total, float(counts[0]))
    for other, count in zip(states[1:], counts[1:]):
        torch._foreach_add_(total, [other[k].to(total[0].device) for k in floats], alpha=count)
    torch._foreach_div_(total, float(sum(counts)))
    out = {k: v.clone() for k, v in states[0].items() if k not in floats}
    out.update(zip(floats, total))
    return {k: out[k] for k in keys}


def distance(state: State, reference: State) -> float:
    """L2 norm of the difference over all floating-point tensors."""
    keys = [k for k, t in state.items() if t.is_floating_point()]
    diffs = torch._foreach_sub([state[k] for k in keys], [reference[k] for k in keys])
    return float(torch.stack(torch._foreach_norm(diffs)).norm())


# pragma: no mutate block (mutation testing stops here: the file backend below is I/O, which
# tests/workers covers end to end; the averaging above is the algorithm)
@dataclass(frozen=True)
class _Entry:
    """A worker's (or a pack's) weights file as read."""

    round: int
    model: State
    step: int | None
    members: tuple[int, ...]  # the workers whose mean it is
    covers: tuple[int, ...]  # the workers it stands for
    pool: int  # the knob version that formed its pool
    joining: bool  # its worker joined and has made no update of its own since


class MergeCancelled(Exception):
    """A merge given up while waiting for the others, because a stop was asked for."""


@dataclass
class MergeResult:
    merged: State
    round: int
    participants: list[int]
    left_out: dict[int, str] = field(default_factory=dict)
    distances: dict[int, float] = field(default_factory=dict)
    step: int | None = None  # the largest agent step among the participants, when known
    source: State | None = None  # a participant's own weights, where a torchrun rank asked


def write_members(
    run_path: str | Path, workers: list[int], down: dict[int, str] | None = None
) -> None:
    """Record which workers take part in merges from now on (atomic). `down`: workers of the
    run that are not running now (crashed, restarting), with why: nobody waits for them, and
    each merge reports them as left out."""
    path = members_path(run_path)
    path.parent.mkdir(exist_ok=True)  # not parents: a vanished run directory is not recreated
    down = {int(k): str(v) for k, v in (down or {}).items()}
    record = {
        "workers": sorted(set(workers) - set(down)),
        "down": {str(k): v for k, v in down.items()},
    }
    atomic_write_json(path, record)


def merged_step(run_path: str | Path, lane: int | None = None, worker: int | None = None) -> int:
    """The agent step of the newest merged weights of a pool, or (`worker`, in a lane that
    never merges) of that worker's own published ones (-1: none, or unreadable)."""
    path = merged_path(run_path, lane)
    if worker is not None:
        path = pool_dir(run_path, lane) / weights_name(worker)
    try:
        return int(load_state(path).get("step", 0))
    except (WeightsError, ValueError, TypeError):
        return -1


@dataclass(frozen=True)
class Taken:
    """A pool's merged weights as a process with no finite worker takes them."""

    weights: State
    round: int
    participants: tuple[int, ...]
    step: int | None


def _changed(path: Path, seen: tuple | None) -> tuple | None:
    """The file's (inode, size, mtime) when it differs from `seen` (None: unchanged or none)."""
    try:
        info = path.stat()
    except OSError:
        return None
    now = (info.st_ino, info.st_size, info.st_mtime_ns)
    return None if now == seen else now


def pool_base(run_path: str | Path, lane: int | None, pool: int) -> int | None:
    """The agent step from which the slowest worker that has published in pool `pool` counts
    its merge rounds (None: none has, or none said): a worker entering the pool late counts
    from there, so that its rounds are the pool's in number and in time."""
    found = []
    for path in pool_dir(run_path, lane).glob(weights_name("*")):
        try:
            payload = load_state(path)
            if int(payload.get("pool", 0)) == pool and "base" in payload:
                found.append((int(payload.get("step", 0)), int(payload["base"])))
        except (WeightsError, ValueError, TypeError):
            continue
    return min(found)[1] if found else None


def pool_weights(
    run_path: str | Path, lane: int | None, pool: int, worker: int | None = None
) -> Path | None:
    """The file of a pool's newest weights: its merged ones, or (`worker`) that worker's own,
    which a lane that never merges publishes every round; None when there are none of pool
    `pool` (an older race's files stay in the same folder)."""
    path = merged_path(run_path, lane)
    if worker is not None:
        path = pool_dir(run_path, lane) / weights_name(worker)
    try:
        return path if int(load_state(path).get("pool", 0)) == pool else None
    except (WeightsError, ValueError, TypeError):
        return None


class FileMergeBackend:
    """Merging through files in the run directory, for workers on one machine."""

    def __init__(
        self,
        run_path: str | Path,
        workers: list[int],
        timeout_s: float = 30.0,
        stop: Callable[[], bool] | None = None,
        lane: int | None = None,
        pool: int = 0,
    ):
        """`stop`: polled while waiting for the others; once it returns True, merge raises
        MergeCancelled (a stopping worker must not wait out the timeout before its checkpoint).
        `lane`: a race's lane, whose workers (`workers`) are the pool; `pool`: its number."""
        merge_dir(run_path).mkdir(exist_ok=True)  # not parents: a vanished run stays gone
        self.dir = pool_dir(run_path, lane)
        self.dir.mkdir(exist_ok=True)
        self.members_file = members_path(run_path)
        self.workers, self.timeout_s = list(workers), timeout_s
        self.lane, self.pool = lane, pool
        self.lane_workers = set(workers) if lane is not None else None
        self.down: dict[int, str] = {}  # workers not running now (members.json): not waited for
        self.stop = stop
        self.base: int | None = None  # the agent step its publisher counts rounds from

    def members(self) -> list[int]:
        """The workers taking part now: members.json if the run wrote one, else those given."""
        try:
            record = json.loads(self.members_file.read_text())
            found, down = record["workers"], record.get("down", {})
            if isinstance(found, list) and all(isinstance(w, int) for w in found):
                ours = self.lane_workers
                self.workers = [w for w in found if ours is None or w in ours]
                self.down = {
                    int(k): str(v) for k, v in dict(down).items() if ours is None or int(k) in ours
                }
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            pass  # none yet, or damaged: keep the last good list
        return list(self.workers)

    def _path(self, worker: int) -> Path:
        return self.dir / weights_name(worker)

    def _lock(self, path: Path) -> DirLock:
        return DirLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S)

    def publish(
        self,
        worker: int,
        round_: int,
        state: State,
        step: int | None = None,
        members: tuple[int, ...] = (),
        covers: tuple[int, ...] = (),
        joining: bool = False,
    ) -> None:
        """Write `worker`'s weights for round `round_`; a pack's are the mean of its workers
        `members` and stand for all of `covers` (a worker left out included). `joining`: they
        are the pool's own (no update since it joined), not to be averaged."""
        path = self._path(worker)
        payload = {
            "round": round_,
            "time": time.time(),
            "model": {k: v.cpu() for k, v in state.items()},
            "members": sorted(members or (worker,)),
            "covers": sorted({worker, *members, *covers}),
            "pool": self.pool,
            "joining": joining,
        }
        if self.base is not None:  # where its rounds are counted from (pool_base)
            payload["base"] = int(self.base)
        if step is not None:  # the showcase labels these weights with their agent step
            payload["step"] = int(step)
        with self._lock(path):
            save_state(path, payload)

    def _read(self, worker: int) -> _Entry | str:
        path = self._path(worker)
        if not path.exists():
            return "no weights yet"
        try:
            with self._lock(path):
                payload = load_state(path)
            step = payload.get("step")
            entry = _Entry(
                int(payload["round"]),
                payload["model"],
                None if step is None else int(step),
                tuple(int(w) for w in payload.get("members", (worker,))),
                tuple(int(w) for w in payload.get("covers", (worker,))),
                int(payload.get("pool", 0)),
                bool(payload.get("joining", False)),
            )
        except (WeightsError, KeyError, TypeError, ValueError) as err:
            return f"unreadable weights file ({err})"
        if entry.pool != self.pool:  # written before this pool was formed
            return "no weights yet in this pool"
        return entry

    def read(self, worker: int) -> tuple[int, State] | str:
        """(round, weights) of a worker's newest file, or the reason it cannot be used."""
        entry = self._read(worker)
        return entry if isinstance(entry, str) else (entry.round, entry.model)

    def merge(
        self,
        worker: int,
        round_: int,
        state: State,
        step: int | None = None,
        members: tuple[int, ...] = (),
        covers: tuple[int, ...] = (),
        joining: str | None = None,
        rule: Callable[[State, list[Part]], State] | None = None,
        publish: bool = True,
    ) -> MergeResult | None:
        """Merge round `round_`: `state` is `worker`'s weights, or (a pack) the mean of its
        workers `members`, standing for all of `covers`. Returns the mean over every worker
        (each weighs the same, whether it came alone or in a pack). `joining`: why this
        worker's weights stay out of the mean (it joined and has not updated since); it takes
        the others' mean, or keeps its own when there is none. `rule`: the weights the pool
        takes for the mean and the parts it was made of (an outer step), else the mean;
        published as the merged ones unless `publish` is False (the caller publishes)."""
        if not is_finite(state):
            return None
        self.publish(worker, round_, state, step, members, covers, joining=joining is not None)
        deadline = time.monotonic() + self.timeout_s
        while True:
            found: dict[int, State] = {} if joining else {worker: state}
            inside, steps = {worker: members or (worker,)}, {worker: step}
            rounds = {worker: round_}
            left_out: dict[int, str] = {worker: joining} if joining else {}
            covered = {worker, *covers}
            for other in self.members():  # a pack's file is its lowest index: read first
                if other in covered:
                    continue
                entry = self._read(other)
                if isinstance(entry, str):
                    left_out[other] = entry
                    continue
                covered.update(entry.covers)
                if entry.round < round_:
                    left_out[other] = f"behind (round {entry.round} < {round_})"
                elif not is_finite(entry.model):  # each worker of its pack
                    left_out.update({w: "non-finite weights" for w in entry.covers})
                elif entry.joining:
                    left_out[other] = "joined the pool and has made no update of its own yet"
                else:
                    found[other], steps[other] = entry.model, entry.step
                    inside[other], rounds[other] = entry.members, entry.round
            waiting = [w for w, why in left_out.items() if why.startswith(("behind", "no weights"))]
            if not waiting or time.monotonic() >= deadline:
                break
            if self.stop is not None and self.stop():
                raise MergeCancelled(f"stopped while waiting for workers {waiting}")
            time.sleep(0.05)
        left_out.update({w: why for w, why in self.down.items() if w != worker})
        for other, why in left_out.items():
            if why.startswith("unreadable"):
                warnings.warn(
                    f"worker {other} left out of merge round {round_}: {why}", stacklevel=2
                )
        if not found:  # joining, and nobody else here: the pool's weights are its own
            found[worker], joining = state, None
            left_out.pop(worker, None)
        merged = average_states(list(found.values()), [len(inside[w]) for w in found])
        if rule is not None:
            merged = rule(merged, [Part(inside[w], found[w], rounds[w]) for w in found])
        result = MergeResult(
            merged=merged,
            round=round_,
            participants=sorted(w for file in found for w in inside[file]),
            left_out=left_out,
            # Each lone worker's distance from the mean (a pack tells its own workers').
            distances={w: distance(s, merged) for w, s in found.items() if inside[w] == (w,)},
        )
        known = [s for s in steps.values() if s is not None]
        # The merged weights are as trained as the furthest participant.
        result.step = max(known) if known else None
        if publish:
            self.publish_merged(round_, merged, result.participants, result.step)
        return result

    def sit_out(
        self, worker: int, round_: int, state: State, step: int | None, covers: tuple[int, ...]
    ) -> Taken | None:
        """Round `round_` for a process none of whose workers (`covers`, filed as `worker`) is
        finite: its file says so for the round (the others leave it out at once, never wait
        for it), and it takes the pool's merged weights of this round or a later one as
        another process publishes them, waiting at most the timeout, or less when every other
        process is at the round with none finite either. Failing those, the pool's newest
        merged weights of an earlier round: any of the pool's weights beat non-finite ones.
        None: the pool has none."""
        self.publish(worker, round_, state, step, covers=covers)
        path, seen, looks = self.dir / MERGED, None, 0
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            found = _changed(path, seen)
            if found is not None:
                seen = found
                merged = self.newest_merged()
                if merged is not None and merged.round >= round_:
                    return merged
            looks += 1
            if looks % 10 == 0 and self._none_finite(round_, covers):
                break  # nobody will publish this round
            if self.stop is not None and self.stop():
                raise MergeCancelled(f"stopped while waiting for the pool's round {round_}")
            time.sleep(0.05)
        return self.newest_merged()

    def _none_finite(self, round_: int, covers: tuple[int, ...]) -> bool:
        """Whether every other running member has filed round `round_` (or later) with no
        finite weights."""
        covered = set(covers)
        for other in self.members():
            if other in covered or other in self.down:
                continue
            entry = self._read(other)
            if isinstance(entry, str) or entry.round < round_ or is_finite(entry.model):
                return False
            covered.update(entry.covers)
        return True

    def newest_merged(self) -> Taken | None:
        """The pool's newest merged weights, if they are this pool's and finite."""
        path = self.dir / MERGED
        try:
            with self._lock(path):
                payload = load_state(path)
            if int(payload.get("pool", 0)) != self.pool:
                return None
            model, step = payload["model"], payload.get("step")
            participants = tuple(int(w) for w in payload.get("participants", ()))
            taken = Taken(
                model, int(payload["round"]), participants, None if step is None else int(step)
            )
        except (WeightsError, KeyError, TypeError, ValueError):
            return None
        if not isinstance(model, dict) or not all(
            isinstance(v, torch.Tensor) for v in model.values()
        ):
            return None
        if not any(v.is_floating_point() for v in model.values()) or not is_finite(model):
            return None
        return taken

    def publish_merged(
        self, round_: int, state: State, participants: list[int], step: int | None
    ) -> None:
        payload = {"round": round_, "time": time.time(), "participants": participants}
        payload["pool"] = self.pool
        payload["model"] = {k: v.cpu() for k, v in state.items()}
        if step is not None:
            payload["step"] = int(step)
        merged_path = self.dir / MERGED
        with self._lock(merged_path):
            save_state(merged_path, payload)
