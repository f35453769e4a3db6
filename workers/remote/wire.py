"""What travels between a run server (server.py) and a connected window (mirror.py,
connected.py): the token, the address, and the run's commands as JSON.

A command is sent as its class name and fields; the server rebuilds it only from the commands
that change the run (`REMOTE_COMMANDS`), each field checked for its type here and its value by
the run itself (handle.py), so a value out of range is refused exactly as the window's own is.
"""

from __future__ import annotations

import os
from dataclasses import asdict, fields
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from agent.errors import UserError, printable
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

PROTOCOL = 2  # 2: tokens with scopes (tokens.py), HTTP/1.0, commands checked as the window's
SERVER_NAME = "tdmpc2-live run server"
TOKEN_ENV = "TDMPC2_LIVE_TOKEN"  # a token given apart from the address (not in ps, nor history)
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


def split_url(url: str) -> tuple[str, str]:
    """("http://host:port", token) from the address the server printed, http://host:port,
    or with the token in it (?token=T: "" when there is none). The token never appears in an
    error message."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    shown = parts._replace(query="", fragment="").geturl()
    if parts.scheme != "http" or not parts.hostname:
        raise UserError(f"{printable(shown)}: not a run server's address (http://HOST:PORT)")
    try:
        port = parts.port or 80
    except ValueError:
        raise UserError(f"{printable(shown)}: the port is not a number (1-65535)") from None
    token = parse_qs(parts.query).get("token", [""])[0]
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"http://{host}:{port}", token


def token_from(url_token: str, token_file: str | None = None, ask: bool = False) -> str:
    """The token to connect with: from the address, else --token-file, else $TDMPC2_LIVE_TOKEN,
    else (`ask`: a terminal) typed at a prompt that does not echo it. UserError: none."""
    if url_token:
        return url_token
    if token_file:
        try:
            return Path(token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as err:
            raise UserError(f"--token-file {token_file}: not read ({err})") from None
    if os.environ.get(TOKEN_ENV, "").strip():
        return os.environ[TOKEN_ENV].strip()
    if ask:
        import getpass

        token = getpass.getpass("the run server's token (it printed it): ").strip()
        if token:
            return token
    raise UserError(
        f"no token: paste it when asked, or give it as {TOKEN_ENV}=... or --token-file FILE "
        "(the server printed it)"
    )


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
