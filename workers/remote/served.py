"""What a run server serves: the run directory's own files, nothing else. Dot files (the
token, atomic writes in progress), locks, symbolic links and any path that leaves the run
directory are neither listed nor opened."""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath


def served_files(root: Path) -> list[dict]:
    """Every file a window may fetch: path (relative, /), size, inode, mtime in ns."""
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.startswith(".") or name.endswith(".lock"):
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
    """A file descriptor of run-directory file `rel` (`root` resolved), or None: not one of
    the run's files."""
    parts = PurePosixPath(rel).parts
    if not parts or rel.startswith("/") or "\\" in rel:
        return None
    if any(p in ("..", ".") or p.startswith(".") for p in parts) or rel.endswith(".lock"):
        return None
    path = root.joinpath(*parts)
    try:
        if not path.resolve().is_relative_to(root) or path.is_symlink():
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd
