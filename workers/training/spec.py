"""What a run and its training processes agree on: a worker's spec (what it is started with),
the layout of its shared snapshot, the states it can be in, and the exit codes that say why it
ended. Kept apart from the process itself (process.py) so that the run's side (spawn,
monitor, records) and the worker's hooks read the same protocol without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Layout of a worker's shared snapshot (multiprocessing.Array of doubles).
SNAPSHOT_FIELDS = (
    "step",
    "steps_per_s",
    "last_return",
    "knob_version",
    "state",
    "merges",
    "updates",
    "heartbeat",
    "blocked_bytes",  # while its state is "disk full": the size of the write that failed
    "first_update_s",  # seconds from the process start to its first update's end (compiling)
)
# Appended, never reordered: the snapshot stores a state as its index here.
STATES = (
    "starting",
    "seeding",
    "training",
    "merging",
    "paused",
    "stopped",
    "crashed",
    "done",
    "pretraining",
    "disk full",  # a write failed for want of space: training waits until writes succeed
)

RUN_DIR_GONE = 3  # a worker's exit code when its run directory vanished
DOES_NOT_FIT = 4  # its exit code when the GPU ran out of memory: restarting would not help
SPLIT_PACK = 5  # a pack's exit code when its self-check found the pack unsound: run it apart


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    run_path: str
    cfg: dict
    merge_with: tuple[int, ...]  # workers that take part in merges; empty: never merges
    merge_every: int  # the run's (RunSettings), used until a knob record says otherwise
    env_seed: int | None = None  # its environments' first seed (None: its own seed, cfg's)
    merge_timeout_s: float = 30.0
    checkpoint_every: int = 10_000
    threads: int = 1
    resume: bool = False
    start_from_merged: bool = False
    join_step: int = 0  # from the merged weights: the agent step it starts counting from
    nice: int = 0  # CPU priority below the process that started it (a window: see Run.start)
    tensorboard: bool = True  # mirror the metrics into tb/worker-K/ (workers/rundir/sinks.py)
    wandb: bool = False
    # A rank of a torchrun job: merges over torch.distributed; its records are gathered into
    # rank 0's run directory, `job_path` (run_path is the rank's own folder).
    distributed: bool = False
    job_path: str = ""


@dataclass
class WorkerLink:
    """One worker's share of what its training process and the run pass between them (the
    pause and stop events are the run's, shared by every worker)."""

    spec: WorkerSpec
    snapshot: Any  # SNAPSHOT_FIELDS as a shared array of doubles: latest-wins progress
    checkpoint: Any  # Event: save a checkpoint now (each worker clears its own)
    leave: Any  # Event: this worker alone stops (taken out of the run)
    join: Any = None  # Value: the step it counts on from when starting from the merged weights

    def set(self, **values: float) -> None:
        """Write fields of the snapshot."""
        for name, value in values.items():
            self.snapshot[SNAPSHOT_FIELDS.index(name)] = value

    def value(self, name: str) -> float:
        """A field of the snapshot."""
        return self.snapshot[SNAPSHOT_FIELDS.index(name)]

    def set_state(self, state: str) -> None:
        self.set(state=STATES.index(state))
