"""How many threads torch (and OpenMP/MKL) may use in each process the program starts.

torch's default is one thread per core. That is fine on an idle machine, but OpenMP threads
spin while they wait for each other, so when another process takes one of the cores every
parallel region waits for the descheduled thread: on a 2-core machine with other work, one update
took 1.8-3.4 s with 2 threads against 43-65 ms with 1. So the cores are shared out between the
training processes, one core is left for everything else (the window, the showcase, the
system, other programs) and no process gets more than MAX_USEFUL: the models here are small,
so more threads are expected to gain little and add to the waiting (a judgement: the project's
machine has 2 cores, and the cap was not measured on a larger one; --threads overrides it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agent.errors import UserError

MAX_USEFUL = 4  # threads one training process gets at most from the policy (--threads: any)
SHOWCASE_THREADS = 1  # the showcase player: best effort, below training
WINDOW_THREADS = 1  # the window's own process: drawing, reading records, loading weights
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. under taskset or a container's
    cpuset), else the machine's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def policy_threads(workers: int, cores: int) -> int:
    """torch threads for each of `workers` training processes on `cores` cores."""
    spare = cores - 1 if cores > 1 else 1  # one core for the rest of the machine
    return max(1, min(MAX_USEFUL, spare // max(1, workers)))


def check_threads(requested: int | None, cores: int | None = None) -> None:
    """Refuse a --threads that cannot be meant (UserError: one line)."""
    if requested is None:
        return
    cores = cores or available_cores()
    if not 1 <= requested <= cores:
        raise UserError(
            f"--threads must be between 1 and {cores} (the cores this process may use), "
            f"got {requested}"
        )


@dataclass(frozen=True)
class ThreadChoice:
    threads: int  # per training process
    cores: int
    workers: int  # training processes (1: the plain headless run)
    requested: bool  # given with --threads, not the policy's

    def describe(self) -> str:
        """The start-up line: what was chosen and from what."""
        per = " per worker" if self.workers > 1 else ""
        source = "--threads; " if self.requested else ""
        processes = f"{self.workers} workers" if self.workers > 1 else "1 training process"
        return f"torch threads: {self.threads}{per} ({source}{self.cores} cores, {processes})"


def choose_threads(
    workers: int, requested: int | None = None, cores: int | None = None
) -> ThreadChoice:
    """The threads each of `workers` training processes uses: `requested` (--threads) if
    given, else the policy."""
    cores = cores or available_cores()
    threads = requested if requested else policy_threads(workers, cores)
    return ThreadChoice(threads, cores, workers, bool(requested))


def apply_threads(threads: int) -> None:
    """Use `threads` in this process: torch's intra-op pool now, and the OpenMP/MKL
    environment, which libraries loaded later and child processes read when they start."""
    import torch

    for name in THREAD_ENV:
        os.environ[name] = str(threads)
    torch.set_num_threads(threads)
