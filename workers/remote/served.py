"""What a run server serves: the run directory's own regular files, nothing else. Dot files (the
tokens, atomic writes in progress), locks, symbolic links, FIFOs and devices, and any path
that leaves the run directory are neither listed nor opened.

A path is opened one part at a time beneath the run directory's descriptor, no part a link
(O_NOFOLLOW on each), so a folder swapped for a link while a request is served leads nowhere;
the file is checked to be a regular one before it is opened (a FIFO would pin the thread that
opened it) and again after (it may have been swapped in between).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_PATH = 255  # a run's paths are a few dozen characters
MAX_DEPTH = 6  # and a few folders deep (tb/lane-L/worker-K/events..., rank-R/album/...)


def served_name(part: str) -> bool:
    """Whether one part of a path may be served: not empty, no dot file (nor . or ..), no
    lock, no control character, no backslash."""
    return (
        bool(part)
        and not part.startswith(".")
        and not part.endswith(".lock")
        and "\\" not in part
        and all(ch.isprintable() for ch in part)
    )


def served_parts(rel: str) -> list[str] | None:
    """The parts of `rel` (relative, '/'), or None when any part may not be served (a
    trailing slash is an empty part)."""
    if not rel or len(rel) > MAX_PATH:
        return None
    parts = rel.split("/")
    return parts if len(parts) <= MAX_DEPTH and all(served_name(p) for p in parts) else None


def served_files(root: Path) -> list[dict]:
    """Every file a window may fetch: path (relative, /), size, inode, mtime in ns."""
    files = []
    for folder, dirs, names in os.walk(root):  # links to folders are not followed
        dirs[:] = sorted(d for d in dirs if served_name(d))
        for name in sorted(names):
            if not served_name(name):
                continue
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue  # replaced or removed while listing: the next listing has it
            if stat.S_ISREG(st.st_mode):
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                files.append(
                    {"path": rel, "size": st.st_size, "ino": st.st_ino, "mtime": st.st_mtime_ns}
                )
    return files


def open_served(root: Path, rel: str) -> int | None:
    """A file descriptor of run-directory file `rel`, or None: not one of the run's files."""
    parts = served_parts(rel)
    if parts is None:
        return None
    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=folder)
            os.close(folder)
            folder = inner
        if not stat.S_ISREG(os.stat(parts[-1], dir_fd=folder, follow_symlinks=False).st_mode):
            return None
        # O_NONBLOCK: a file swapped for a FIFO after the check does not block the open.
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | nofollow, dir_fd=folder)
    except OSError:
        return None
    finally:
        os.close(folder)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd
