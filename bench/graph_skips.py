"""Why a compiled function did not replay as a CUDA graph: the reasons Inductor gives for each
graph it runs without one (a host sync, a CPU tensor, an input mutated outside the graph...).

A benchmark that reports none while it timed a compiled update and plan has timed them as CUDA
graphs; one that reports some says which graph fell back and why. Inductor logs each skip as a
warning on its "cudagraphs" logger (and counts it); this collects those messages.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from torch._inductor.cudagraph_utils import cudagraphs_log


class _Collect(logging.Handler):
    def __init__(self, into: list[str]):
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage().splitlines()[0][:300])


@contextmanager
def cudagraph_skips() -> Iterator[list[str]]:
    """A list that fills with the reason of every CUDA graph skipped inside the block, in the
    order Inductor gave them (still printed by torch as well)."""
    reasons: list[str] = []
    handler = _Collect(reasons)
    cudagraphs_log.addHandler(handler)
    try:
        yield reasons
    finally:
        cudagraphs_log.removeHandler(handler)
