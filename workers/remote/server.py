"""Serve a run directory to windows on other machines: `--serve [PORT]` beside a headless run,
or `launch.py serve RUN_DIR` for one that is going on or finished.

Plain HTTP/1.0 from the standard library (one request per connection): a window mirrors the
run directory by listing it and fetching what changed, the append-only records by byte offset
(Range), and sends the run's commands as JSON. The door (gate.py) bounds what anyone who
reaches the port can hold; every request must then carry one of the run's tokens (tokens.py):
the watching one reads, the steering one also sends commands. Only the run's own regular files
are served (served.py); a command is checked by the run's own rules (`check_command`, the
window's too) and carried out by a view of the run (AttachedRun, handle.py); `read_only`
takes none. Every malformed request gets a 4xx answer; a failure names no internals.

The server only reads the run's files and never holds a lock the workers take, so training
never waits for a viewer, however many are connected or however slow their link is.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
import threading
from collections import deque
from http import HTTPStatus
from pathlib import Path

from agent.errors import ConfigError, UserError, printable
from workers.remote.gate import Gate, Limits
from workers.remote.handler import Handler
from workers.remote.tokens import STEER, WATCH, Tokens, file_identity, run_tokens
from workers.remote.wire import PROTOCOL, SERVER_NAME, decode_command

BEARER = re.compile(rb"^authorization:[ \t]*bearer[ \t]+([!-~]+)[ \t]*\r?$", re.I | re.M)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RunServer:
    """A bound server for one run directory. Binding happens at construction (a port in use is
    a UserError before anything starts); `start(path)` serves the run in a thread."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, limits: Limits | None = None
    ) -> None:
        if not 0 <= port <= 65535:
            raise UserError(f"a port is 1-65535 (0: any free one), got {port}")
        self.host = host
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            listener = socket.socket(family, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(1024)  # a flood of connects queues here, not in SYN retries
        except OSError as err:
            listener.close()
            if err.errno == errno.EADDRINUSE:
                raise UserError(
                    f"port {port} on {host} is in use: serve on another (--port P, --serve P)"
                ) from None
            raise UserError(f"cannot serve on {host}:{port}: {err.strerror or err}") from None
        self.port = listener.getsockname()[1]
        self.gate = Gate(
            listener, self._answer, self._admits, f"{SERVER_NAME}/{PROTOCOL}", limits or Limits()
        )
        # Listings and files sent per token scope, two handlers always left for hellos and
        # commands: slow readers with one token never starve the other's windows.
        share = max(1, (self.gate.limits.handlers - 2) // 2)
        self.transfers = {scope: threading.BoundedSemaphore(share) for scope in (WATCH, STEER)}
        self.root: Path | None = None
        self.read_only = False
        self._tokens: Tokens | None = None
        self._tokens_from: tuple[int, int] | None = None
        self._commands = threading.Lock()  # one command at a time, as from one window
        self._view = None  # the run as a window sees it, made at the first command
        self.notes: deque[str] = deque(maxlen=1000)
        self._thread: threading.Thread | None = None

    def start(self, run_path: str | Path, read_only: bool = False, new_token: bool = False) -> None:
        """Serve the run at `run_path` in a thread; UserError when its token file cannot be
        made or is unsafe. `new_token`: new tokens, the old ones refused from now on."""
        self.root = Path(run_path).resolve()
        self._tokens = run_tokens(self.root, renew=new_token)
        self._tokens_from = file_identity(self.root)
        self.read_only = read_only
        self._thread = threading.Thread(target=self.gate.serve, name="run-server", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.gate.stop()
        if self._thread is not None:
            self._thread.join()
        self.gate.listener.close()

    @property
    def tokens(self) -> Tokens:
        """The run's tokens, read again when the file changed (`--new-token` elsewhere): an
        unsafe or missing file keeps the ones held."""
        now = file_identity(self.root)
        if now != self._tokens_from:
            try:
                self._tokens = run_tokens(self.root) if now is not None else self._tokens
            except UserError as err:
                self.note(f"tokens not read again: {err}")
            self._tokens_from = now
        return self._tokens

    @property
    def token(self) -> str:
        """The steering token (it watches too)."""
        return self.tokens.steer

    def connect_url(self, host: str | None = None, scope: str = STEER) -> str:
        """The address with a token in it (tests, the benchmark; people get it apart)."""
        token = self.tokens.steer if scope == STEER else self.tokens.watch
        return f"{self.address(host)}/?token={token}"

    def address(self, host: str | None = None) -> str:
        host = host or self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def instructions(self) -> str:
        """What to type on the laptop: an SSH tunnel to the address served on when it is a
        loopback one, else the address (plain HTTP: a tunnel is still wiser). The token goes
        apart from the command (not in `ps` nor in the shell's history)."""
        mode = " (read-only)" if self.read_only else ""
        lines = [f"serving {self.root} on {self.host}:{self.port}{mode}"]
        if is_loopback(self.host):
            target = f"[{self.host}]" if ":" in self.host else self.host
            lines += [
                "on your laptop: ssh -N -o ExitOnForwardFailure=yes "
                f"-L {self.port}:{target}:{self.port} {socket.gethostname()}",
                f"then: python3 launch.py --connect {self.address('localhost')}",
            ]
        else:
            lines += [
                f"on your laptop: python3 launch.py --connect {self.address()}",
                "plain HTTP: the tokens cross the network unencrypted; on a network you do "
                "not trust, serve on 127.0.0.1 and use an SSH tunnel",
            ]
        steer = "" if self.read_only else f"steering token: {self.tokens.steer}  "
        lines += [
            f"{steer}watching token: {self.tokens.watch}",
            "(paste it when asked, or TDMPC2_LIVE_TOKEN=... / --token-file FILE; "
            "--new-token makes new ones)",
        ]
        return "\n".join(lines)

    def notices(self) -> list[str]:
        """What connected windows asked since the last call, one line each."""
        lines = []
        while self.notes:  # popleft: a line a handler thread adds now is kept for later
            lines.append(self.notes.popleft())
        return lines

    def note(self, line: str) -> None:
        self.notes.append(printable(line))  # never a terminal's escape sequence

    def refusal(self, scope: str) -> str:
        """Why a token of `scope` may send no command here ("" when it may)."""
        if self.read_only:
            return "this server is read-only: it takes no command"
        if scope != STEER:
            return "this token watches: it takes no command"
        return ""

    def carry_out(self, data: object, scope: str = STEER) -> tuple[HTTPStatus, dict]:
        """A connected window's command, checked as the window's own and carried out by the
        run's own view of it."""
        from workers.run.attached import AttachedRun

        refusal = self.refusal(scope)
        if refusal:
            return HTTPStatus.FORBIDDEN, {"error": refusal}
        try:
            command = decode_command(data)
        except (ValueError, TypeError) as err:
            return HTTPStatus.BAD_REQUEST, {"error": printable(str(err))}
        with self._commands:
            try:
                if self._view is None:
                    self._view = AttachedRun.open(self.root)
                outcome = self._view.do(command)
            except (UserError, ConfigError) as err:
                self.note(f"a connected window asked {command}: refused: {err}")
                return HTTPStatus.BAD_REQUEST, {"error": printable(str(err))}
            except Exception as err:  # never into the training's terminal as a traceback
                self.note(f"a connected window asked {command}: failed: {type(err).__name__}")
                name = type(command).__name__
                return HTTPStatus.INTERNAL_SERVER_ERROR, {
                    "error": f"{name} failed on the server (its terminal says more)"
                }
        for line in outcome.notices:
            self.note(f"a connected window asked: {line}")
        return HTTPStatus.OK, {"notices": list(outcome.notices), "value": outcome.value}

    def _admits(self, head: bytes) -> bool:
        """Whether a request head carries one of the run's tokens (the door asks, before any
        handler is taken; the handler checks again)."""
        found = BEARER.search(head)
        return found is not None and self.tokens.scope_of(found[1].decode("latin-1")) is not None

    def _answer(self, sock: socket.socket, head: bytes) -> None:
        """One request on `sock`, whose head the gate has read (handler thread)."""
        Handler(sock, head, self)
