"""A served run's tokens: one that watches (reads the run's files) and one that also steers
(sends commands), kept owner-only in the run directory's `.serve-token` (a dot file: never
served), made with `secrets.token_urlsafe` and compared in constant time.

The file is created without following a link (a new file beside it, renamed over it) and read
without following one; a file that another user owns or that others may read is refused, as
OpenSSH refuses a private key others can read. `--new-token` makes new ones: the old stop
working at once, on a server that is running too (it reads the file again when it changes).
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from agent.errors import UserError

TOKEN_FILE = ".serve-token"
WATCH, STEER = "watch", "steer"  # a token's scope: steering includes watching
MIN_LENGTH = 32


@dataclass(frozen=True)
class Tokens:
    watch: str
    steer: str

    def scope_of(self, given: str | None) -> str | None:
        """STEER, WATCH or None for a token given with a request (both compared in constant
        time, whichever matches)."""
        if not given:
            return None
        steers = hmac.compare_digest(given.encode(), self.steer.encode())
        watches = hmac.compare_digest(given.encode(), self.watch.encode())
        return STEER if steers else WATCH if watches else None


def new_tokens(run_path: Path) -> Tokens:
    """New tokens for the run, written over the old (which stop working)."""
    tokens = Tokens(watch=secrets.token_urlsafe(32), steer=secrets.token_urlsafe(32))
    path = Path(run_path) / TOKEN_FILE
    spare = path.with_name(f"{TOKEN_FILE}.{secrets.token_hex(6)}")
    try:
        # O_EXCL | O_NOFOLLOW: a link planted at the spare name is never written through.
        fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({WATCH: tokens.watch, STEER: tokens.steer}, f)
            f.write("\n")
        os.replace(spare, path)  # replaces a link at `path` itself, never its target
    except OSError as err:
        spare.unlink(missing_ok=True)
        raise UserError(
            f"cannot write the token file {path} ({err.strerror or err}): serve a run "
            "directory you can write"
        ) from None
    return tokens


def read_tokens(run_path: Path) -> Tokens | None:
    """The run's tokens, or None when it has none yet (or an unreadable old form). UserError
    when the file is a link, not a regular file, another user's, or readable by others."""
    path = Path(run_path) / TOKEN_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise UserError(
            f"{path}: not opened ({err.strerror or err}; a symbolic link is never followed): "
            "remove it and serve again"
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UserError(f"{path} is not a regular file: remove it and serve again")
    with os.fdopen(fd, "rb") as f:
        if st.st_uid != os.geteuid():
            raise UserError(f"{path} belongs to another user: remove it and serve again")
        if st.st_mode & 0o077:
            raise UserError(
                f"{path} may be read by others (mode {stat.S_IMODE(st.st_mode):o}): "
                "its tokens may be known; serve with --new-token"
            )
        data = f.read(4096)
    try:
        held = json.loads(data)
        tokens = Tokens(watch=held[WATCH], steer=held[STEER])
    except (ValueError, KeyError, TypeError):
        return None  # the one-token form of earlier versions, or damage: new ones are made
    if not all(isinstance(t, str) and len(t) >= MIN_LENGTH for t in (tokens.watch, tokens.steer)):
        return None
    return tokens


def run_tokens(run_path: Path, renew: bool = False) -> Tokens:
    """The run's tokens: kept across servers (a restarted server takes its windows back), made
    when there are none or `renew`."""
    held = None if renew else read_tokens(run_path)
    return held if held is not None else new_tokens(run_path)


def file_identity(run_path: Path) -> tuple[int, int] | None:
    """The token file's (inode, mtime): a server reads the tokens again when it changes."""
    try:
        st = os.lstat(Path(run_path) / TOKEN_FILE)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns
