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
import gzip
import hashlib
import ipaddress
import json
import os
import re
import socket
import threading
from collections import deque
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from io import BufferedReader, RawIOBase
from pathlib import Path
from urllib.parse import unquote, urlsplit

from agent.errors import ConfigError, UserError, printable
from workers.remote.gate import Gate, Limits
from workers.remote.served import open_served, served_files
from workers.remote.tokens import STEER, WATCH, Tokens, file_identity, run_tokens
from workers.remote.wire import PROTOCOL, SERVER_NAME, decode_command

COMMAND_BYTES = 64 * 1024  # a command is a few hundred bytes; more is not one
CHUNK = 1 << 20
RANGE = re.compile(r"bytes=(\d{1,19})-(\d{0,19})")  # one range; a window asks "N-" only


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
            listener.listen(128)
        except OSError as err:
            listener.close()
            if err.errno == errno.EADDRINUSE:
                raise UserError(
                    f"port {port} on {host} is in use: serve on another (--port P, --serve P)"
                ) from None
            raise UserError(f"cannot serve on {host}:{port}: {err.strerror or err}") from None
        self.port = listener.getsockname()[1]
        self.gate = Gate(listener, self._answer, limits or Limits())
        self.root: Path | None = None
        self.read_only = False
        self._tokens: Tokens | None = None
        self._tokens_from: tuple[int, int] | None = None
        self._commands = threading.Lock()  # one command at a time, as from one window
        self._view = None  # the run as a window sees it, made at the first command
        self._notices: deque[str] = deque(maxlen=1000)
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
                self._notice(f"tokens not read again: {err}")
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
        while self._notices:  # popleft: a line a handler thread adds now is kept for later
            lines.append(self._notices.popleft())
        return lines

    def _notice(self, line: str) -> None:
        self._notices.append(printable(line))  # never a terminal's escape sequence

    def carry_out(self, data: object, scope: str = STEER) -> tuple[HTTPStatus, dict]:
        """A connected window's command, checked as the window's own and carried out by the
        run's own view of it."""
        from workers.run.attached import AttachedRun

        if self.read_only:
            return HTTPStatus.FORBIDDEN, {"error": "this server is read-only: it takes no command"}
        if scope != STEER:
            return HTTPStatus.FORBIDDEN, {"error": "this token watches: it takes no command"}
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
                self._notice(f"a connected window asked {command}: refused: {err}")
                return HTTPStatus.BAD_REQUEST, {"error": printable(str(err))}
            except Exception as err:  # never into the training's terminal as a traceback
                self._notice(f"a connected window asked {command}: failed: {type(err).__name__}")
                name = type(command).__name__
                return HTTPStatus.INTERNAL_SERVER_ERROR, {
                    "error": f"{name} failed on the server (its terminal says more)"
                }
        for line in outcome.notices:
            self._notice(f"a connected window asked: {line}")
        return HTTPStatus.OK, {"notices": list(outcome.notices), "value": outcome.value}

    def _answer(self, sock: socket.socket, head: bytes) -> None:
        """One request on `sock`, whose head the gate has read (handler thread)."""
        _Handler(sock, head, self)


