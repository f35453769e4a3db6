"""The run server's contract, read as an attacker reads it: black-box against `launch.py serve`
on loopback. Whoever reaches the port gets a bounded share of the server (connections, threads,
a deadline for the head) and a 4xx answer to anything malformed; only the steering token
steers; every command is checked as the window checks it; only the run's regular files are
served, never through a link; tokens can be renewed and are kept in a file nobody else reads."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, launch, tiny_run, wait_until

from workers.remote.served import open_served
from workers.remote.tokens import TOKEN_FILE
from workers.run.owner import Run, RunSettings

LAUNCH = [sys.executable, str(ROOT / "launch.py")]


class Served:
    """`launch.py serve RUN --port 0` in a process of its own, its address and tokens."""

    def __init__(self, run_path: Path, *flags: str) -> None:
        env = {**os.environ, "TDMPC2_LIVE_NO_BOOTSTRAP": "1", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [*LAUNCH, "serve", str(run_path), "--port", "0", *flags],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.lines: list[str] = []
        reader = threading.Thread(target=self._read, daemon=True)
        reader.start()
        assert wait_until(lambda: any("watching token" in ln for ln in self.lines), 60), self.lines
        self.port = int(re.search(r"on 127\.0\.0\.1:(\d+)", self.lines[0])[1])
        tokens = next(ln for ln in self.lines if "watching token" in ln)
        self.watch = re.search(r"watching token: (\S+)", tokens)[1]
        found = re.search(r"steering token: (\S+)", tokens)
        self.steer = found[1] if found else None

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def threads(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"Threads:\s+(\d+)", status)[1])

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


def raw(port: int, data: bytes, timeout: float = 15.0) -> tuple[int | None, bytes]:
    """Send `data` as it is; the answer's status (None: closed without one) and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    match = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    return (int(match[1]) if match else None), body


def request(
    port: int, method: str, path: str, token: str | None, body=None, headers=(), timeout=15
):
    data = b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {path} HTTP/1.1", "Host: x"]
    lines += [f"Authorization: Bearer {token}"] if token else []
    lines += [f"Content-Length: {len(data)}"] if body is not None else []
    lines += list(headers)
    return raw(port, ("\r\n".join(lines) + "\r\n\r\n").encode() + data, timeout)


def command(served: Served, name: str, fields: dict, token: str | None = None):
    body = {"command": name, "fields": fields}
    return request(served.port, "POST", "/api/command", token or served.steer, body)


@pytest.fixture(scope="module")
def run_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("served") / "run"
    Run.create(path, tiny_run(100), RunSettings(workers=2, pack=1))
    return path


@pytest.fixture(scope="module")
def served(run_path):
    server = Served(run_path)
    yield server
    server.stop()


def test_half_open_connections_never_lock_the_token_holder_out(served):
    """300 connections that send half a head, and never the rest: the server's threads stay
    at its cap (the door holds them without a thread each) and the token holder is answered."""
    before = served.threads()
    flood = []
    for _ in range(300):
        sock = socket.create_connection(("127.0.0.1", served.port), timeout=10)
        sock.sendall(b"GET /api/files HTTP/1.1\r\nHost: x\r\n")  # no blank line: half a head
        flood.append(sock)
    try:
        status, body = request(served.port, "GET", "/api/hello", served.watch)
        assert status == 200 and json.loads(body)["scope"] == "watch"
        assert served.threads() <= before + 8  # the handlers' cap, whatever the flood
    finally:
        for sock in flood:
            sock.close()


def test_connections_opened_faster_than_the_door_holds_them_never_stop_it(tmp_path):
    """Connections evicted while their own input waits in the same turn of the door (an
    attacker opening again as fast as the door closes): the door goes on, the holder gets in."""
    from workers.remote.gate import Limits
    from workers.remote.server import RunServer

    run = Run.create(tmp_path / "run", tiny_run(100), RunSettings(workers=2, pack=1))
    server = RunServer("127.0.0.1", 0, Limits(max_waiting=4))
    server.start(run.path)
    try:
        for _ in range(30):
            burst = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(12)]
            for sock in burst:
                sock.sendall(b"GET / HTTP/1.1\r\n")
            for sock in burst:
                sock.close()
        assert server.gate.evicted > 0 and server._thread.is_alive()
        assert request(server.port, "GET", "/api/hello", server.tokens.watch)[0] == 200
    finally:
        server.stop()


