"""What travels between a run server (server.py) and a connected window (mirror.py,
connected.py): the token, the address, and the run's commands as JSON.

A command is sent as its class name and fields; the server rebuilds it only from the commands
that change the run (`REMOTE_COMMANDS`), each field checked for its type here and its value by
the run itself (handle.py), so a value out of range is refused exactly as the window's own is.
"""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import asdict, fields
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from agent.errors import UserError
from agent.knobs import KnobValue
from workers.run.commands import (
    AddWorker,
    Checkpoint,
    Command,
    Pause,
    Promote,
    RemoveWorker,
    RestartWorker,
    Resume,
    SetKnobs,
    StartRace,
    Stop,
)
from workers.rundir.lanes import Lane

PROTOCOL = 1
SERVER_NAME = "tdmpc2-live run server"
TOKEN_FILE = ".serve-token"  # in the run directory, owner-only, never served (a dot file)
# What a connected window asks of the run; the rest (the viewport, montages) it does itself.
REMOTE_COMMANDS: tuple[type[Command], ...] = (
    SetKnobs,
    Pause,
    Resume,
    Checkpoint,
    Stop,
    AddWorker,
    RemoveWorker,
    RestartWorker,
    StartRace,
    Promote,
)


def run_token(run_path: Path) -> str:
    """The run's token: made once (secrets.token_urlsafe) and kept owner-only beside the run,
    so a restarted server takes the windows that were connected back."""
    path = Path(run_path) / TOKEN_FILE
    try:
        token = path.read_text().strip()
        if len(token) >= 32:
            return token
    except OSError:
        pass
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def token_matches(given: str | None, token: str) -> bool:
    """Constant-time comparison (hmac.compare_digest), on every request."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def split_url(url: str) -> tuple[str, str]:
    """("http://host:port", token) from what the server printed: http://host:port/?token=T."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise UserError(f"{url}: not a run server's address (http://HOST:PORT/?token=TOKEN)")
    try:
        port = parts.port or 80
    except ValueError:
        raise UserError(f"{url}: the port is not a number") from None
    token = parse_qs(parts.query).get("token", [""])[0]
    if not token:
        raise UserError(f"{url}: no token (the server printed the address with ?token=...)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"http://{host}:{port}", token


def encode_command(command: Command) -> dict:
    if not isinstance(command, REMOTE_COMMANDS):
        raise TypeError(f"{type(command).__name__} is not sent to a run server")
    return {"command": type(command).__name__, "fields": asdict(command)}


def decode_command(data: object) -> Command:
    """The command a connected window sent; ValueError names what is wrong with it."""
    if not isinstance(data, dict) or not isinstance(data.get("fields"), dict):
        raise ValueError("a command is {'command': NAME, 'fields': {...}}")
    kinds = {kind.__name__: kind for kind in REMOTE_COMMANDS}
    kind = kinds.get(data.get("command"))  # type: ignore[arg-type]
    if kind is None:
        raise ValueError(f"not a command a run server takes: {data.get('command')!r}")
    given, names = data["fields"], {f.name for f in fields(kind)}
    unknown = set(given) - names
    if unknown:
        raise ValueError(f"{kind.__name__} has no field {sorted(unknown)[0]!r}")
    values = {}
    for name, value in given.items():
        if name == "changes":
            values[name] = _changes(value)
        elif name == "lanes":
            values[name] = _lanes(value)
        elif name == "weights":
            values[name] = _typed(name, value, bool)
        elif name in ("lane", "worker") and value is None:
            values[name] = None
        elif name == "minutes":  # a race's length: any number (RaceControl refuses <= 0)
            if type(value) not in (int, float):
                raise ValueError(f"minutes must be a number, got {value!r}")
            values[name] = float(value)
        else:
            values[name] = _typed(name, value, int)
    return kind(**values)


def _typed(name: str, value: object, kind: type) -> object:
    # bool is an int to Python; a count given as true is still wrong.
    if type(value) is not kind:
        raise ValueError(f"{name} must be {kind.__name__}, got {value!r}")
    return value


def _changes(value: object) -> dict[str, KnobValue]:
    if not isinstance(value, dict):
        raise ValueError("changes must be {knob: value}")
    for key, v in value.items():
        if not isinstance(key, str) or type(v) not in (int, float, bool):
            raise ValueError(f"knob {key!r}: {v!r} is not a number")
    return dict(value)


def _lanes(value: object) -> tuple[Lane, ...]:
    if not isinstance(value, list) or not all(isinstance(lane, dict) for lane in value):
        raise ValueError("lanes must be a list of {changes, size, merges}")
    lanes = []
    for lane in value:
        if set(lane) - {"changes", "size", "merges"}:
            raise ValueError(f"a lane has only changes, size and merges: {sorted(lane)}")
        size = lane.get("size")
        lanes.append(
            Lane(
                changes=_changes(lane.get("changes", {})),
                size=None if size is None else _typed("size", size, int),
                merges=_typed("merges", lane.get("merges", True), bool),
            )
        )
    return tuple(lanes)