class _HeadThenSocket(RawIOBase):
    """The head the gate read, then the rest of the connection (a command's body)."""

    def __init__(self, head: bytes, sock: socket.socket) -> None:
        self._head, self._sock = memoryview(head), sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        return self._sock.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    server_version = f"{SERVER_NAME}/{PROTOCOL}"
    protocol_version = "HTTP/1.0"  # one request per connection: the gate reads every head
    default_request_version = "HTTP/1.0"  # a malformed request line still gets a status line

    def __init__(self, sock: socket.socket, head: bytes, run_server: RunServer) -> None:
        self.head, self.run_server, self._answered = head, run_server, False
        super().__init__(sock, ("", 0), None)

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = BufferedReader(_HeadThenSocket(self.head, self.connection))
        self.wfile = self.connection.makefile("wb", buffering=0)

    def finish(self) -> None:
        try:
            self.wfile.close()
        finally:
            self.rfile.close()

    def log_message(self, format: str, *args: object) -> None:
        pass  # a poll every half second per window would drown the training's lines

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a bad request line, too many headers) as JSON; a method
        it does not know is 405, not 501, and any other 5xx a 400: the request is what is
        wrong."""
        code = HTTPStatus.METHOD_NOT_ALLOWED if code == HTTPStatus.NOT_IMPLEMENTED else code
        code = HTTPStatus.BAD_REQUEST if code >= 500 else code  # HTTP/2.0 asked: still a 4xx
        self.close_connection = True
        self._send_json(HTTPStatus(code), {"error": printable(message or HTTPStatus(code).phrase)})

    def _send_json(self, status: HTTPStatus, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _scope(self) -> str | None:
        """The given token's scope, or None after answering 401."""
        given = self.headers.get("Authorization", "")
        scope = self.run_server.tokens.scope_of(given[7:] if given.startswith("Bearer ") else None)
        if scope is None:
            self._send_json(HTTPStatus.UNAUTHORIZED, {"error": "the token is missing or wrong"})
        return scope

    def do_GET(self) -> None:
        self._guarded(self._get)

    def do_POST(self) -> None:
        self._guarded(self._post)

    def _guarded(self, answer) -> None:
        """A request the server could not answer gets a 500 that names nothing of it, and the
        connection is never dropped without a word (a client gone mid-answer excepted)."""
        try:
            answer()
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as err:
            self.close_connection = True
            self.run_server._notice(f"a request failed: {type(err).__name__}")
            if not self._answered:
                self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "the server failed"})

    def send_response(self, code: int, message: str | None = None) -> None:
        self._answered = True
        super().send_response(code, message)

    def _get(self) -> None:
        scope = self._scope()
        if scope is None:
            return
        server, path = self.run_server, urlsplit(self.path).path
        if path == "/api/hello":
            self._send_json(
                HTTPStatus.OK,
                {
                    "server": SERVER_NAME,
                    "protocol": PROTOCOL,
                    "run": server.root.name,
                    "read_only": server.read_only or scope == WATCH,
                    "scope": scope,
                },
            )
        elif path == "/api/files":
            self._send_listing(json.dumps({"files": served_files(server.root)}).encode())
        elif path.startswith("/files/"):
            try:
                rel = unquote(path[len("/files/") :], errors="strict")
            except UnicodeDecodeError:
                rel = ""  # not a name of this run's files
            self._send_file(rel)
        else:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": "no such page here"})

    def _post(self) -> None:
        scope = self._scope()
        if scope is None:
            return
        if urlsplit(self.path).path != "/api/command":
            self._send_json(HTTPStatus.NOT_FOUND, {"error": "commands go to /api/command"})
            return
        length = self.headers.get("Content-Length", "")
        if "Transfer-Encoding" in self.headers or not length.isdigit():
            self._send_json(HTTPStatus.LENGTH_REQUIRED, {"error": "a command has a Content-Length"})
            return
        if not 0 < int(length) <= COMMAND_BYTES:
            self._send_json(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "a command is one small JSON"}
            )
            return
        body = self.rfile.read(int(length))
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": "a command is JSON"})
            return
        self._send_json(*self.run_server.carry_out(data, scope))

    def _send_listing(self, data: bytes) -> None:
        """The listing, or 304 when the window holds it already (ETag): most polls of a run
        find nothing new. Compressed when the window takes gzip (a tenth of the bytes)."""
        etag = f'"{hashlib.sha1(data).hexdigest()[:20]}"'
        if self.headers.get("If-None-Match") == etag:
            self.send_response(HTTPStatus.NOT_MODIFIED)
            self.send_header("ETag", etag)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        gzipped = "gzip" in (self.headers.get("Accept-Encoding") or "")
        body = gzip.compress(data, compresslevel=1) if gzipped else data
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/json")
        self.send_header("ETag", etag)
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_file(self, rel: str) -> None:
        """The file, or from byte N on (Range: bytes=N- or N-M) with 206; the inode, mtime and
        size of what was read go with it, so the window knows which version it holds."""
        fd = open_served(self.run_server.root, rel)
        if fd is None:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": "not a file of this run"})
            return
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            start, end = 0, st.st_size
            wanted = self.headers.get("Range")
            if wanted is not None:
                match = RANGE.fullmatch(wanted.strip())
                if match is not None:
                    start = int(match[1])
                    end = min(end, int(match[2]) + 1) if match[2] else end
                if match is None or not start <= end:
                    self._send_json(
                        HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE,
                        {"error": "one range of bytes, within the file: bytes=N- or bytes=N-M"},
                    )
                    return
            self.send_response(HTTPStatus.OK if wanted is None else HTTPStatus.PARTIAL_CONTENT)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start))
            if wanted is not None:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{st.st_size}")
            self.send_header("X-Ino", str(st.st_ino))
            self.send_header("X-Mtime", str(st.st_mtime_ns))
            self.send_header("X-Size", str(st.st_size))
            self.end_headers()
            f.seek(start)
            left = end - start
            while left > 0:
                chunk = f.read(min(CHUNK, left))
                if not chunk:  # shrank while sent (a failed write taken back): the window
                    break  # sees a short body and fetches the file again
                self.wfile.write(chunk)
                left -= len(chunk)
