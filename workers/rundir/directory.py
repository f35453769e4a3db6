"""The run directory: config, append-only metrics (one JSON object per line), weights.

Every file but the metrics log is written atomically (temp file + rename), so a crash leaves
either the old or the new version. Metrics lines are written with one O_APPEND write each, so a
line is never half-written by a crash of the writer.

Over 300 lines because writing and reading every file of the folder safely is one concern here.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol, TypeVar

import torch
from filelock import FileLock

from agent.errors import UserError, WeightsError
from workers.rundir.lines import damaged_lines
from workers.rundir.paths import CONFIG, METRICS, WEIGHTS
from workers.rundir.records import Record, parse_records

T = TypeVar("T")
R = TypeVar("R", bound=Record)


# How long a lock of one file read or written waits: a holder keeps it for one load or save,
# so a wait this long means a stuck holder. Not the merge timeout (how long a round waits for
# the others' weights, which may be far shorter or longer).
LOCK_TIMEOUT_S = 30.0


class DirLock:
    """A file lock (filelock.FileLock) that never creates its folder: FileLock makes missing
    parents, which would bring back a run directory deleted or moved away mid-run."""

    def __init__(self, path: str | Path, timeout: float):
        self.path = Path(path)
        self._lock = FileLock(str(self.path), timeout=timeout)

    def __enter__(self) -> DirLock:
        if not self.path.parent.is_dir():
            raise FileNotFoundError(errno.ENOENT, "the folder is gone", str(self.path.parent))
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


# Write errors of a full or failing disk: a worker waits for space (RunDir.guarded) rather than
# crash, and every file written before stays whole.
DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})


def human_size(n: float) -> str:
    """Bytes as people read them: 812 bytes, 117.2 KB, 3.4 GB ("unknown" when negative)."""
    if n < 0:
        return "unknown"
    for unit in ("bytes", "KB", "MB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def atomic_write_bytes(path: Path, data: bytes, keep_previous: Path | None = None) -> None:
    """Write a temporary file, fsync, rename over `path`; with `keep_previous`, the old `path`
    is first renamed there, so a whole version exists at every moment."""
    atomic_write(path, lambda f: f.write(data), keep_previous)


def atomic_write(
    path: Path,
    write: Callable[[BinaryIO], object],
    keep_previous: Path | None = None,
    exclusive: bool = False,
) -> None:
    """atomic_write_bytes of what `write(file)` writes into the temporary file (a checkpoint
    streamed there by torch.save: never whole in memory as bytes). `exclusive`: written by
    one process only, the first to claim it (FileExistsError for every other: its stays)."""
    if exclusive and keep_previous is not None:
        raise ValueError("an exclusive write keeps no previous version")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if exclusive:
            _claim(path)
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous is not None and path.exists():
            os.replace(path, keep_previous)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a failed write leaves no temporary file behind
            tmp.unlink()
        raise


def _claim(path: Path) -> None:
    """Make `path` this process's to write: a claim file created exclusively (O_EXCL works
    where hard links do not: vfat, SMB, FUSE) holding its pid. FileExistsError when another
    process claimed it; a claim of this process's (a write tried again) stays its own."""
    claim = path.with_name(f".{path.name}.claim")
    mine = str(os.getpid()).encode()
    try:
        fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if claim.read_bytes() != mine:
            raise
        return
    with os.fdopen(fd, "wb") as f:
        f.write(mine)


def atomic_write_json(path: Path, obj: object) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def save_state(path: Path, state: dict, exclusive: bool = False) -> None:
    """torch.save a state dict atomically (`exclusive`: as atomic_write)."""
    atomic_write(Path(path), lambda f: torch.save(state, f), exclusive=exclusive)


