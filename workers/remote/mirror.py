"""A local copy of a served run directory (server.py), kept up to date in a thread, that a
window attaches to as to any run (connected.py): the window's code does not know the run is
elsewhere.

Each pass lists the served files and fetches what changed: an append-only file (records,
CSVs, TensorBoard events) from the byte where the copy ends (HTTP Range), any other file whole,
written atomically; a file that shrank or was replaced (another inode) is fetched whole again,
one that vanished is removed. What the copy holds of each file is kept in `.mirror.json`, so
a dropped link, a restarted server or a window opened again later goes on from there and no
line is lost or doubled. A whole file over BULK_BYTES comes in a thread of its own, so the
records behind it keep arriving. `wants` may defer files (a connected window defers the weights of
workers it does not show: each is as large as the model, and every merge rewrites them); a
deferred file is fetched once wanted. Files over `max_bytes` (a checkpoint with a large replay
buffer) are left out, with a notice: the window needs weights, which the merge files carry.
Over 300 lines because the passes, the bulk fetches and the note of what is held share one
state under one lock, and the link's two calls (hello, send) are how that state is reached.
"""

from __future__ import annotations

import gzip
import http.client
import json
import queue
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from agent.errors import UserError
from workers.remote.wire import PROTOCOL, SERVER_NAME, encode_command
from workers.run.commands import Command, Outcome
from workers.rundir.directory import atomic_write_bytes, atomic_write_json

STATE = ".mirror.json"  # what the copy holds of each file: [inode, size, mtime] on the server
POLL_S = 0.5  # between passes while the link is up
RETRY_S = 1.0  # between tries while it is down
TIMEOUT_S = 10.0
MAX_BYTES = 64 << 20
# A whole file this large (merged weights: 32 MB at 5M) is fetched by a thread of its own, so
# that the records behind it are not held up for its transfer over a slow link.
BULK_BYTES = 1 << 20
APPEND_SUFFIXES = (".jsonl", ".csv")


class LinkDown(Exception):
    """The server answers nothing, or broke off an answer."""


def kind_of(path: str) -> str:
    """What a file is, for counting the link's bytes: records, weights, episodes or other."""
    name = path.rsplit("/", 1)[-1]
    if name.endswith(APPEND_SUFFIXES):
        return "records"
    kinds = {".pt": "weights", ".npz": "episodes"}
    return kinds.get(Path(name).suffix, "tensorboard" if "tfevents" in name else "other")


