"""A connected window's requests to a run server: http.client, so no proxy from the environment
ever sees the token and no redirect is followed (another host would get it); every answer's
body is read up to a bound given with the request, never further.

A server that answers nothing, or breaks off, is `LinkDown` (the window shows what arrived and
tries again); one whose answer is malformed or larger than asked is `BrokenAnswer` (a line in
the status bar; the file is skipped)."""

from __future__ import annotations

import http.client
import re
import socket
import threading
import zlib
from dataclasses import dataclass
from email.message import Message
from urllib.parse import urlsplit

from agent.errors import UserError, printable

TIMEOUT_S = 10.0  # a connection, and each wait for more of an answer
# An answer's whole time: TIMEOUT_S, and a second for each RATE bytes (a server that sends a
# byte now and then cannot hold the window's thread).
RATE = 64 * 1024
NUMBER = re.compile(r"[0-9]{1,19}")  # ASCII digits only: str.isdigit takes "²" too


class LinkDown(Exception):
    """The server answers nothing, or broke off an answer; `sent`: the request went out (a
    command may have been carried out)."""

    def __init__(self, why: str, sent: bool = True) -> None:
        super().__init__(why)
        self.sent = sent


class BrokenAnswer(ValueError):
    """The server's answer is not what the protocol says (too large, a header missing)."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Message
    body: bytes

    def header_int(self, name: str) -> int:
        """An integer header, or BrokenAnswer."""
        value = self.headers.get(name, "")
        if not NUMBER.fullmatch(value):
            raise BrokenAnswer(f"the answer's {name} is missing or not a number")
        return int(value)


TOKEN = re.compile(r"[A-Za-z0-9_.~-]{1,512}")  # what secrets.token_urlsafe makes, and no more


class Link:
    def __init__(self, base: str, token: str, timeout: float = TIMEOUT_S) -> None:
        if not TOKEN.fullmatch(token):  # a header with a line break in it, or worse
            raise UserError(
                "the token is not one a run server prints (letters, digits, - and _): check "
                "the file or variable it came from"
            )
        parts = urlsplit(base)
        self.base, self.host, self.port = base, parts.hostname or "", parts.port or 80
        self._token, self.timeout = token, timeout

    def ask(
        self,
        path: str,
        limit: int,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        """GET `path` (POST with `body`), its answer's body at most `limit` bytes."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            connection.connect()
        except OSError as err:  # nothing reached the server
            connection.close()
            raise LinkDown(err.strerror or str(err) or type(err).__name__, sent=False) from None
        sock = connection.sock  # the answer reads from it (http.client lets go of it)
        # The whole exchange has its time, status line and headers included: a server that
        # sends a byte now and then never holds the thread (each read has its own timeout only).
        seconds = self.timeout + limit / RATE
        was_cut = threading.Event()
        cut = threading.Timer(seconds, _cut, (sock, was_cut))
        cut.daemon = True
        cut.start()
        try:
            connection.request(
                "GET" if body is None else "POST",
                path,
                body=body,
                headers={"Authorization": f"Bearer {self._token}", **(headers or {})},
            )
            answer = connection.getresponse()
            length = answer.headers.get("Content-Length")
            if length is not None and (not NUMBER.fullmatch(length) or int(length) > limit):
                raise BrokenAnswer(
                    f"an answer of {printable(length, 20)} bytes, over the {limit:,} asked"
                )
            data = _read_up_to(answer, limit)
            cut.cancel()
            if was_cut.is_set():  # cut off: what arrived may be short
                raise LinkDown("the answer came too slowly")
            if length is not None and len(data) != int(length):
                raise LinkDown(f"the answer was cut short ({len(data):,} of {length} bytes)")
            return Answer(answer.status, answer.headers, data)
        except (OSError, http.client.HTTPException) as err:
            if was_cut.is_set():
                raise LinkDown("the answer came too slowly") from None
            raise LinkDown(str(getattr(err, "reason", err)) or type(err).__name__) from None
        except ValueError as err:  # http.client refused a header (the server's ETag, say)
            raise BrokenAnswer(f"a header that cannot be sent back ({err})") from None
        finally:
            cut.cancel()
            connection.close()


def _cut(sock: socket.socket, was_cut: threading.Event) -> None:
    """End an exchange past its time: the thread blocked reading it wakes at once."""
    was_cut.set()
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _read_up_to(answer: http.client.HTTPResponse, limit: int) -> bytes:
    """At most `limit` bytes of `answer` (BrokenAnswer beyond)."""
    data = bytearray()
    while len(data) <= limit:
        chunk = answer.read1(min(1 << 20, limit + 1 - len(data)))
        if not chunk:
            break
        data += chunk
    if len(data) > limit:
        raise BrokenAnswer(f"an answer over the {limit:,} bytes asked")
    return bytes(data)


def gunzip(data: bytes, limit: int) -> bytes:
    """`data` decompressed, at most `limit` bytes (BrokenAnswer beyond, or if damaged): a small
    answer cannot unpack into the window's whole memory."""
    unpack = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = unpack.decompress(data, limit)
    except zlib.error as err:
        raise BrokenAnswer(f"a compressed answer that does not unpack ({err})") from None
    if unpack.unconsumed_tail or not unpack.eof:
        raise BrokenAnswer(f"a compressed answer over {limit:,} bytes unpacked, or cut short")
    return out
