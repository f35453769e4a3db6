"""Serve a run directory to windows on other machines: `--serve [PORT]` beside a headless run,
or `launch.py serve RUN_DIR` for one that is going on or finished.

Plain HTTP from the standard library (http.server, threads): a window mirrors the run
directory by listing it and fetching what changed, the append-only records by byte offset
(Range), and sends the run's commands as JSON. Every request must carry the run's token
(compared in constant time); only the run's own files are served (served.py); a command is
carried out by a view of the run (AttachedRun, handle.py), so its values are checked as the
run checks them, and `read_only` takes none.

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
import socket
import threading
from collections import deque
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from agent.errors import ConfigError, UserError
from workers.remote.served import open_served, served_files
from workers.remote.wire import PROTOCOL, SERVER_NAME, decode_command, run_token, token_matches

COMMAND_BYTES = 64 * 1024  # a command is a few hundred bytes; more is not one
CHUNK = 1 << 20


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

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        try:
            self._http = _QuietServer((host, port), _Handler)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise UserError(
                    f"port {port} on {host} is in use: serve on another (--serve PORT)"
                ) from None
            raise UserError(f"cannot serve on {host}:{port}: {err.strerror or err}") from None
        self._http.run_server = self  # type: ignore[attr-defined]
        self.port = self._http.server_address[1]
        self.root: Path | None = None
        self.token = ""
        self.read_only = False
        self._commands = threading.Lock()  # one command at a time, as from one window
        self._view = None  # the run as a window sees it, made at the first command
        self._notices: deque[str] = deque(maxlen=1000)
        self._thread: threading.Thread | None = None

    def start(self, run_path: str | Path, read_only: bool = False) -> None:
        self.root = Path(run_path).resolve()
        self.token = run_token(self.root)
        self.read_only = read_only
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.25}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._http.shutdown()
            self._thread.join()
        self._http.server_close()

    def connect_url(self, host: str | None = None) -> str:
        return f"http://{host or self.host}:{self.port}/?token={self.token}"

    def instructions(self) -> str:
        """What to type on the laptop: an SSH tunnel on a loopback address, else the address
        (plain HTTP: the token travels in clear on the network, so a tunnel is still wiser)."""
        mode = " (read-only)" if self.read_only else ""
        lines = [f"serving {self.root} on {self.host}:{self.port}{mode}"]
        if is_loopback(self.host):
            lines += [
                f"on your laptop: ssh -N -L {self.port}:localhost:{self.port} "
                f"{socket.gethostname()}",
                f"then: python3 launch.py --connect '{self.connect_url('localhost')}'",
            ]
        else:
            lines += [
                f"on your laptop: python3 launch.py --connect '{self.connect_url()}'",
                "plain HTTP: the token crosses the network unencrypted; on a network you do "
                "not trust, serve on 127.0.0.1 and use an SSH tunnel",
            ]
        return "\n".join(lines)

    def notices(self) -> list[str]:
        """What connected windows asked since the last call, one line each."""
        lines = []
        while self._notices:  # popleft: a line a handler thread adds now is kept for later
            lines.append(self._notices.popleft())
        return lines

    def carry_out(self, data: object) -> tuple[HTTPStatus, dict]:
        """A connected window's command, as the run's own view of it carries it out."""
        from workers.run.attached import AttachedRun

        if self.read_only:
            return HTTPStatus.FORBIDDEN, {"error": "this server is read-only: it takes no command"}
        try:
            command = decode_command(data)
        except (ValueError, TypeError) as err:
            return HTTPStatus.BAD_REQUEST, {"error": str(err)}
        with self._commands:
            try:
                if self._view is None:
                    self._view = AttachedRun.open(self.root)
                outcome = self._view.do(command)
            except (UserError, ConfigError) as err:
                self._notices.append(f"a connected window asked {command}: refused: {err}")
                return HTTPStatus.BAD_REQUEST, {"error": str(err)}
            except Exception as err:  # never into the training's terminal as a traceback
                why = f"{type(err).__name__}: {err}"
                self._notices.append(f"a connected window asked {command}: failed: {why}")
                return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": why}
        for line in outcome.notices:
            self._notices.append(f"a connected window asked: {line}")
        return HTTPStatus.OK, {"notices": list(outcome.notices), "value": outcome.value}


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a window that went away mid-answer: its mirror fetches the file again


class _Handler(BaseHTTPRequestHandler):
    server_version = f"{SERVER_NAME}/{PROTOCOL}"
    protocol_version = "HTTP/1.1"  # keep-alive: a window polls every half second
    timeout = 60  # a connection silent this long is closed (its thread ends)

    @property
    def run_server(self) -> RunServer:
        return self.server.run_server  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: object) -> None:
        pass  # a poll every half second per window would drown the training's lines

    def _send_json(self, status: HTTPStatus, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        given = self.headers.get("Authorization", "")
        token = given[7:] if given.startswith("Bearer ") else None
        if token_matches(token, self.run_server.token):
            return True
        self._send_json(HTTPStatus.UNAUTHORIZED, {"error": "the token is missing or wrong"})
        return False

    def do_GET(self) -> None:
        if not self._authorised():
            return
        server, path = self.run_server, urlsplit(self.path).path
        if path == "/api/hello":
            self._send_json(
                HTTPStatus.OK,
                {
                    "server": SERVER_NAME,
                    "protocol": PROTOCOL,
                    "run": server.root.name,
                    "read_only": server.read_only,
                },
            )
        elif path == "/api/files":
            self._send_listing(json.dumps({"files": served_files(server.root)}).encode())
        elif path.startswith("/files/"):
            self._send_file(unquote(path[len("/files/") :]))
        else:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no {path} here"})

    def do_POST(self) -> None:
        if not self._authorised():
            return
        if urlsplit(self.path).path != "/api/command":
            self._send_json(HTTPStatus.NOT_FOUND, {"error": "commands go to /api/command"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= COMMAND_BYTES:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": "a command is one small JSON"})
            return
        try:
            data = json.loads(self.rfile.read(length))
        except ValueError:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": "a command is JSON"})
            return
        self._send_json(*self.run_server.carry_out(data))

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
        """The file, or from byte N on (Range: bytes=N-M) with 206; the inode, mtime and size
        of what was read go with it, so the window knows which version it holds."""
        fd = open_served(self.run_server.root, rel)
        if fd is None:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"{rel}: not a file of this run"})
            return
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            start, end = 0, st.st_size
            wanted = self.headers.get("Range", "")
            if wanted.startswith("bytes="):
                first, _, last = wanted[6:].partition("-")
                try:
                    start = int(first)
                    end = min(end, int(last) + 1) if last else end
                except ValueError:
                    start = -1
                if not 0 <= start <= end:
                    self._send_json(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, {"error": wanted})
                    return
            self.send_response(HTTPStatus.PARTIAL_CONTENT if wanted else HTTPStatus.OK)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start))
            if wanted:
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