def appended_only(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.endswith(APPEND_SUFFIXES) or name.startswith("events.out.tfevents")


class Mirror:
    def __init__(self, base: str, token: str, folder: Path, max_bytes: int = MAX_BYTES) -> None:
        self.base, self.folder, self.max_bytes = base, Path(folder), max_bytes
        self._headers = {"Authorization": f"Bearer {token}"}
        self._held: dict[str, list[int]] = {}
        self._lock = threading.Lock()  # _held: the passes and the bulk fetches
        self._saving = threading.Lock()
        self._bulk: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._pending: set[str] = set()  # large files queued for the bulk thread
        self._saved: dict[str, list[int]] | None = None  # as .mirror.json holds it
        self._left_out: set[str] = set()
        self.bytes_in = 0  # fetched so far (the body of each answer)
        self.bytes_by: Counter[str] = Counter()  # the same by kind_of, and the listings
        self._files: list[dict] = []  # the last listing, and its ETag
        self._etag = ""
        self.down_since: float | None = None
        self.reason = ""  # why the link is down
        self._wake, self._stopped = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self.wants: Callable[[str], bool] = lambda path: True
        self.deferred: set[str] = set()  # listed files not fetched because not wanted now
        self._early: list[str] = []  # notes of the first copy, before the window takes them
        self._note: Callable[[str], None] = self._early.append

    # talking to the server ------------------------------------------------------------------
    def _ask(self, path: str, data: bytes | None = None, headers: dict | None = None):
        request = urllib.request.Request(
            self.base + path, data=data, headers={**self._headers, **(headers or {})}
        )
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)

    def hello(self) -> dict:
        """Who answers at the address: UserError when nobody, not a run server, or the token
        is refused (at connect time; later the same faults are a link down)."""
        try:
            with self._ask("/api/hello") as answer:
                info = json.loads(answer.read())
        except urllib.error.HTTPError as err:
            if err.code == 401 and SERVER_NAME in (err.headers.get("Server") or ""):
                raise UserError(f"{self.base}: the run server refused the token") from None
            raise UserError(f"{self.base}: not a run server (HTTP {err.code})") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
            reason = getattr(err, "reason", err)
            raise UserError(f"{self.base}: answers nothing ({reason})") from None
        except ValueError:
            raise UserError(f"{self.base}: not a run server (its answer is not JSON)") from None
        if not isinstance(info, dict) or info.get("server") != SERVER_NAME:
            raise UserError(f"{self.base}: not a run server")
        if info.get("protocol") != PROTOCOL:
            raise UserError(
                f"{self.base}: a run server of another version (protocol {info.get('protocol')}, "
                f"this window speaks {PROTOCOL}): use the same version on both machines"
            )
        return info

    def send(self, command: Command) -> Outcome:
        """Carry out `command` on the served run: its Outcome, or UserError with the run's
        refusal, or with why the link did not carry it (then nothing was done)."""
        body = json.dumps(encode_command(command)).encode()
        try:
            with self._ask("/api/command", body, {"Content-Type": "application/json"}) as answer:
                reply = json.loads(answer.read())
        except urllib.error.HTTPError as err:
            try:
                why = json.loads(err.read()).get("error", "")
            except (ValueError, AttributeError, OSError):
                why = f"HTTP {err.code}"
            raise UserError(why) from None
        except urllib.error.URLError as err:  # no connection: nothing reached the server
            raise UserError(
                f"the link to {self.base} is down ({err.reason}): not sent; try again when it is "
                "back"
            ) from None
        except (OSError, http.client.HTTPException) as err:  # cut off while it was answering
            raise UserError(
                f"no answer from {self.base} ({err}): the command may have been carried out; "
                "the knob panel and the records will show"
            ) from None
        self.wake()  # what the command changed comes back sooner
        return Outcome(tuple(reply.get("notices", ())), reply.get("value"))

    # the copy --------------------------------------------------------------------------------
    def sync(self) -> int:
        """One pass: fetch what changed; the bytes fetched. LinkDown if the link fails (what
        was fetched so far stays, and the next pass goes on from there)."""
        try:
            listing = self._listing()
            fetched = sum(self._update(f) for f in listing)
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as err:
            self._etag = ""  # a torn answer may have left the copy short: list again
            raise LinkDown(str(getattr(err, "reason", err))) from None
        finally:
            self._save_state()
        self._drop_vanished({f["path"] for f in listing})
        return fetched

    def _listing(self) -> list[dict]:
        """The served files: the one held when nothing changed (304), else the new one."""
        headers = {"Accept-Encoding": "gzip", "If-None-Match": self._etag}
        try:
            with self._ask("/api/files", headers=headers) as answer:
                body = answer.read()
                gzipped = answer.headers.get("Content-Encoding") == "gzip"
                etag = answer.headers.get("ETag", "")
        except urllib.error.HTTPError as err:
            if err.code != 304:
                raise
            return self._files
        self.bytes_in += len(body)
        self.bytes_by["listing"] += len(body)
        self._files = json.loads(gzip.decompress(body) if gzipped else body)["files"]
        self._etag = etag
        return self._files

    def _update(self, served: dict) -> int:
        path, size = served["path"], served["size"]
        parts = path.split("/")
        if path.startswith("/") or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            return 0  # never outside the mirror, nor over its own notes (a server gone wrong)
        now = [served["ino"], size, served["mtime"]]
        held = self._held.get(path)
        local = self.folder / path
        if held == now and local.exists():
            return 0
        if not self.wants(path):
            self.deferred.add(path)
            return 0
        self.deferred.discard(path)
        if size > self.max_bytes:
            if path not in self._left_out:
                self._left_out.add(path)
                self._note(f"mirror: {path} left out ({size / 1e6:.0f} MB, over the cap)")
            return 0
        here = local.stat().st_size if local.exists() else -1
        if (
            held is not None
            and appended_only(path)
            and held[0] == now[0]
            and held[1] == here
            and size > here
        ):
            return self._fetch(path, start=here)
        if size > BULK_BYTES and self._thread is not None:
            if path not in self._pending:
                self._pending.add(path)
                self._bulk.put(path)
            return 0
        return self._fetch(path)

    def _fetch(self, path: str, start: int = 0) -> int:
        """The file from byte `start` on: appended to the copy, or (0) written whole."""
        headers = {"Range": f"bytes={start}-"} if start else {}
        try:
            with self._ask("/files/" + quote(path), headers=headers) as answer:
                data = answer.read()
                ino, mtime = int(answer.headers["X-Ino"]), int(answer.headers["X-Mtime"])
        except urllib.error.HTTPError as err:
            if err.code not in (404, 416):
                raise
            with self._lock:
                self._held.pop(path, None)  # shrunk since the listing: whole in the next pass
            if err.code == 404:  # removed since the listing
                (self.folder / path).unlink(missing_ok=True)
            return 0
        local = self.folder / path
        local.parent.mkdir(parents=True, exist_ok=True)
        if start:
            with open(local, "ab") as f:
                f.write(data)
        else:
            atomic_write_bytes(local, data)
        with self._lock:
            self._held[path] = [ino, start + len(data), mtime]
            self.bytes_in += len(data)
            self.bytes_by[kind_of(path)] += len(data)
        return len(data)

    def _drop_vanished(self, served: set[str]) -> None:
        with self._lock:
            for path in [p for p in self._held if p not in served and p not in self._pending]:
                (self.folder / path).unlink(missing_ok=True)
                del self._held[path]
        self.deferred &= served

    def _load_state(self) -> None:
        try:
            self._held = json.loads((self.folder / STATE).read_text())
        except (OSError, ValueError):
            self._held = {}  # a first copy, or a damaged note: every file is fetched whole

    def _save_state(self) -> None:
        with self._saving:  # the passes and the bulk thread: one writer of the note at a time
            with self._lock:
                held = {path: list(h) for path, h in self._held.items()}
            if held != self._saved:  # most passes change nothing: no write, no fsync
                atomic_write_json(self.folder / STATE, held)
                self._saved = held

    # the thread --------------------------------------------------------------------------------
    def start(self, note: Callable[[str], None]) -> None:
        """Keep the copy up to date in a thread; `note` takes a line when the link goes down
        and when it is back."""
        self._note = note
        for text in self._early:
            note(text)
        self._thread = threading.Thread(target=self._follow, name="mirror", daemon=True)
        self._thread.start()
        self._bulk_thread = threading.Thread(target=self._fetch_bulk, name="bulk", daemon=True)
        self._bulk_thread.start()

    def first_copy(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._load_state()
        try:
            self.sync()
        except LinkDown as err:
            raise UserError(f"{self.base}: the link broke during the first copy ({err})") from None

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=TIMEOUT_S + 5)
            self._bulk_thread.join(timeout=TIMEOUT_S + 5)

    def _follow(self) -> None:
        while not self._stopped.is_set():
            try:
                fetched = self.sync()
                if self.down_since is not None:
                    gap = time.monotonic() - self.down_since
                    self.down_since = None
                    self._note(f"link back after {gap:.0f} s: caught up ({fetched:,} bytes)")
            except LinkDown as err:
                self.reason = str(err)
                if self.down_since is None:
                    self.down_since = time.monotonic()
                    self._note(
                        f"link down ({err}): showing what arrived; it catches up when the link "
                        "is back"
                    )
            self._wake.wait(POLL_S if self.down_since is None else RETRY_S)
            self._wake.clear()

    def _fetch_bulk(self) -> None:
        """The large files the passes queued, one at a time; a failed one is listed, and
        queued, again by a later pass."""
        while not self._stopped.is_set():
            try:
                path = self._bulk.get(timeout=0.25)
            except queue.Empty:
                continue
            try:
                self._fetch(path)
                self._save_state()
            except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError):
                pass  # the link is down: the passes say so
            finally:
                self._pending.discard(path)

    def state(self) -> str:
        """ "" while the link is up; else how long it has been down."""
        if self.down_since is None:
            return ""
        return f"link down {time.monotonic() - self.down_since:.0f} s"