def test_a_silent_connection_is_closed_at_the_head_deadline(served):
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        sock.sendall(b"GET /api/hello HTTP/1.1\r\n")
        started = time.monotonic()
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.0 408") and time.monotonic() - started < 25


def test_every_malformed_request_gets_a_4xx_answer_naming_nothing_inside(served):
    steer = b"Authorization: Bearer T\r\n"
    cases = {
        b"GET /files/config%00.json HTTP/1.1\r\nAuthorization: Bearer T\r\n\r\n": 404,
        b"GET /files/%ff%fe HTTP/1.1\r\nAuthorization: Bearer T\r\n\r\n": 404,
        b"POST /api/command HTTP/1.1\r\n" + steer + b"Content-Length: abc\r\n\r\n": 411,
        b"POST /api/command HTTP/1.1\r\n" + steer + b"Content-Length: 99999\r\n\r\n": 413,
        b"POST /api/command HTTP/1.1\r\n" + steer + b"Transfer-Encoding: chunked\r\n\r\n": 411,
        b"BREW /pot HTTP/1.1\r\nAuthorization: Bearer T\r\n\r\n": 405,
        b"GET\r\n" + steer + b"\r\n": 400,
        b"\r\n" + steer + b"\r\n": 400,
        b"POST /api/command HTTP/1.1\r\n" + steer + "Content-Length: \u00b2\r\n\r\n".encode(): 411,
        b"GET / HTTP/9.9\r\n" + steer + b"\r\n": 400,
        b"GET http://[/files/run.json HTTP/1.1\r\n" + steer + b"\r\n": 400,  # no such host
        b"POST http://[/api/command HTTP/1.1\r\n" + steer + b"Content-Length: 2\r\n\r\n{}": 400,
        b"GET /api/files HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 20_000 + b"\r\n\r\n": 431,
        b"GET /api/files HTTP/1.1\r\n" + steer + b"X: y\r\n" * 150 + b"\r\n": 431,
        # Without a token the door answers before any parsing: 401, whatever else is wrong.
        b"GET\r\n\r\n": 401,
        b"\r\n\r\n": 401,
        b"GET / HTTP/9.9\r\n\r\n": 401,
    }
    for data, expected in cases.items():
        status, body = raw(
            served.port, data.replace(b"Bearer T", f"Bearer {served.steer}".encode())
        )
        assert status == expected, (data[:60], status, body)
        assert b"Traceback" not in body and b"Error" not in body.replace(b'"error"', b"")
    # JSON nested deeper than Python's recursion, as a command: a 400, the server still there
    nested = b"[" * 30_000 + b"]" * 30_000
    head = (
        f"POST /api/command HTTP/1.1\r\nAuthorization: Bearer {served.steer}\r\n"
        f"Content-Length: {len(nested)}\r\n\r\n"
    )
    assert raw(served.port, head.encode() + nested)[0] == 400
    # A Range that is not one range of bytes within the file
    size = len(request(served.port, "GET", "/files/config.json", served.watch)[1])
    for wanted in ("items=0-", "bytes=5-2", "bytes=0-1,4-5", "bytes=-5", f"bytes={size}-"):
        status, _ = request(
            served.port, "GET", "/files/config.json", served.watch, headers=[f"Range: {wanted}"]
        )
        assert status == 416, wanted
    assert request(served.port, "GET", "/api/hello", served.watch)[0] == 200


def test_a_body_cannot_hold_a_handler(served):
    """A watching token's command is refused before its body is read; a steering token's
    body that trickles in is given up on after a deadline for the whole of it."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        head = f"POST /api/command HTTP/1.1\r\nAuthorization: Bearer {served.watch}\r\n"
        sock.sendall(f"{head}Content-Length: 60000\r\n\r\nx".encode())
        assert sock.recv(100).startswith(b"HTTP/1.0 403")
    with socket.create_connection(("127.0.0.1", served.port), timeout=60) as sock:
        head = f"POST /api/command HTTP/1.1\r\nAuthorization: Bearer {served.steer}\r\n"
        sock.sendall(f"{head}Content-Length: 60000\r\n\r\nx".encode())
        for _ in range(12):
            time.sleep(1)
            try:
                sock.send(b"x")  # a byte a second: never all of it
            except OSError:
                break
        assert sock.recv(100).startswith(b"HTTP/1.0 408")


def test_a_flood_of_connects_locks_nobody_out(served):
    """Another process connects as fast as it can and sends nothing; every request of the
    token holder meanwhile is answered (the heads that arrived are read before new
    connections push the oldest out)."""
    flood = subprocess.Popen(
        [sys.executable, "-c", FLOOD, str(served.port), "4"], stderr=subprocess.DEVNULL
    )
    try:
        time.sleep(0.5)
        answers = [request(served.port, "GET", "/api/hello", served.watch, timeout=30)[0]]
        answers += [request(served.port, "GET", "/api/hello", served.watch, timeout=30)[0]]
        answers += [request(served.port, "GET", "/api/hello", served.watch, timeout=30)[0]]
    finally:
        flood.kill()
        flood.wait()
    assert answers == [200, 200, 200]


FLOOD = """
import collections, socket, sys, time
port, seconds = int(sys.argv[1]), float(sys.argv[2])
held, end = collections.deque(), time.monotonic() + seconds
while time.monotonic() < end:
    sock = socket.socket()
    sock.setblocking(False)
    try:
        sock.connect(("127.0.0.1", port))
    except (BlockingIOError, OSError):
        pass
    held.append(sock)
    if len(held) > 500:
        held.popleft().close()
