"""What a mirror of a run directory must hold (workers/remote/mirror.py): every file but dot
files (the token, the mirror's own notes, atomic writes in progress) and locks."""

from pathlib import Path


def tree(root: Path) -> dict[str, bytes]:
    """Each such file's bytes, by its path relative to `root` (links are never served)."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        hidden = any(p.startswith(".") for p in rel.split("/")) or rel.endswith(".lock")
        if path.is_file() and not path.is_symlink() and not hidden:
            found[rel] = path.read_bytes()
    return found
