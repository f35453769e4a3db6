"""Requests to the process that owns a run, from a process watching it (an attached window).

Pause, resume, checkpoint, stop, restart, add or remove a worker: events, not state, so none may
be dropped. They go into an append-only requests.jsonl in the run directory, one whole line per
request written under a lock; the owner reads the lines added since it last looked and serves
each once. An owner starting (or resuming) a run skips what was asked of an earlier owner.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from workers.rundir.directory import DirLock
from workers.rundir.lines import parse_lines
from workers.rundir.records import Request

REQUESTS = "requests.jsonl"


def describe(request: Request) -> str:
    """One line for a served request: "remove worker 2: done", "pause: refused: ..."."""
    worker = "" if request.worker is None else f" {request.worker}"
    outcome = f"refused: {request.error}" if request.error else "done"
    return f"{request.action.replace('_', ' ')}{worker}: {outcome}"


def served_notice(request: Request) -> str:
    """The window's notice for a request it served: "an attached window asked: pause: done"."""
    return f"an attached window asked: {describe(request)}"


class RequestLog:
    def __init__(self, run_path: str | Path):
        self.path = Path(run_path) / REQUESTS
        self.lock = DirLock(str(self.path) + ".lock", timeout=10)
        self._offset = 0
        self.skipped = 0  # damaged lines passed over so far

    def send(self, action: str, worker: int | None = None, lane: int | None = None) -> None:
        """Append one request for the owner (from another process); ValueError for an
        action that is none."""
        line = json.dumps(Request(action=action, worker=worker, lane=lane).to_json()) + "\n"
        with self.lock, open(self.path, "ab+") as f:
            if f.tell() and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n":
                line = "\n" + line  # a torn line before (a sender died mid-line) stays apart
            f.write(line.encode())

    def skip_old(self) -> None:
        """Serve only requests made from now on (an owner starting the run)."""
        try:
            self._offset = os.path.getsize(self.path)
        except OSError:
            self._offset = 0

    def receive(self) -> list[Request]:
        """The requests appended since the last call, oldest first (malformed lines skipped)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a line being written waits for the next call
        self._offset += end
        requests, skipped = parse_lines(data[:end], Request)
        self.skipped += skipped
        return requests