"""


def test_slow_readers_with_one_token_never_starve_the_others_windows(served, run_path):
    """A watching token's fetches that never read their answers take at most their scope's
    share of the handlers: the steering window still gets its files, everyone their hellos."""
    (run_path / "big.pt").write_bytes(bytes(64 << 20))  # more than socket buffers hold
    slow = []
    try:
        for _ in range(6):
            sock = socket.create_connection(("127.0.0.1", served.port), timeout=30)
            head = f"GET /files/big.pt HTTP/1.1\r\nAuthorization: Bearer {served.watch}\r\n\r\n"
            sock.sendall(head.encode())
            slow.append(sock)  # never read
        # Once the six hold the watching token's transfer slots, its next file waits no turn.
        assert wait_until(
            lambda: request(served.port, "GET", "/files/config.json", served.watch)[0] == 503, 30
        )
        assert request(served.port, "GET", "/files/config.json", served.steer)[0] == 200
        assert request(served.port, "GET", "/api/hello", served.watch)[0] == 200
    finally:
        for sock in slow:
            sock.close()
        (run_path / "big.pt").unlink()


def test_a_slow_reader_gets_every_byte(served, run_path):
    """A reader whose socket takes a few KB at a time (a slow tunnel): each send of the server
    may be taken in part, and nothing of the rest is lost."""
    data = os.urandom(4 << 20)
    (run_path / "weights.pt").write_bytes(data)
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(60)
        sock.connect(("127.0.0.1", served.port))
        head = f"GET /files/weights.pt HTTP/1.1\r\nAuthorization: Bearer {served.steer}\r\n\r\n"
        sock.sendall(head.encode())
        answer = bytearray()
        while chunk := sock.recv(4096):
            answer += chunk
            time.sleep(0.0002)  # slower than the server sends
        sock.close()
        assert bytes(answer).partition(b"\r\n\r\n")[2] == data
    finally:
        (run_path / "weights.pt").unlink()


def test_only_the_runs_regular_files_are_served_and_no_path_trick_reaches_another(
    served, run_path, tmp_path
):
    (tmp_path / "secret").write_text("not the run's")
    (run_path / "album").mkdir(exist_ok=True)
    (run_path / "album" / "ep.npz").write_bytes(b"episode")
    os.mkfifo(run_path / "pipe")
    try:
        for path in (
            "/files/knobs.json.lock/",
            "/files/knobs.json/",
            "/files/./config.json",
            "/files/album/./ep.npz",
            "/files/album//ep.npz",
            "/files/pipe",  # a FIFO: never opened (it would pin the thread)
            f"/files/{TOKEN_FILE}",
        ):
            status, body = request(served.port, "GET", path, served.watch)
            assert status == 404 and b"not the run's" not in body, path
        assert request(served.port, "GET", "/files/album/ep.npz", served.watch) == (200, b"episode")
        status, body = request(served.port, "GET", "/api/files", served.watch)
        assert "pipe" not in {f["path"] for f in json.loads(body)["files"]}
    finally:
        (run_path / "pipe").unlink()


def test_a_folder_swapped_for_a_link_leads_nowhere(tmp_path):
    """Each part of a path is opened beneath the run directory without following a link: a
    folder replaced by a link to elsewhere (between a listing and a fetch) serves nothing."""
    root = tmp_path / "run"
    (root / "album").mkdir(parents=True)
    (root / "album" / "ep.npz").write_bytes(b"episode")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "ep.npz").write_bytes(b"secret")
    fd = open_served(root, "album/ep.npz")
    assert fd is not None and os.read(fd, 100) == b"episode"
    os.close(fd)
    (root / "album").rename(tmp_path / "moved")
    (root / "album").symlink_to(tmp_path / "outside")
    assert open_served(root, "album/ep.npz") is None


def test_the_watching_token_reads_and_only_the_steering_token_steers(served, run_path):
    knobs = (run_path / "knobs.json").read_bytes()
    assert request(served.port, "GET", "/api/files", None)[0] == 401
    assert request(served.port, "GET", "/api/files", served.watch + "x")[0] == 401
    assert request(served.port, "GET", "/files/config.json", served.watch)[0] == 200
    status, body = command(served, "SetKnobs", {"changes": {"horizon": 2}}, served.watch)
    assert status == 403 and "watches" in json.loads(body)["error"]
    assert (run_path / "knobs.json").read_bytes() == knobs


def test_every_command_the_window_refuses_is_refused_over_the_wire(served, run_path):
    knobs = (run_path / "knobs.json").read_bytes()
    refused = [
        ("StartRace", {"lanes": [{"size": 0}, {"size": 2}]}, "at least 1"),
        ("StartRace", {"lanes": [{}, {}], "replicas": 10**12}, "replicas"),
        ("StartRace", {"lanes": [{"changes": {"horizon": 99}}, {}]}, "horizon"),
        ("StartRace", {"lanes": [{"changes": {"\x1b[31mred": 1}}, {}]}, "not a live knob"),
        ("SetKnobs", {"changes": {"lane": 1}}, "not a live knob"),
        ("SetKnobs", {"changes": {"cfg": 1}}, "not a live knob"),
        ("SetKnobs", {"changes": {"\x1b]0;owned\x07": 1}}, "not a live knob"),
        ("RestartWorker", {"worker": 7}, "worker 7 is not"),  # would start a process of its own
        ("RestartWorker", {"worker": -3}, "worker -3 is not"),
        ("RemoveWorker", {"worker": 10**6}, "is not in the run"),
    ]
    for name, fields, why in refused:
        status, body = command(served, name, fields)
        error = json.loads(body)["error"]
        assert status == 400 and why in error, (name, fields, error)
        assert "\x1b" not in error and "TypeError" not in error and "keyword" not in error
    assert (run_path / "knobs.json").read_bytes() == knobs  # nothing was changed
    assert command(served, "SetKnobs", {"changes": {"horizon": 2}})[0] == 200
    # The notices on the serving terminal carry no escape sequence
    assert wait_until(lambda: any("owned" in line for line in served.lines), 10)
    assert not any("\x1b" in line for line in served.lines)


def test_a_run_has_a_cap_on_workers_that_adding_one_cannot_pass(tmp_path):
    from workers.rundir.settings import MAX_WORKERS

    run = Run.create(tmp_path / "run", tiny_run(100), RunSettings(workers=MAX_WORKERS, pack=1))
    server = Served(run.path)
    try:
        status, body = command(server, "AddWorker", {"lane": None})
        assert status == 400 and f"at most {MAX_WORKERS}" in json.loads(body)["error"]
        assert not run.requests.path.exists()  # nothing asked of the owner
    finally:
        server.stop()


def test_new_tokens_lock_the_old_ones_out_even_of_a_server_going_on(served, run_path):
    old = served.steer
    other = Served(run_path, "--new-token")
    try:
        assert other.steer != old
        assert wait_until(
            lambda: request(served.port, "GET", "/api/hello", old)[0] == 401, timeout=10
        )
        assert request(served.port, "GET", "/api/hello", other.steer)[0] == 200
    finally:
        other.stop()
        served.steer, served.watch = other.steer, other.watch


def test_the_token_file_is_never_written_through_a_link_nor_taken_when_others_read_it(
    tmp_path,
):
    run = Run.create(tmp_path / "run", tiny_run(100), RunSettings(workers=2, pack=1))
    token = run.path / TOKEN_FILE
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("keep")
    token.symlink_to(elsewhere)

    def serve(*flags: str) -> subprocess.CompletedProcess:
        return launch("serve", str(run.path), "--port", "0", *flags, timeout=60)

    result = serve()
    assert result.returncode == 2 and "symbolic link" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and elsewhere.read_text() == "keep"
    token.unlink()
    token.write_text(json.dumps({"watch": "w" * 43, "steer": "s" * 43}))
    token.chmod(0o644)
    result = serve()
    assert result.returncode == 2 and "read by others" in result.stderr
    token.unlink()
    token.mkdir()  # not a file, and in the way of new ones: one line each, no traceback
    result = serve()
    assert result.returncode == 2 and "not a regular file" in result.stderr
    result = serve("--new-token")
    assert result.returncode == 2 and result.stderr.startswith("error: cannot write")
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_flags_of_serve_are_one_line(tmp_path):
    run = Run.create(tmp_path / "run", tiny_run(100), RunSettings(workers=2, pack=1))
    for flags in (["--port", "70000"], ["--port", "-1"], ["--port", "http"]):
        result = launch("serve", str(run.path), *flags, timeout=60)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, flags
        assert "Traceback" not in result.stderr


def test_the_tunnel_line_names_the_address_served_on(tmp_path):
    from workers.remote.server import RunServer

    run = Run.create(tmp_path / "run", tiny_run(100), RunSettings(workers=2, pack=1))
    server = RunServer("127.0.0.2", 0)
    server.start(run.path)
    try:
        text = server.instructions()
    finally:
        server.stop()
    assert f"-L {server.port}:127.0.0.2:{server.port}" in text
    assert "ExitOnForwardFailure=yes" in text
    assert "token=" not in text  # the command to type carries no token (ps, shell history)


def test_out_of_descriptors_the_door_backs_off_instead_of_spinning(run_path):
    """Under a descriptor limit the flood reaches, the accept loop does not spin (its CPU time
    stays a fraction of the wall time) and the token holder still gets in."""
    env = {**os.environ, "TDMPC2_LIVE_NO_BOOTSTRAP": "1", "OMP_NUM_THREADS": "1"}
    script = (
        "import resource, sys, runpy; resource.setrlimit(resource.RLIMIT_NOFILE, (60, 60)); "
        f"sys.argv = ['launch.py', 'serve', {str(run_path)!r}, '--port', '0']; "
        f"runpy.run_path({str(ROOT / 'launch.py')!r}, run_name='__main__')"
    )
    server = Served.__new__(Served)
    server.proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=ROOT,
    )
    server.lines = []
    threading.Thread(target=server._read, daemon=True).start()
    try:
        assert wait_until(lambda: any("watching token" in ln for ln in server.lines), 60)
        port = int(re.search(r"on 127\.0\.0\.1:(\d+)", server.lines[0])[1])
        watch = re.search(r"watching token: (\S+)", server.lines[-2])[1]
        flood = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(120)]
        try:
            cpu, wall = server.cpu_seconds(), time.monotonic()
            time.sleep(2)
            spent = (server.cpu_seconds() - cpu) / (time.monotonic() - wall)
            assert spent < 0.5, f"the door spun at {spent:.0%} of a core"
            for sock in flood[:40]:  # room again: the token holder is answered
                sock.close()
            assert request(port, "GET", "/api/hello", watch)[0] == 200
        finally:
            for sock in flood:
                sock.close()
    finally:
        server.stop()


def test_a_flood_from_one_address_pushes_out_its_own_connections_not_a_late_head(tmp_path):
    """Through `ssh -L` a head arrives a round trip after its connection; connections from
    another address, opened faster than the waiting room holds them, close their own oldest
    and never the token holder's, whose head comes late."""
    from workers.remote.gate import Gate, Limits

    listener = socket.create_server(("127.0.0.1", 0))
    answer = b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"
    room = Limits(max_waiting=8)
    gate = Gate(listener, lambda sock, head: sock.sendall(answer), lambda head: True, "t", room)
    door = threading.Thread(target=gate.serve, daemon=True)
    door.start()
    port = listener.getsockname()[1]
    try:
        holder = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert wait_until(lambda: gate.waiting() == 1, 10)
        flood = [
            socket.create_connection(
                ("127.0.0.1", port), timeout=10, source_address=("127.0.0.2", 0)
            )
            for _ in range(40)
        ]
        assert wait_until(lambda: gate.evicted >= 30, 10) and gate.waiting() == 8
        holder.sendall(b"GET /api/hello HTTP/1.1\r\n\r\n")
        assert holder.recv(100).startswith(b"HTTP/1.0 200")
        for sock in flood + [holder]:
            sock.close()
    finally:
        gate.stop()
        door.join(10)
        listener.close()
