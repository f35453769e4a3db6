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

Nothing the server says is taken on trust: each listed path is checked part by part (no dot
file, no `..`, nothing outside the copy), each body is read up to the bytes asked for (the
listed range, never more), the listing's unpacking is bounded, the copy holds at most
MAX_FILES files and MAX_TOTAL bytes, and an appended piece is kept only when the server read
it from the file (inode) the copy holds. A broken answer is a line for the status bar, and
the pass goes on. Over 300 lines because the passes, the bulk fetches and the note of what is
held share one state under one lock, and the link's two calls (hello, send) reach that state.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from agent.errors import UserError, printable
from workers.remote.link import BrokenAnswer, Link, LinkDown, gunzip
from workers.remote.served import served_parts
from workers.remote.wire import PROTOCOL, SERVER_NAME, encode_command
from workers.run.commands import Command, Outcome
from workers.rundir.directory import atomic_write_bytes, atomic_write_json

STATE = ".mirror.json"  # what the copy holds of each file: [inode, size, mtime] on the server
POLL_S = 0.5  # between passes while the link is up
RETRY_S = 1.0  # between tries while it is down
MAX_BYTES = 64 << 20  # one file
MAX_TOTAL = 8 << 30  # the whole copy: a rogue server cannot fill the laptop's disk
MAX_FILES = 50_000  # a long run's album and records are a few thousand
MAX_LISTING = 16 << 20  # the listing, unpacked (50,000 files are ~6 MB of JSON)
MAX_FOLDERS = 4096  # a run's folders: album/worker-K, tb/..., merge/lane-L: a few hundred
MAX_ANSWER = 64 * 1024  # hello, a command's answer, an error
ETAG = re.compile(r'"?[!-~]{1,100}"?')
NOTE_KEYS = ("the listing", "a pass")  # what a broken note may name besides a file
# A whole file this large (merged weights: 32 MB at 5M) is fetched by a thread of its own, so
# that the records behind it are not held up for its transfer over a slow link.
BULK_BYTES = 1 << 20
APPEND_SUFFIXES = (".jsonl", ".csv")


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
        self.max_total, self.max_files = MAX_TOTAL, MAX_FILES
        self.link = Link(base, token)
        self._held: dict[str, list[int]] = {}
        self._lock = threading.Lock()  # _held: the passes and the bulk fetches
        self._saving = threading.Lock()
        self._bulk: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._pending: set[str] = set()  # large files queued for the bulk thread
        self._reserved: dict[str, int] = {}  # their listed sizes, counted in the copy's total
        self._saved: dict[str, list[int]] | None = None  # as .mirror.json holds it
        self._left_out: set[str] = set()
        self._broken: set[str] = set()  # said once each: what the server sent wrong
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
    def hello(self) -> dict:
        """Who answers at the address: UserError when nobody, not a run server, or the token
        is refused (at connect time; later the same faults are a link down)."""
        try:
            answer = self.link.ask("/api/hello", MAX_ANSWER)
        except LinkDown as err:
            raise UserError(f"{self.base}: answers nothing ({printable(err, 200)})") from None
        except BrokenAnswer:
            raise UserError(f"{self.base}: not a run server (its answer is too long)") from None
        if answer.status == 401 and SERVER_NAME in (answer.headers.get("Server") or ""):
            raise UserError(f"{self.base}: the run server refused the token")
        if answer.status != 200:
            raise UserError(f"{self.base}: not a run server (HTTP {answer.status})")
        try:
            info = json.loads(answer.body)
        except (ValueError, RecursionError):
            raise UserError(f"{self.base}: not a run server (its answer is not JSON)") from None
        if not isinstance(info, dict) or info.get("server") != SERVER_NAME:
            raise UserError(f"{self.base}: not a run server")
        if info.get("protocol") != PROTOCOL:
            raise UserError(
                f"{self.base}: a run server of another version (protocol "
                f"{printable(info.get('protocol'), 20)}, this window speaks {PROTOCOL}): use "
                "the same version on both machines"
            )
        if not isinstance(info.get("run"), str) or type(info.get("read_only")) is not bool:
            raise UserError(f"{self.base}: not a run server (its hello lacks the run's name)")
        return info

    def send(self, command: Command) -> Outcome:
        """Carry out `command` on the served run: its Outcome, or UserError with the run's
        refusal, or with why the link did not carry it (then nothing was done)."""
        body = json.dumps(encode_command(command)).encode()
        try:
            answer = self.link.ask(
                "/api/command", MAX_ANSWER, body, {"Content-Type": "application/json"}
            )
        except LinkDown as err:
            if not err.sent:
                raise UserError(
                    f"the link to {self.base} is down ({printable(err, 200)}): not sent; try "
                    "again when it is back"
                ) from None
            raise UserError(
                f"no answer from {self.base} ({printable(err, 200)}): the command may have "
                "been carried out; the knob panel and the records will show"
            ) from None
        except BrokenAnswer as err:
            raise UserError(f"{self.base} answered wrongly ({err})") from None
        try:
            reply = json.loads(answer.body)
        except (ValueError, RecursionError):
            reply = None
        if not isinstance(reply, dict):
            raise UserError(f"{self.base} answered HTTP {answer.status}, not a command's answer")
        if answer.status != 200:
            raise UserError(printable(reply.get("error") or f"HTTP {answer.status}", 300))
        self.wake()  # what the command changed comes back sooner
        notices = reply.get("notices", ())
        value = reply.get("value")
        return Outcome(
            tuple(printable(n, 300) for n in notices if isinstance(n, str))
            if isinstance(notices, list)
            else (),
            value if type(value) is int else None,
        )

    # the copy --------------------------------------------------------------------------------
    def sync(self) -> int:
        """One pass: fetch what changed; the bytes fetched. LinkDown if the link fails (what
        was fetched so far stays, and the next pass goes on from there)."""
        try:
            listing = self._listing()
            fetched = 0
            for served in listing:
                try:
                    fetched += self._update(served)
                except BrokenAnswer as err:
                    self._say_broken(served["path"], str(err))
                except OSError as err:  # this machine's: a path the listing makes impossible
                    self._say_broken(served["path"], f"not written here: {err.strerror or err}")
        except (LinkDown, OSError) as err:
            self._etag = ""  # a torn answer may have left the copy short: list again
            raise LinkDown(str(err)) from None
        except BrokenAnswer as err:
            self._etag = ""
            self._say_broken("the listing", str(err))
            return 0
        finally:
            self._save_state()
        self._drop_vanished({f["path"] for f in listing})
        return fetched

    def _say_broken(self, what: str, why: str) -> None:
        if what not in self._broken:
            self._broken.add(what)
            self._note(
                f"mirror: the server's answer for {printable(what, 200)} is broken "
                f"({printable(why, 200)}): skipped"
            )

    def _listing(self) -> list[dict]:
        """The served files: the one held when nothing changed (304), else the new one, each
        entry checked (BrokenAnswer: not a listing)."""
        headers = {"Accept-Encoding": "gzip", "If-None-Match": self._etag}
        answer = self.link.ask("/api/files", MAX_LISTING, headers=headers)
        if answer.status == 304:
            return self._files
        if answer.status != 200:
            raise LinkDown(f"the listing: HTTP {answer.status}")
        self.bytes_in += len(answer.body)
        self.bytes_by["listing"] += len(answer.body)
        gzipped = answer.headers.get("Content-Encoding") == "gzip"
        body = gunzip(answer.body, MAX_LISTING) if gzipped else answer.body
        # Counted before parsing: megabytes of "{}," would be millions of Python objects.
        if body.count(b"{") > self.max_files + 1 or body.count(b",") > 5 * self.max_files:
            raise BrokenAnswer(f"a listing of more than {self.max_files:,} files")
        try:
            files = json.loads(body)["files"]
        except (ValueError, RecursionError, KeyError, TypeError):
            raise BrokenAnswer("not a listing") from None
        if not isinstance(files, list) or len(files) > self.max_files:
            raise BrokenAnswer(f"a listing of more than {self.max_files:,} files, or none")
        files = [f for f in files if listed_entry(f)]
        if len({f["path"].rpartition("/")[0] for f in files}) > MAX_FOLDERS:
            raise BrokenAnswer(f"a listing of more than {MAX_FOLDERS:,} folders")
        self._files = files
        etag = answer.headers.get("ETag", "")
        self._etag = etag if ETAG.fullmatch(etag) else ""  # sent back: no line break in it
        listed = {f["path"] for f in files}
        self._left_out &= listed  # notes said once per file the listing still has
        self._broken = {p for p in self._broken if p in listed or p in NOTE_KEYS}
        return self._files

    def _update(self, served: dict) -> int:
        path, size = served["path"], served["size"]
        now = [served["ino"], size, served["mtime"]]
        held = self._held.get(path)
        local = self.folder / path
        if held == now and local.exists():
            return 0
        if not self.wants(path):
            self.deferred.add(path)
            return 0
        self.deferred.discard(path)
        here = local.stat().st_size if local.is_file() else -1
        if not self._fits(path, size):
            return 0
        if (
            held is not None
            and appended_only(path)
            and held[0] == now[0]
            and held[1] == here
            and size > here
        ):
            return self._fetch(path, now, start=here)
        if size > BULK_BYTES and self._thread is not None:
            if path not in self._pending:
                with self._lock:
                    self._reserved[path] = size  # counted in the copy's total until fetched
                self._pending.add(path)
                self._bulk.put(path)
            return 0
        return self._fetch(path, now)

    def _fits(self, path: str, size: int) -> bool:
        """Whether `path` at `size` keeps the copy within its caps (else a note, once)."""
        with self._lock:
            others = sum(h[1] for p, h in self._held.items() if p != path)
            others += sum(s for p, s in self._reserved.items() if p != path)
        if size <= self.max_bytes and others + size <= self.max_total:
            return True
        if path not in self._left_out:
            self._left_out.add(path)
            cap = "its cap" if size > self.max_bytes else "the copy's cap"
            self._note(f"mirror: {path} left out ({size / 1e6:.0f} MB, over {cap})")
        return False

    def _fetch(self, path: str, listed: list[int], start: int = 0) -> int:
        """Bytes `start` to the listed size of the file: appended to the copy, or (0) written
        whole; only what the server read from the listed file (its inode) is kept."""
        ino, size = listed[0], listed[1]
        if not self._fits(path, size):  # checked again: the bulk thread fetches later
            return 0
        if size == 0:
            data, answer = b"", None
        else:
            wanted = {"Range": f"bytes={start}-{size - 1}"}
            answer = self.link.ask("/files/" + quote(path), size - start, headers=wanted)
            if answer.status == 503:  # every transfer slot busy: the next pass asks again
                return 0
            if answer.status in (404, 416):  # removed or shrunk since the listing
                self._forget(path)
                return 0
            if answer.status != 206:
                raise BrokenAnswer(f"HTTP {answer.status} to a range")
            data = answer.body
            if answer.header_int("X-Ino") != ino:  # replaced since the listing: never spliced
                self._forget(path)
                return 0
            first = (answer.headers.get("Content-Range") or "").removeprefix("bytes ")
            if not first.startswith(f"{start}-"):
                raise BrokenAnswer("a range other than the one asked for")
        mtime = answer.header_int("X-Mtime") if answer is not None else listed[2]
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

    def _forget(self, path: str) -> None:
        """The copy of `path` gone with its note (fetched whole next pass): a local file is
        never left behind uncounted in the copy's total."""
        with self._lock:
            self._held.pop(path, None)
        (self.folder / path).unlink(missing_ok=True)

    def _drop_vanished(self, served: set[str]) -> None:
        with self._lock:
            for path in [p for p in self._held if p not in served and p not in self._pending]:
                (self.folder / path).unlink(missing_ok=True)
                del self._held[path]
                self._drop_empty_folders(path)
        self.deferred &= served

    def _drop_empty_folders(self, path: str) -> None:
        """The folders of `path` that its removal left empty (a server's listing of ever new
        folders must not fill the disk with empty ones)."""
        folder = (self.folder / path).parent
        while folder != self.folder and folder.is_relative_to(self.folder):
            try:
                folder.rmdir()
            except OSError:
                return  # not empty: another file of the copy is in it
            folder = folder.parent

    def _load_state(self) -> None:
        try:
            held = json.loads((self.folder / STATE).read_text())
            self._held = {
                path: h
                for path, h in held.items()
                if served_parts(path) is not None
                and isinstance(h, list)
                and len(h) == 3
                and all(type(x) is int for x in h)
            }
        except (OSError, ValueError, AttributeError):
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
            self._thread.join(timeout=self.link.timeout + 5)
            self._bulk_thread.join(timeout=self.link.timeout + 5)

    def _follow(self) -> None:
        while not self._stopped.is_set():
            try:
                fetched = self.sync()
                if self.down_since is not None:
                    gap = time.monotonic() - self.down_since
                    self.down_since = None
                    self._note(f"link back after {gap:.0f} s: caught up ({fetched:,} bytes)")
            except LinkDown as err:
                self.reason = printable(err, 200)
                if self.down_since is None:
                    self.down_since = time.monotonic()
                    self._note(
                        f"link down ({self.reason}): showing what arrived; it catches up when "
                        "the link is back"
                    )
            except Exception as err:  # never a dead thread: the next pass tries again
                self._say_broken("a pass", f"{type(err).__name__}: {err}")
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
                listed = next((f for f in self._files if f["path"] == path), None)
                if listed is not None:
                    self._fetch(path, [listed["ino"], listed["size"], listed["mtime"]])
                    self._save_state()
            except BrokenAnswer as err:
                self._say_broken(path, str(err))
            except Exception:
                pass  # the link is down (the passes say so), or the file changed: listed again
            finally:
                self._pending.discard(path)
                with self._lock:
                    self._reserved.pop(path, None)

    def state(self) -> str:
        """ "" while the link is up; else how long it has been down."""
        if self.down_since is None:
            return ""
        return f"link down {time.monotonic() - self.down_since:.0f} s"


def listed_entry(entry: object) -> bool:
    """Whether a listing's entry is one the copy may hold: a path of served parts (nothing
    outside the copy, no dot file: never over the copy's own notes) and whole numbers."""
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("path"), str)
        and served_parts(entry["path"]) is not None
        and all(
            type(entry.get(k)) is int and 0 <= entry[k] < 2**63 for k in ("size", "ino", "mtime")
        )
    )
