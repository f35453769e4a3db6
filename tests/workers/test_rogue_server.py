"""A window that connects takes nothing on trust: a rogue server (a fixture here, on loopback)
serves a run whose task names a module it also serves, names its run `../`, answers with a gzip
bomb, a body longer than listed, a redirect, a file replaced mid-fetch, an answer without its
headers. Nothing is written outside the copy, nothing is imported, memory stays bounded, the
token goes to nobody else, and the mirror's thread survives every broken answer."""

import gzip
import http.server
import json
import threading
import time
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import pytest
from conftest import tiny_run, wait_until

from agent.envs.gym import gym_spec
from agent.errors import UserError
from workers.remote.connected import ConnectedRun, mirrors_root
from workers.remote.link import BrokenAnswer, Link, LinkDown
from workers.remote.mirror import STATE, Mirror
from workers.remote.wire import PROTOCOL, SERVER_NAME
from workers.run.owner import Run, RunSettings


class Rogue(http.server.BaseHTTPRequestHandler):
    """Answers as `self.server.script` says: hello, a listing and files, each overridable."""

    server_version = SERVER_NAME  # looks like a run server

    def log_message(self, *args):
        pass

    def do_GET(self):
        script = self.server.script
        script.setdefault("seen", []).append((self.path, dict(self.headers)))
        if self.path == "/api/hello":
            hello = {"server": SERVER_NAME, "protocol": PROTOCOL, "read_only": False}
            return self.answer(200, json.dumps({**hello, "run": script.get("run", "r")}).encode())
        if self.path == "/api/files":
            if "listing" in script:
                return self.answer(200, script["listing"], {"Content-Encoding": "gzip"})
            etag = {"ETag": script["etag"]} if "etag" in script else {}
            files = [
                {"path": p, "size": len(d), "ino": 7, "mtime": 1}
                for p, d in script["files"].items()
            ]
            return self.answer(200, json.dumps({"files": files}).encode(), etag)
        name = self.path.removeprefix("/files/")
        data = script["bodies"].get(name, script["files"].get(name, b""))
        headers = {"Content-Range": f"bytes 0-{len(data) - 1}/{len(data)}"}
        headers |= {"X-Ino": "7", "X-Mtime": "1"}
        headers |= script.get("headers", {}).get(name, {})
        return self.answer(script.get("status", {}).get(name, 206), data, headers)

    def answer(self, status, body, headers=()):
        self.send_response(status)
        for key, value in dict(headers).items():
            if value is not None:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def rogue(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Rogue)
    server.script = {"files": {}, "bodies": {}}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.base = f"http://127.0.0.1:{server.server_port}"
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """The user's cache folder, where copies go: in the test's own folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def run_files(tmp_path: Path, task: str) -> dict[str, bytes]:
    """A real run directory's record files, with its task changed to `task`."""
    run = Run.create(tmp_path / "made", tiny_run(100), RunSettings(workers=2, pack=1))
    config = json.loads((run.path / "config.json").read_text())
    config["config"]["task"] = task
    files = {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
    files["config.json"] = json.dumps(config).encode()
    return {k: v for k, v in files.items() if not k.startswith(".")}


EVIL = b"import pathlib; pathlib.Path(__import__('os').environ['MARKER']).write_text('ran')\n"


def test_a_served_task_that_names_a_served_module_imports_nothing(rogue, tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv("MARKER", str(marker))
    monkeypatch.chdir(tmp_path)  # the working directory, where a module would have been found
    files = run_files(tmp_path, "evil:Evil-v0")
    rogue.script["files"] = {**files, "evil.py": EVIL, "evil/__init__.py": EVIL}
    with pytest.raises(UserError, match="a run directory is data") as refused:
        ConnectedRun.connect(rogue.base + "/?token=t")
    assert "\n" not in str(refused.value) and not marker.exists()
    # Named by the person, the module is still never taken from the copy: it is not on
    # Python's path, and were it put there, it lies in a run directory.
    monkeypatch.setenv("TDMPC2_LIVE_MODULES", "evil")
    with pytest.raises(UserError, match="cannot import 'evil'"):
        ConnectedRun.connect(rogue.base + "/?token=t")
    (copy,) = mirrors_root().iterdir()
    assert (copy / "evil.py").exists()
    monkeypatch.syspath_prepend(str(copy))
    with pytest.raises(UserError, match="lies in a run directory"):
        gym_spec("evil:Evil-v0")
    assert not marker.exists()


def test_the_copy_goes_where_the_program_says_whatever_the_server_calls_its_run(
    rogue, tmp_path, cache
):
    rogue.script["run"] = "../../../escape"
    rogue.script["files"] = run_files(tmp_path, "cartpole-balance")
    run = ConnectedRun.connect(rogue.base + "/?token=t")
    try:
        assert run.path.parent == mirrors_root() and run.path.is_relative_to(cache)
        assert ".." not in run.path.name and "/" not in run.path.name
        assert not (tmp_path / "escape").exists() and not (cache / "escape").exists()
        # A second window on this machine keeps a copy of its own (the first holds its lock)
        second = ConnectedRun.connect(rogue.base + "/?token=t")
        try:
            assert second.path != run.path and second.path.parent == run.path.parent
        finally:
            second.stop()
    finally:
        run.stop()


def test_no_body_longer_than_listed_no_bomb_no_flood_of_files(rogue, tmp_path):
    rogue.script["files"] = {"weights.pt": b"w" * 1000}
    rogue.script["bodies"] = {"weights.pt": b"w" * 8_000_000}  # 8 MB for 1,000 listed
    rogue.script["headers"] = {"weights.pt": {"Content-Range": "bytes 0-999/1000"}}
    notes: list[str] = []
    mirror = Mirror(rogue.base, "t", tmp_path / "copy")
    mirror._note = notes.append
    mirror.first_copy()
    assert not (tmp_path / "copy" / "weights.pt").exists()
    assert any("weights.pt" in n and "broken" in n for n in notes)
    # A listing of well under 1 MB that would unpack to 640 MB
    pack = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    spaces = b" " * 1_000_000
    bomb = pack.compress(b'{"files": [') + b"".join(pack.compress(spaces) for _ in range(640))
    bomb += pack.compress(b"]}") + pack.flush()
    assert len(bomb) < 1_000_000
    rogue.script["listing"] = bomb
    tracemalloc.start()
    mirror.sync()  # a broken listing: a note, no exception, nothing fetched
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 200_000_000, f"{peak / 1e6:.0f} MB held for a {len(bomb) / 1e3:.0f} KB answer"
    assert any("listing" in n for n in notes)
    # More files than a copy holds
    del rogue.script["listing"]
    rogue.script["files"] = {f"f{i}.jsonl": b"" for i in range(60)}
    mirror.max_files = 50
    mirror._etag = ""
    mirror.sync()
    assert not (tmp_path / "copy" / "f0.jsonl").exists()
    # More bytes than a copy holds: the files over the cap are left out, with a note
    rogue.script["files"] = {f"g{i}.npz": b"x" * 100 for i in range(5)}
    mirror.max_files, mirror.max_total = 50, 250
    mirror.sync()
    held = sorted(p.name for p in (tmp_path / "copy").glob("g*.npz"))
    assert len(held) == 2 and any("the copy's cap" in n for n in notes)


def test_an_appended_piece_from_a_replaced_file_is_never_spliced(rogue, tmp_path):
    rogue.script["files"] = {"worker-0.jsonl": b"line 1\n"}
    mirror = Mirror(rogue.base, "t", tmp_path / "copy")
    mirror.first_copy()
    # The file grows on the server, but the piece comes from another file (another inode):
    # nothing is spliced, the copy lets go of the file (never left on disk uncounted in the
    # copy's total) and fetches it whole next time.
    rogue.script["files"] = {"worker-0.jsonl": b"line 1\nline 2\n"}
    rogue.script["bodies"] = {"worker-0.jsonl": b"OTHER!\n"}
    rogue.script["headers"] = {"worker-0.jsonl": {"X-Ino": "99", "Content-Range": "bytes 7-13/14"}}
    mirror.sync()
    assert not (tmp_path / "copy" / "worker-0.jsonl").exists() and mirror._held == {}
    rogue.script["bodies"], rogue.script["headers"] = {}, {}
    mirror.sync()
    assert (tmp_path / "copy" / "worker-0.jsonl").read_bytes() == b"line 1\nline 2\n"


def test_an_answer_without_its_headers_is_a_note_and_the_thread_goes_on(rogue, tmp_path):
    rogue.script["files"] = {"config.json": b"{}"}
    rogue.script["headers"] = {"config.json": {"X-Ino": None}}
    notes: list[str] = []
    mirror = Mirror(rogue.base, "t", tmp_path / "copy")
    mirror.first_copy()
    mirror.start(notes.append)
    try:
        assert wait_until(lambda: any("X-Ino" in n for n in notes), 10)
        rogue.script["headers"] = {}
        assert wait_until(lambda: (tmp_path / "copy" / "config.json").exists(), 10)
        assert mirror._thread.is_alive()
    finally:
        mirror.stop()
    assert json.loads((tmp_path / "copy" / STATE).read_text())["config.json"][0] == 7


def test_the_token_goes_to_no_proxy_and_follows_no_redirect(rogue, tmp_path, monkeypatch):
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Rogue)
    other.script = {"files": {}, "bodies": {}}
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        for name in ("http_proxy", "HTTP_PROXY", "all_proxy"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{other.server_port}")
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        rogue.script["files"] = {"config.json": b"{}"}
        rogue.script["status"] = {"config.json": 302}
        rogue.script["headers"] = {
            "config.json": {"Location": f"http://127.0.0.1:{other.server_port}/steal"}
        }
        notes: list[str] = []
        mirror = Mirror(rogue.base, "secret-token", tmp_path / "copy")
        mirror._note = notes.append
        mirror.first_copy()
        assert "seen" not in other.script  # neither as a proxy nor as a redirect's target
        assert not (tmp_path / "copy" / "config.json").exists()
        assert any("302" in n for n in notes)
    finally:
        other.shutdown()
        other.server_close()


def test_a_token_given_apart_from_the_address_and_never_echoed(tmp_path, monkeypatch):
    from workers.remote.wire import TOKEN_ENV, token_from

    assert token_from("in-url") == "in-url"
    (tmp_path / "token").write_text("from-file\n")
    assert token_from("", str(tmp_path / "token")) == "from-file"
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert token_from("") == "from-env"
    monkeypatch.delenv(TOKEN_ENV)
    with pytest.raises(UserError, match="no token"):
        token_from("")
    link = Link("http://127.0.0.1:9", "secret-token")
    with pytest.raises(Exception) as down:
        link.ask("/api/hello", 100)
    assert "secret-token" not in str(down.value)


def test_a_too_long_answer_is_refused_before_it_is_read(rogue):
    rogue.script["files"] = {"x": b""}
    rogue.script["bodies"] = {"x": b"y" * 5000}
    with pytest.raises(BrokenAnswer, match="over"):
        Link(rogue.base, "t").ask("/files/x", 100)


def test_folders_the_server_lists_and_drops_leave_nothing_behind(rogue, tmp_path):
    """Empty files in ever new folders, then gone: the copy removes the folders too, and no
    path deeper than a run's is written at all."""
    mirror = Mirror(rogue.base, "t", tmp_path / "copy")
    for n in range(3):
        rogue.script["files"] = {f"p{n}q{i}/d/d/x": b"" for i in range(50)}
        rogue.script["files"]["deep/" * 10 + "x"] = b""
        mirror.first_copy() if n == 0 else mirror.sync()
    rogue.script["files"] = {}
    mirror.sync()
    left = [p for p in (tmp_path / "copy").rglob("*") if not p.name.startswith(".")]
    assert left == [] and not (tmp_path / "copy" / "deep").exists()


def test_an_episode_file_that_unpacks_to_gigabytes_is_not_unpacked(tmp_path):
    """A replay or album episode from elsewhere: its zip's sizes are read first."""
    from workers.rundir.replays import read_replay

    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("states.npy", "w", force_zip64=True) as member:
            member.write(b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, ")
            member.write(b"'shape': (200000000,), }".ljust(85) + b"\n")
            for _ in range(800):
                member.write(bytes(1_000_000))
    assert path.stat().st_size < 2_000_000
    tracemalloc.start()
    assert read_replay(path) is None
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50_000_000, f"{peak / 1e6:.0f} MB to refuse {path.stat().st_size:,} bytes"


def test_a_listing_of_millions_of_empty_objects_is_refused_before_it_is_parsed(rogue, tmp_path):
    pack = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    bomb = pack.compress(b'{"files": [' + b"{}," * 3_000_000 + b"{}]}") + pack.flush()
    rogue.script["listing"] = bomb
    notes: list[str] = []
    mirror = Mirror(rogue.base, "t", tmp_path / "copy")
    mirror._note = notes.append
    tracemalloc.start()
    mirror.first_copy()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert any("listing" in n for n in notes)
    assert peak < 100_000_000, f"{peak / 1e6:.0f} MB for a {len(bomb) / 1e3:.0f} KB answer"


def test_a_server_that_sends_a_byte_now_and_then_does_not_hold_the_window(tmp_path):
    class Drip(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(30):
                time.sleep(0.5)
                try:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                except OSError:
                    return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Drip)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        link = Link(f"http://127.0.0.1:{server.server_port}", "t", timeout=1)
        with pytest.raises(LinkDown, match="too slowly"):
            link.ask("/api/hello", 64 * 1024)  # its whole time: 1 s + 1 s for 64 KB
    finally:
        server.shutdown()
        server.server_close()


def test_numbers_in_a_servers_headers_are_ascii_digits_or_broken(rogue, tmp_path):
    rogue.script["files"] = {"config.json": b"{}"}
    rogue.script["headers"] = {"config.json": {"X-Ino": "\u00b2"}}
    notes: list[str] = []
    mirror = Mirror(rogue.base, "t", tmp_path / "copy")
    mirror._note = notes.append
    mirror.first_copy()
    assert any("X-Ino" in n for n in notes) and not (tmp_path / "copy" / "config.json").exists()


def test_large_files_fetched_later_stay_within_the_copys_cap(rogue, tmp_path):
    """Files over 1 MB wait for the bulk thread: their sizes count in the copy's total from the
    moment they are queued, and the thread checks the cap again."""
    mirror = Mirror(rogue.base, "t", tmp_path / "copy")
    mirror.first_copy()
    mirror.max_total = 5_000_000
    notes: list[str] = []
    mirror.start(notes.append)
    try:
        rogue.script["files"] = {f"w{i}.pt": bytes(2_000_000) for i in range(10)}
        mirror.wake()
        assert wait_until(lambda: sum("left out" in n for n in notes) >= 8, 30)
        time.sleep(1)
    finally:
        mirror.stop()
    held = sum(p.stat().st_size for p in (tmp_path / "copy").glob("w*.pt"))
    assert 0 < held <= 5_000_000


@pytest.mark.parametrize("drip", ["status", "headers"])
def test_a_server_that_drips_its_status_or_headers_does_not_hold_the_window(tmp_path, drip):
    import socket as sockets

    listener = sockets.create_server(("127.0.0.1", 0))
    text = b"HTTP/1.0 200 OK\r\n" if drip == "status" else b"HTTP/1.0 200 OK\r\nX: " + b"y" * 40

    def serve():
        conn, _ = listener.accept()
        with conn:
            for byte in text:
                time.sleep(0.4)
                try:
                    conn.send(bytes([byte]))
                except OSError:
                    return

    threading.Thread(target=serve, daemon=True).start()
    try:
        link = Link(f"http://127.0.0.1:{listener.getsockname()[1]}", "t", timeout=1)
        started = time.monotonic()
        with pytest.raises(LinkDown, match="too slowly"):
            link.ask("/api/hello", 64 * 1024)
        assert time.monotonic() - started < 10  # its whole time: 2 s, not a byte's 1 s each
    finally:
        listener.close()


def test_files_a_copy_holds_under_odd_names_are_passed_over(tmp_path):
    from workers.rundir.album import album_workers, worker_entries

    folder = tmp_path / "run" / "album" / "worker-0"
    folder.mkdir(parents=True)
    (folder / "train-\u00b2\u00b3.npz").write_bytes(b"")
    (tmp_path / "run" / "album" / "worker-\u00b2").mkdir()
    assert worker_entries(tmp_path / "run", 0) == [] and album_workers(tmp_path / "run") == [0]


def test_an_episode_file_that_declares_more_than_it_holds_is_not_read(tmp_path):
    from workers.rundir.replays import read_replay

    path = tmp_path / "liar.npz"
    with zipfile.ZipFile(path, "w") as archive:
        header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000,), }"
        archive.writestr("states.npy", b"\x93NUMPY\x01\x00" + bytes([118, 0]) + header.ljust(118))
    assert read_replay(path) is None


def test_an_episode_file_the_player_could_not_play_is_not_read(tmp_path):
    """A replay from elsewhere whose metadata nests without end, whose step lasts NaN seconds
    (the playhead divides by it) or whose poses are text or NaN is passed over: the player
    thread that reads it has nothing to restart it."""
    import io
    import json

    import numpy as np

    from workers.rundir.replays import read_replay

    meta = dict(worker=0, phase="train", step=5, episode=1, step_seconds=0.04, time=1.0)

    def episode(name: str, states=None, **changes) -> Path:
        buffer = io.BytesIO()
        fields = {**meta, **changes}
        text = fields.pop("text", None) or json.dumps(fields)
        states = np.zeros((3, 4)) if states is None else states
        np.savez(buffer, states=states, rewards=np.ones(2, np.float32), meta=np.array(text))
        (tmp_path / name).write_bytes(buffer.getvalue())
        return tmp_path / name

    assert read_replay(episode("good.npz")).step_seconds == 0.04
    unplayable = [
        episode("deep.npz", text="[" * 100_000 + "]" * 100_000),
        episode("nan.npz", step_seconds=float("nan")),
        episode("infinite.npz", time=float("inf")),
        episode("nan-poses.npz", states=np.full((3, 4), np.nan)),
        episode("text-poses.npz", states=np.full((3, 4), "x")),
    ]
    assert [read_replay(path) for path in unplayable] == [None] * len(unplayable)


def test_a_token_that_is_not_a_servers_is_one_line_and_never_shown():
    with pytest.raises(UserError, match="not one a run server prints") as refused:
        Link("http://127.0.0.1:9", "SECRET1\nSECRET2")
    assert "SECRET" not in str(refused.value)
    with pytest.raises(UserError):
        Link("http://127.0.0.1:9", "s\u20acret")


def test_a_records_file_of_millions_of_lines_is_never_held_as_millions_of_objects():
    from workers.rundir.records import parse_records

    data = b"{}\n" * 300_000  # held at once: 300,000 dicts, about 20 MB
    tracemalloc.start()
    records, skipped = parse_records(data, 0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert records == [] and skipped == 300_000
    assert peak < 5_000_000, f"{peak / 1e6:.0f} MB for {len(data) / 1e6:.1f} MB of lines"


def test_files_the_copy_lets_go_of_leave_the_disk(rogue, tmp_path):
    """A server that answers 416, or from another file, for what it listed: the copy's file
    goes with its note, so the cap counts every byte on disk."""
    mirror = Mirror(rogue.base, "t", tmp_path / "copy")
    mirror.first_copy()
    for name, status in (("a.npz", 416), ("b.npz", 206)):
        rogue.script["files"] = {name: b"x" * 100}
        mirror.sync()
        assert (tmp_path / "copy" / name).exists()
        rogue.script["files"] = {name: b"y" * 100}  # replaced on the server (another mtime)
        rogue.script["status"] = {name: status}
        rogue.script["headers"] = {name: {"X-Ino": "8"}}  # the other file, if 206
        rogue.script["files"][name] = b"y" * 100
        mirror._held[name][2] = 0  # listed as changed
        mirror.sync()
        assert not (tmp_path / "copy" / name).exists() and name not in mirror._held


def test_a_torch_file_of_compressed_parts_is_refused_before_it_is_unpacked(tmp_path):
    """torch.save stores its parts whole; a file whose parts are compressed came from
    elsewhere and could unpack to gigabytes (the window loads the shown weights)."""
    import io

    import torch

    from agent.errors import WeightsError
    from workers.rundir.directory import load_state

    buffer = io.BytesIO()
    torch.save({"w": torch.zeros(1000)}, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as stored:
        parts = [(m.filename, stored.read(m)) for m in stored.infolist()]
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as packed:
        for name, data in parts:
            packed.writestr(name, data)
    with pytest.raises(WeightsError, match="compressed"):
        load_state(path)
    (tmp_path / "good.pt").write_bytes(buffer.getvalue())
    assert load_state(tmp_path / "good.pt")["w"].shape == (1000,)


def test_a_torch_file_of_parts_over_the_same_bytes_is_refused_before_it_is_unpacked(tmp_path):
    """Every part stored whole, but the zip's directory points many tensors' parts at one
    place (or claims parts larger than the file): torch would allocate each part anew, so a
    small file from elsewhere could fill the window's memory."""
    import io
    import struct

    import torch

    from agent.errors import WeightsError
    from workers.rundir.directory import load_state

    buffer = io.BytesIO()
    torch.save({"a": torch.zeros(1000), "b": torch.ones(1000)}, buffer)
    good = buffer.getvalue()
    with zipfile.ZipFile(io.BytesIO(good)) as stored:
        data = {m.filename.rsplit("/", 1)[-1]: m for m in stored.infolist()}
    first, second = data["0"], data["1"]
    entries = [i for i in range(len(good) - 4) if good[i : i + 4] == b"PK\x01\x02"]
    at = next(i for i in entries if good[i + 46 :].startswith(second.filename.encode()))
    shared = bytearray(good)  # the second tensor's part read from the first one's place
    shared[at + 42 : at + 46] = struct.pack("<I", first.header_offset)
    swollen = bytearray(good)  # a part claiming more bytes than the whole file
    swollen[at + 20 : at + 28] = struct.pack("<II", len(good) * 4, len(good) * 4)
    for name, crafted in (("shared.pt", shared), ("swollen.pt", swollen)):
        (tmp_path / name).write_bytes(bytes(crafted))
        with pytest.raises(WeightsError, match="overlapping"):
            load_state(tmp_path / name)
    (tmp_path / "good.pt").write_bytes(good)
    assert load_state(tmp_path / "good.pt")["b"].sum() == 1000


def test_a_listing_of_absurd_numbers_and_etags_breaks_nothing(rogue, tmp_path):
    notes: list[str] = []
    mirror = Mirror(rogue.base, "t", tmp_path / "copy")
    mirror._note = notes.append
    rogue.script["files"] = {"a.npz": b"x"}
    mirror.first_copy()
    huge = {"path": "b.npz", "size": 10**400, "ino": 1, "mtime": 1}
    rogue.script["listing"] = gzip.compress(json.dumps({"files": [huge]}).encode())
    mirror.sync()  # an entry of numbers no file has is passed over: no OverflowError
    assert not (tmp_path / "copy" / "b.npz").exists()
    mirror._etag = ""
    del rogue.script["listing"]
    rogue.script["etag"] = '"a\rb"'  # a header that cannot be sent back
    mirror.sync()
    assert "\r" not in mirror._etag and mirror.sync() == 0  # the next pass still runs


def test_a_server_that_cuts_its_answer_short_is_a_link_down(tmp_path):
    import socket as sockets

    listener = sockets.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 500)

    threading.Thread(target=serve, daemon=True).start()
    try:
        with pytest.raises(LinkDown, match="cut short"):
            Link(f"http://127.0.0.1:{listener.getsockname()[1]}", "t").ask("/x", 2000)
    finally:
        listener.close()


def test_the_torch_file_checked_is_the_file_loaded(tmp_path, monkeypatch):
    """A connected copy renames each fetched file over the old one: one renamed in between
    the check and the load (a rogue server's second version) is not what gets loaded."""
    import os

    import torch

    import workers.rundir.directory as directory

    shown, next_version = tmp_path / "merged.pt", tmp_path / "next.pt"
    torch.save({"w": torch.ones(3)}, shown)
    torch.save({"w": torch.zeros(3)}, next_version)
    checked = directory.stored_whole

    def check_then_swap(file):
        whole = checked(file)
        os.replace(next_version, shown)
        return whole

    monkeypatch.setattr(directory, "stored_whole", check_then_swap)
    assert directory.load_state(shown)["w"].sum() == 3