def previous_path(path: str | Path) -> Path:
    """Where save_checkpoint keeps the previous complete version: NAME.prev.pt."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def state_size(state: object, top: bool = True) -> int:
    """About the bytes torch.save writes for `state`, no fewer: its tensors' with their zip
    records (what a full-disk wait asks room for), and a little for the rest."""
    if isinstance(state, torch.Tensor):
        size = state.nbytes + 256  # a record's header, alignment and directory entry
    elif isinstance(state, dict):
        size = 64 + sum(state_size(k, False) + state_size(v, False) for k, v in state.items())
    elif isinstance(state, (list, tuple)):
        size = 64 + sum(state_size(v, False) for v in state)
    else:
        size = 64
    return size + 4096 * top  # the pickle's record and the zip's end


def save_checkpoint(path: str | Path, state: dict) -> None:
    """save_state that keeps the previous complete file (previous_path) until the new one is
    complete: a crash or a full disk at any point leaves at least one whole checkpoint.
    Streamed into the file: a pixel buffer is not copied to bytes first."""
    path = Path(path)
    atomic_write(path, lambda f: torch.save(state, f), keep_previous=previous_path(path))


def load_checkpoint(path: str | Path) -> tuple[dict, Path, str]:
    """The newest complete checkpoint: `path`, or if it is missing or damaged (a crash while it
    was copied, a truncated file) the previous one. Returns (state, the file used, why the
    newer one was passed over or ""); WeightsError if neither is readable. Loaded on the CPU
    (random generators' states are only taken from there)."""
    path = Path(path)
    problems = []
    for candidate in (path, previous_path(path)):
        if not candidate.exists():
            problems.append(f"{candidate.name} is missing")
            continue
        try:
            state = load_state(candidate, mapped=True)
        except WeightsError as err:
            problems.append(str(err))
            continue
        return state, candidate, "; ".join(problems)
    raise WeightsError("no complete checkpoint: " + "; ".join(problems))


def stored_whole(file: BinaryIO) -> bool:
    """Whether the open torch file's parts are stored as torch.save stores them: uncompressed,
    each at its own place, together no larger than the file (a zip from elsewhere of compressed
    parts, or of many parts over the same bytes, could unpack to the window's whole memory); a
    file of torch's older, unzipped format is stored whole too. Reads the zip's directory
    only."""
    try:
        if not zipfile.is_zipfile(file):
            return True
        with zipfile.ZipFile(file) as archive:
            parts = archive.infolist()
        size = os.fstat(file.fileno()).st_size
    except (zipfile.BadZipFile, OSError, ValueError):
        return False
    return (
        all(part.compress_type == zipfile.ZIP_STORED for part in parts)
        and len({part.header_offset for part in parts}) == len(parts)
        and sum(part.file_size for part in parts) <= size
    )


def load_state(path: str | Path, device: torch.device | str = "cpu", mapped: bool = False) -> dict:
    """Load a file written by save_state; a missing or corrupt file is a WeightsError. The file
    checked is the file loaded, even if another is renamed over `path` meanwhile (a connected
    copy's next fetch). `mapped` (a checkpoint, with its buffer): a zip is mapped, not read,
    its tensors the file's pages (copied on write), not a second copy of the buffer beside its
    bytes; the price is a bus error if the file is cut short in place while they are in use,
    so only checkpoints, which are read once into the buffer, are mapped."""
    path = Path(path)
    try:
        file = open(path, "rb")
    except OSError as err:
        raise WeightsError(f"cannot read {path}: {err.strerror}") from None
    with file:
        if not stored_whole(file):
            raise WeightsError(
                f"{path} is not a torch file as torch writes one (parts compressed or overlapping)"
            )
        file.seek(0)
        # Mapped through this open file's own descriptor where the system names one (Linux).
        this_file = Path(f"/proc/self/fd/{file.fileno()}")
        mapped = mapped and zipfile.is_zipfile(file) and this_file.exists()
        file.seek(0)
        try:
            source = str(this_file) if mapped else file
            state = torch.load(source, map_location=device, weights_only=True, mmap=mapped)
        except Exception as err:  # torch raises many kinds of errors for a damaged file
            raise WeightsError(
                f"{path} is corrupt or not a torch file ({type(err).__name__})"
            ) from None
    if not isinstance(state, dict):
        raise WeightsError(f"{path} does not hold a state dictionary")
    return state


class Sink(Protocol):
    """Mirrors each logged record elsewhere (TensorBoard, CSV, ...: sinks.py)."""

    def write(self, record: Record) -> None: ...

    def close(self) -> None: ...


class RunDir:
    """A run's folder. create() refuses a folder that already holds a run, so nothing is lost."""

    def __init__(self, path: str | Path, metrics: str = METRICS, weights: str = WEIGHTS):
        self.path = Path(path)
        self.metrics_name, self.weights_name = metrics, weights
        self._metrics_fd: int | None = None
        self.sinks: list[Sink] = []  # get every record after the metrics log has it
        # Called when a write fails for want of space (DISK_ERRORS) with (error, path, bytes):
        # it waits (training pauses), or raises to give up; then the write is tried again.
        self.on_write_error: Callable[[OSError, Path, int], None] | None = None

    def guarded(self, path: str | Path, size: int, write: Callable[[], T]) -> T:
        """`write()`, tried again after on_write_error while it fails for want of space."""
        while True:
            try:
                return write()
            except OSError as err:
                if err.errno not in DISK_ERRORS or self.on_write_error is None:
                    raise
                self.on_write_error(err, Path(path), size)

    @classmethod
    def create(cls, path: str | Path) -> RunDir:
        run = cls(path)
        if (run.path / METRICS).exists() or (run.path / CONFIG).exists():
            raise UserError(
                f"run directory {run.path} already holds a run; choose another --run-dir"
            )
        try:
            run.path.mkdir(parents=True, exist_ok=True)
            probe = run.path / f".write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            raise UserError(f"cannot write to run directory {run.path}: {err.strerror}") from None
        return run

    def write_config(self, config: dict) -> None:
        atomic_write_json(self.path / CONFIG, config)

    def log(self, record: R) -> R:
        """Append one metrics record (a whole line), then hand it to the sinks."""
        line = (json.dumps(record.to_json()) + "\n").encode()
        self.guarded(self.path / self.metrics_name, len(line), lambda: self._append(line))
        for sink in list(self.sinks):
            try:
                sink.write(record)
            except Exception as err:  # a mirror must never stop the run: say so once, drop it
                self.sinks.remove(sink)
                print(
                    f"warning: {type(sink).__name__} stopped ({type(err).__name__}: {err}); "
                    f"the run goes on, {self.metrics_name} has every record",
                    file=sys.stderr,
                )
        return record

    def _append(self, line: bytes) -> None:
        """One whole line at the end of the metrics log, or none: a write cut short (a full
        disk) is taken back, so that every complete line stays and no half one is left."""
        if self._metrics_fd is None:
            flags = os.O_RDWR | os.O_APPEND | os.O_CREAT
            fd = os.open(self.path / self.metrics_name, flags, 0o644)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                # A torn last line (its writer died mid-line): ended here, it stays one damaged
                # line that readers skip, and the next record is whole.
                os.write(fd, b"\n")
            self._metrics_fd = fd
        before = os.fstat(self._metrics_fd).st_size
        try:
            if os.write(self._metrics_fd, line) != len(line):
                raise OSError(errno.ENOSPC, "No space left on device (short write)")
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._metrics_fd, before)
            raise

    def read_metrics(self, kind: type[R] = Record) -> list[R]:
        """All complete metrics records (of one kind); damaged lines (torn, not a record) are
        skipped, with a warning that says how many."""
        path = self.path / self.metrics_name
        if not path.exists():
            return []
        records, skipped = parse_records(path.read_bytes())
        if skipped:
            print(f"warning: {path}: {damaged_lines(skipped)} skipped", file=sys.stderr)
        return [r for r in records if isinstance(r, kind)]

    @property
    def weights_path(self) -> Path:
        return self.path / self.weights_name

    @property
    def metrics_open(self) -> bool:
        """Whether the metrics file was opened (it moves with the directory if that is moved)."""
        return self._metrics_fd is not None

    def close(self) -> None:
        for sink in self.sinks:  # each may be closed twice, and written after (ignored)
            try:
                sink.close()
            except Exception as err:
                print(f"warning: closing {type(sink).__name__}: {err}", file=sys.stderr)
        if self._metrics_fd is not None:
            with contextlib.suppress(OSError):  # a full disk: what is written stays
                os.fsync(self._metrics_fd)
            os.close(self._metrics_fd)
            self._metrics_fd = None
