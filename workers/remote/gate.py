"""The run server's door: one thread accepts every connection and holds it, without a thread of
its own, until its request head has arrived; only then does one of a few handler threads take
it (server.py), and that thread checks the token before anything else.

So whatever others send, the token holder gets in: at most `max_waiting` connections wait for
their heads (the oldest is closed when another comes), each at most `head_deadline_s`
(slowloris), a head at most `max_head` bytes (431); at most `handlers` threads answer, with at
most `queued` complete heads waiting for them (503 beyond); when the process runs out of file
descriptors the door closes the oldest waiting connection and pauses instead of spinning. The
rules of uvicorn and aiohttp (connection limits, header deadlines), kept with the standard
library: neither bounds the connections that have not yet sent a head.
"""

from __future__ import annotations

import dataclasses
import errno
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

# The end of a head: a blank line (http.server also takes bare LF line ends).
HEAD_ENDS = (b"\r\n\r\n", b"\n\n", b"\n\r\n")
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def descriptors(wanted: int = 4096) -> int:
    """This process's limit on open files, raised towards `wanted` where the hard limit allows
    (a desktop's soft limit is often 1024)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return 512
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    return wanted if soft == resource.RLIM_INFINITY else soft


@dataclass(frozen=True)
class Limits:
    max_waiting: int = 1024  # connections whose head has not arrived (a quarter of the fds)
    head_deadline_s: float = 5.0  # from accept to the head's end
    max_head: int = 16 * 1024  # request line and headers (a window's are ~300 bytes)
    handlers: int = 8  # threads answering requests
    queued: int = 32  # complete heads waiting for a handler


LINGER_S = 2.0  # a closed connection's unread input is read and dropped this long, at most
MAX_LINGERING = 256


def error_answer(status: int, reason: str, error: str, server: str) -> bytes:
    body = f'{{"error": "{error}"}}'.encode()
    head = (
        f"HTTP/1.0 {status} {reason}\r\nServer: {server}\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    return head + body


class Gate:
    """Accept on `listener` until `stop`; each complete head that `admits` (its token) goes to
    `handle(sock, head)` in a handler thread (the socket then blocking, `io_timeout_s` per read
    or write), the others are answered 401 here: heads without a token never queue for a
    handler. `server` names the server in the door's own answers."""

    def __init__(
        self,
        listener: socket.socket,
        handle: Callable[[socket.socket, bytes], None],
        admits: Callable[[bytes], bool],
        server: str,
        limits: Limits | None = None,
        io_timeout_s: float = 30.0,
    ) -> None:
        self.listener, self.handle, self.io_timeout_s = listener, handle, io_timeout_s
        self.admits, self.server = admits, server
        limits = limits or Limits()
        # The waiting room's size: the limits', within a quarter of this process's descriptors
        # (the training's files, the workers' pipes and the handlers' files need the rest).
        room = min(limits.max_waiting, max(16, descriptors() // 4))
        self.limits = dataclasses.replace(limits, max_waiting=room)
        listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ)
        self._waiting: dict[socket.socket, tuple[float, bytearray]] = {}  # oldest first
        # Answered connections whose input is read and dropped before they close: closing a
        # socket with unread input resets it, and the other side may lose the answer.
        self._lingering: dict[socket.socket, float] = {}
        self._answered: queue.SimpleQueue[socket.socket] = queue.SimpleQueue()
        self._pool = ThreadPoolExecutor(self.limits.handlers, thread_name_prefix="run-server")
        self._busy = 0  # heads handed over and not yet answered
        self._busy_lock = threading.Lock()
        self._stopped = threading.Event()
        self.evicted = 0  # waiting connections closed for a newer one or descriptors
        self.expired = 0  # closed at the head deadline

    def serve(self) -> None:
        while not self._stopped.is_set():
            try:
                self._turn()
            except Exception:  # never a dead door: the next turn goes on
                time.sleep(0.05)
        for sock in [*self._waiting, *self._lingering]:
            self._drop(sock)
        self._selector.close()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _turn(self) -> None:
        ready = [key.fileobj for key, _ in self._selector.select(timeout=0.1)]
        # The heads that arrived first, then new connections: an accept may push the oldest
        # waiting connection out, and one whose head is already here must not be it.
        for sock in ready:
            if sock in self._lingering:
                self._drain(sock)  # type: ignore[arg-type]
            elif sock in self._waiting:  # else closed by an earlier event of this turn
                self._read_head(sock)  # type: ignore[arg-type]
        if self.listener in ready:
            self._accept()
        while not self._answered.empty():
            self._linger(self._answered.get())
        self._expire()

    def stop(self) -> None:
        self._stopped.set()

    def waiting(self) -> int:
        return len(self._waiting)

    def _accept(self) -> None:
        for _ in range(64):  # a burst, then the waiting heads get their turn
            try:
                sock, _addr = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as err:
                if err.errno in OUT_OF_DESCRIPTORS:
                    # The pending connection stays in the kernel's queue: free a descriptor
                    # by closing the oldest waiting connection, and pause rather than spin.
                    if self._waiting:
                        self._evict_oldest()
                    time.sleep(0.05)
                return
            if len(self._waiting) >= self.limits.max_waiting:
                self._evict_oldest()
            sock.setblocking(False)
            self._waiting[sock] = (time.monotonic() + self.limits.head_deadline_s, bytearray())
            self._selector.register(sock, selectors.EVENT_READ)
            # A client sends its head with the connection: read it now, before a flood of
            # newer connections can push this one out of the waiting room.
            self._read_head(sock)

    def _read_head(self, sock: socket.socket) -> None:
        deadline, head = self._waiting[sock]
        try:
            chunk = sock.recv(self.limits.max_head + 1 - len(head))
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # the other side closed it
            self._drop(sock)
            return
        head += chunk
        if any(end in head for end in HEAD_ENDS):
            self._unwait(sock)
            self._hand_over(sock, bytes(head))
        elif len(head) > self.limits.max_head:
            self._unwait(sock)
            self._refuse(sock, 431, "Request Header Fields Too Large", "a head of 16 KB at most")

    def _hand_over(self, sock: socket.socket, head: bytes) -> None:
        if not self.admits(head):
            self._refuse(sock, 401, "Unauthorized", "the token is missing or wrong")
            return
        with self._busy_lock:
            full = self._busy >= self.limits.handlers + self.limits.queued
            if not full:
                self._busy += 1
        if full:
            self._refuse(sock, 503, "Service Unavailable", "busy: ask again")
            return
        sock.setblocking(True)
        sock.settimeout(self.io_timeout_s)
        self._pool.submit(self._run, sock, head)

    def _run(self, sock: socket.socket, head: bytes) -> None:
        try:
            self.handle(sock, head)
        except Exception:
            pass  # the handler answers what it can; a broken connection is the client's to retry
        finally:
            with self._busy_lock:
                self._busy -= 1
            self._answered.put(sock)  # the door closes it once its input is read

    def _expire(self) -> None:
        now = time.monotonic()
        for sock, (deadline, _) in list(self._waiting.items()):
            if deadline > now:
                break  # oldest first: the rest came later
            self.expired += 1
            self._unwait(sock)
            self._refuse(sock, 408, "Request Timeout", "the request head came too slowly")
        for sock, deadline in list(self._lingering.items()):
            if deadline > now:
                break
            self._drop(sock)

    def _refuse(self, sock: socket.socket, status: int, reason: str, error: str) -> None:
        """A short JSON error, sent without waiting (the socket's buffer takes it)."""
        try:
            sock.send(error_answer(status, reason, error, self.server))
        except OSError:
            pass
        self._linger(sock)

    def _linger(self, sock: socket.socket) -> None:
        """Close `sock` once the other side has closed too, or after LINGER_S."""
        try:
            sock.setblocking(False)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self._lingering) >= MAX_LINGERING:
            self._drop(next(iter(self._lingering)))
        self._lingering[sock] = time.monotonic() + LINGER_S
        self._selector.register(sock, selectors.EVENT_READ)

    def _drain(self, sock: socket.socket) -> None:
        try:
            if sock.recv(65536):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self._drop(sock)

    def _evict_oldest(self) -> None:
        self.evicted += 1
        self._drop(next(iter(self._waiting)))

    def _unwait(self, sock: socket.socket) -> None:
        self._selector.unregister(sock)
        del self._waiting[sock]

    def _drop(self, sock: socket.socket) -> None:
        """Close a waiting or lingering connection."""
        self._selector.unregister(sock)
        self._waiting.pop(sock, None)
        self._lingering.pop(sock, None)
        sock.close()
