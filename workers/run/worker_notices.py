"""What the workers recorded that the user must hear of even without a window: a refused knob
record (once, however many workers refused it), where each worker resumed from, the fast path
each process trains on (its start-up self-check: once per process), a worker paused for want
of disk space and going on again. The monitor (monitor.py) asks for them each look."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from workers.run.spawn import WorkerProcess
from workers.rundir.directory import human_size
from workers.rundir.paths import metrics_name
from workers.rundir.records import (
    KnobsRefused,
    Merge,
    MergeSkipped,
    Resumed,
    SelfCheck,
    parse_records,
)
from workers.rundir.settings import RunSettings
from workers.training.spec import STATES


class WorkerNotices:
    def __init__(
        self, path: Path, settings: Callable[[], RunSettings], note: Callable[..., None]
    ) -> None:
        """`settings()`: the run's current settings; `note(text, in_record=False)`: tell it."""
        self.path, self._settings, self._note = path, settings, note
        self._scanned: dict[int, int] = {}  # bytes of each worker's records read so far
        self._refusals_told: set = set()
        self._checks_told: set[str] = set()
        self._merge_notes_told: set[tuple[int, str]] = set()  # (round, note): once per round
        self._disk_full: set[int] = set()  # workers told of as paused for want of disk space

    def from_now(self) -> None:
        """Tell only of what the workers record from now on (before they spawn)."""
        for index in range(self._settings().workers):
            path = self.path / metrics_name(index)
            self._scanned[index] = path.stat().st_size if path.exists() else 0

    def scan_records(self) -> None:
        """Notices of what the workers recorded that the user must hear of even without a
        window: a refused knob record (once, however many workers refused it), the step each
        worker resumed from (and a damaged checkpoint passed over), each process's fast path,
        what a merge rule did that needs saying (the outer step started again, and why)."""
        for index in range(self._settings().workers):
            path = self.path / metrics_name(index)
            try:
                with open(path, "rb") as f:
                    f.seek(self._scanned.get(index, 0))
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1
            self._scanned[index] = self._scanned.get(index, 0) + end
            for record in parse_records(data[:end])[0]:  # damaged lines: the tail warns
                if isinstance(record, Resumed):
                    self._resumed(index, record)
                elif isinstance(record, KnobsRefused):
                    key = (record.version, record.reason)
                    if key not in self._refusals_told:
                        self._refusals_told.add(key)
                        self._note(record.message, in_record=True)
                elif isinstance(record, SelfCheck) and record.message not in self._checks_told:
                    self._checks_told.add(record.message)  # a pack's workers record one line
                    self._note(record.message, in_record=True)
                elif isinstance(record, MergeSkipped):
                    key = (record.round, f"skipped: {record.reason}")
                    if key not in self._merge_notes_told:
                        self._merge_notes_told.add(key)
                        self._note(f"worker {index}, merge round {record.round} {key[1]}")
                elif isinstance(record, Merge) and record.note:
                    key = (record.round, record.note)
                    if key not in self._merge_notes_told:  # once, not once per worker
                        self._merge_notes_told.add(key)
                        self._note(f"worker {index}, merge round {record.round}: {record.note}")

    def watch_disk(self, procs: dict[int, WorkerProcess]) -> None:
        """Say when a worker pauses because a write failed for want of space, and when it
        goes on (it tries again by itself: see DiskGuard.wait_for_disk)."""
        for index, p in list(procs.items()):
            blocked = p.process.is_alive() and STATES[int(p.value("state"))] == "disk full"
            if blocked and index not in self._disk_full:
                self._disk_full.add(index)
                try:
                    free = shutil.disk_usage(self.path).free
                except OSError:
                    free = -1
                needed = int(p.value("blocked_bytes"))
                self._note(
                    f"error: worker {index} paused: a write in {self.path} failed for want of "
                    f"space (free: {human_size(free)}; it needs about {human_size(needed)}): "
                    "free some space and training resumes by itself; every file written "
                    "before stays whole"
                )
            elif not blocked and index in self._disk_full:
                self._disk_full.discard(index)
                if p.process.is_alive():
                    self._note(f"worker {index} writes again: training resumed")

    def _resumed(self, index: int, record: Resumed) -> None:
        if record.fallback:  # also a record the window shows as an error
            self._note(f"warning: {record.fallback}", in_record=True)
        else:
            self._note(f"worker {index} resumed from step {record.step} ({record.checkpoint})")
