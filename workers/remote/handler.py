"""One request to a run server (server.py), in a handler thread, its head already read by the
door (gate.py): the token checked first, then the run's hello, its listing, one of its files
(Range: bytes=N- or N-M) or a command. http.server parses; every refusal, its own included, is
a JSON answer with a 4xx status, and a failure names nothing of the server's insides."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import socket
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from io import BufferedReader, RawIOBase
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from agent.errors import printable
from workers.remote.served import open_served, served_files
from workers.remote.tokens import WATCH
from workers.remote.wire import PROTOCOL, SERVER_NAME

if TYPE_CHECKING:
    from workers.remote.server import RunServer

COMMAND_BYTES = 64 * 1024  # a command is a few hundred bytes; more is not one
CHUNK = 1 << 20
RANGE = re.compile(r"bytes=([0-9]{1,19})-([0-9]{0,19})")  # one range: a window asks N- or N-M
NUMBER = re.compile(r"[0-9]{1,19}")  # ASCII digits only: str.isdigit takes "²" too
BODY_S = 10.0  # a command's body, all of it


class _SendAll(RawIOBase):
    """Writes all of each piece (socket.sendall): a slow reader's socket may take part of a
    send, and the rest must not be lost."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        self._sock.sendall(data)
        return len(data)


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


class Handler(BaseHTTPRequestHandler):
    server_version = f"{SERVER_NAME}/{PROTOCOL}"
    protocol_version = "HTTP/1.0"  # one request per connection: the gate reads every head
    default_request_version = "HTTP/1.0"  # a malformed request line still gets a status line

    def __init__(self, sock: socket.socket, head: bytes, run_server: RunServer) -> None:
        self.head, self.run_server, self._answered = head, run_server, False
        super().__init__(sock, ("", 0), None)

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = BufferedReader(_HeadThenSocket(self.head, self.connection))
        self.wfile = _SendAll(self.connection)

    def finish(self) -> None:
        try:
            self.wfile.close()
        finally:
            self.rfile.close()

    def log_message(self, format: str, *args: object) -> None:
        pass  # a poll every half second per window would drown the training's lines

    def parse_request(self) -> bool:
        if not self.raw_requestline.strip():  # http.server would close without a word
            self.command, self.requestline = None, ""
            self.request_version = self.default_request_version
            self.send_error(HTTPStatus.BAD_REQUEST, "an empty request line")
            return False
        return super().parse_request()

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
        self.scope = scope
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
            self.run_server.note(f"a request failed: {type(err).__name__}")
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
            listing = json.dumps({"files": served_files(server.root)}).encode()
            self._in_a_slot(lambda: self._send_listing(listing))
        elif path.startswith("/files/"):
            try:
                rel = unquote(path[len("/files/") :], errors="strict")
            except UnicodeDecodeError:
                rel = ""  # not a name of this run's files
            self._in_a_slot(lambda: self._send_file(rel))
        else:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": "no such page here"})

    def _post(self) -> None:
        scope = self._scope()
        if scope is None:
            return
        if urlsplit(self.path).path != "/api/command":
            self._send_json(HTTPStatus.NOT_FOUND, {"error": "commands go to /api/command"})
            return
        refusal = self.run_server.refusal(scope)  # before a byte of the body is read
        if refusal:
            self._send_json(HTTPStatus.FORBIDDEN, {"error": refusal})
            return
        length = self.headers.get("Content-Length", "")
        if "Transfer-Encoding" in self.headers or not NUMBER.fullmatch(length):
            self._send_json(HTTPStatus.LENGTH_REQUIRED, {"error": "a command has a Content-Length"})
            return
        if not 0 < int(length) <= COMMAND_BYTES:
            self._send_json(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "a command is one small JSON"}
            )
            return
        body = self._read_body(int(length))
        if body is None:
            self._send_json(HTTPStatus.REQUEST_TIMEOUT, {"error": "the command came too slowly"})
            return
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": "a command is JSON"})
            return
        self._send_json(*self.run_server.carry_out(data, scope))

    def _read_body(self, length: int) -> bytes | None:
        """`length` bytes within BODY_S in all (not per read: a trickle cannot hold the
        thread), or None."""
        deadline, data = time.monotonic() + BODY_S, bytearray()
        try:
            while len(data) < length:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.connection.settimeout(left)
                chunk = self.rfile.read1(length - len(data))
                if not chunk:
                    return None
                data += chunk
        except TimeoutError:
            return None
        return bytes(data)

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

    def _in_a_slot(self, send: Callable[[], None]) -> None:
        """`send` (a listing, a file) in one of this token scope's transfer slots, or 503:
        slow readers never hold every handler, and never the other scope's share."""
        slots = self.run_server.transfers[self.scope]
        if not slots.acquire(blocking=False):
            self._send_json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "busy: ask again"})
            return
        try:
            send()
        finally:
            slots.release()

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
                if match is None or not start < end:
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
