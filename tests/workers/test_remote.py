"""A run served to another machine (workers/remote/), on loopback only: the mirror equals the run
directory and fetches only what changed, a dropped link or a restarted server loses nothing,
nobody gets in without the token or out of the run directory, and commands are checked as the
run checks them. Runs here are created but never started: no worker process."""

import http.client
import json
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import tiny_run as tiny
from conftest import wait_until
from helpers.mirror_files import tree

from agent.errors import UserError
from workers.remote.connected import ConnectedRun
from workers.remote.link import LinkDown
from workers.remote.mirror import STATE, Mirror
from workers.remote.server import RunServer
from workers.remote.tokens import TOKEN_FILE
from workers.remote.wire import (
    REMOTE_COMMANDS,
    decode_command,
    encode_command,
    split_url,
)
from workers.run.commands import (
    AddWorker,
    Checkpoint,
    ChooseShowcase,
    Pause,
    Promote,
    RemoveWorker,
    RestartWorker,
    Resume,
    SetKnobs,
    StartRace,
    Stop,
)
from workers.run.owner import Run, RunSettings
from workers.rundir.directory import atomic_write_bytes
from workers.rundir.lanes import Lane
from workers.rundir.records import Episode


@pytest.fixture
def served(tmp_path):
    run = Run.create(tmp_path / "run", tiny(100), RunSettings(workers=2, pack=1))
    server = RunServer("127.0.0.1", 0)
    server.start(run.path)
    yield run, server
    server.stop()


def mirror_of(server: RunServer, folder: Path) -> Mirror:
    base, token = split_url(server.connect_url())
    mirror = Mirror(base, token, folder)
    mirror.first_copy()
    return mirror


def file_bytes(mirror: Mirror) -> int:
    """What the mirror fetched of the files themselves (not the listings)."""
    return mirror.bytes_in - mirror.bytes_by["listing"]


def append_episodes(run: Run, worker: int, first: int, count: int) -> None:
    with open(run.path / f"worker-{worker}.jsonl", "a") as f:
        for i in range(first, first + count):
            line = Episode(step=10 * i, time=1.0 + i, ret=float(i), length=10, worker=worker)
            f.write(json.dumps(line.to_json()) + "\n")


def test_the_mirror_equals_the_run_and_fetches_only_what_changed(served, tmp_path):
    run, server = served
    append_episodes(run, 0, 0, 5)
    (run.path / "album").mkdir(exist_ok=True)
    atomic_write_bytes(run.path / "album" / "ep.npz", b"x" * 5000)
    mirror = mirror_of(server, tmp_path / "mirror")
    assert tree(tmp_path / "mirror") == tree(run.path) and "worker-0.jsonl" in tree(run.path)
    before = file_bytes(mirror)
    # An append comes as its new bytes only; a replaced file whole; a removed one goes.
    size = (run.path / "worker-0.jsonl").stat().st_size
    append_episodes(run, 0, 5, 3)
    added = (run.path / "worker-0.jsonl").stat().st_size - size
    atomic_write_bytes(run.path / "album" / "ep.npz", b"y" * 700)
    (run.path / "config.json").rename(run.path / "moved.json")  # vanished, and a new file
    # What is never served: dot files, locks, and a link out of the run directory.
    (tmp_path / "secret").write_text("not the run's")
    (run.path / "leak").symlink_to(tmp_path / "secret")
    (run.path / ".hidden").write_text("local")
    (run.path / "x.lock").write_text("")
    mirror.sync()
    moved = len((run.path / "moved.json").read_bytes())
    assert file_bytes(mirror) - before == added + 700 + moved
    assert tree(tmp_path / "mirror") == tree(run.path)
    assert not (tmp_path / "mirror" / "leak").exists()
    assert not (tmp_path / "mirror" / "config.json").exists()
    assert not (tmp_path / "mirror" / TOKEN_FILE).exists()
    # A file that shrank (a failed write taken back) is fetched whole again.
    data = (
        (run.path / "worker-1.jsonl").read_bytes()
        if (run.path / "worker-1.jsonl").exists()
        else b""
    )
    (run.path / "worker-1.jsonl").write_bytes(data + b'{"kind": "x"}\n')
    mirror.sync()
    os.truncate(run.path / "worker-1.jsonl", len(data))
    mirror.sync()
    assert tree(tmp_path / "mirror") == tree(run.path)
    listed = mirror.bytes_by["listing"]
    assert mirror.sync() == 0  # nothing changed: nothing fetched, the listing not sent again
    assert mirror.bytes_by["listing"] == listed and listed > 0


def test_a_mirror_opened_again_goes_on_from_what_it_holds(served, tmp_path):
    run, server = served
    append_episodes(run, 0, 0, 50)
    mirror_of(server, tmp_path / "mirror")
    append_episodes(run, 0, 50, 1)
    again = mirror_of(server, tmp_path / "mirror")  # a window opened later: .mirror.json
    assert file_bytes(again) < 200  # the one new line, not the file
    assert tree(tmp_path / "mirror") == tree(run.path)


def test_a_torn_answer_is_fetched_again_and_nothing_is_doubled(served, tmp_path, monkeypatch):
    run, server = served
    mirror = mirror_of(server, tmp_path / "mirror")
    append_episodes(run, 0, 0, 20)
    real = http.client.HTTPResponse.read1

    def torn(self, amt=-1):
        data = real(self, amt)
        if self.getheader("Content-Range") and len(data) > 100:  # a record's fetch, cut off
            raise http.client.IncompleteRead(data[:100])
        return data

    monkeypatch.setattr(http.client.HTTPResponse, "read1", torn)
    with pytest.raises(LinkDown, match="IncompleteRead"):
        mirror.sync()
    monkeypatch.setattr(http.client.HTTPResponse, "read1", real)
    mirror.sync()
    assert tree(tmp_path / "mirror") == tree(run.path)


def test_a_dropped_link_and_a_restarted_server_lose_no_line(served, tmp_path):
    """Records keep coming while the server is down; the window says so, then catches up."""
    run, server = served
    base, token = split_url(server.connect_url())
    mirror = Mirror(base, token, tmp_path / "mirror")
    mirror.first_copy()
    notes: list[str] = []
    mirror.start(notes.append)

    def write(lines: range) -> None:
        for i in lines:
            append_episodes(run, i % 2, i, 1)
            atomic_write_bytes(run.path / "knobs-like.json", f'{{"v": {i}}}'.encode())

    write(range(0, 20))
    assert wait_until(lambda: tree(tmp_path / "mirror") == tree(run.path), timeout=10)
    port = server.port
    server.stop()  # the server goes away; the records go on
    assert wait_until(lambda: any("link down" in n for n in notes), timeout=10)
    assert mirror.state().startswith("link down")
    write(range(20, 40))
    writer = threading.Thread(target=write, args=(range(40, 60),))  # on while it catches up
    again = RunServer("127.0.0.1", port)  # restarted on the same port: the same token
    again.start(run.path)
    writer.start()
    try:
        writer.join()
        assert wait_until(lambda: tree(tmp_path / "mirror") == tree(run.path), timeout=20)
        assert any(n.startswith("link back") for n in notes) and mirror.state() == ""
        lines = (tmp_path / "mirror" / "worker-0.jsonl").read_text().splitlines()
        assert [json.loads(x)["step"] for x in lines] == [10 * i for i in range(0, 60, 2)]
    finally:
        mirror.stop()
        again.stop()
    assert json.loads((tmp_path / "mirror" / STATE).read_text())["worker-0.jsonl"][1] == len(
        (run.path / "worker-0.jsonl").read_bytes()
    )


def ask(server: RunServer, path: str, token: str | None, body: dict | None = None):
    """(status, JSON answer) of one raw request."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{path}", data=data, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            raw = answer.read()
            return answer.status, raw
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_nobody_gets_in_without_the_token_nor_out_of_the_run(served, tmp_path):
    run, server = served
    (tmp_path / "secret").write_text("not the run's")
    (run.path / "leak").symlink_to(tmp_path / "secret")
    assert ask(server, "/api/files", None)[0] == 401
    assert ask(server, "/api/files", "wrong" + server.token)[0] == 401
    assert ask(server, "/api/command", None, encode_command(Pause()))[0] == 401
    assert not run.requests.path.exists()  # refused before anything was done
    status, body = ask(server, "/api/files", server.token)
    assert status == 200 and "config.json" in {f["path"] for f in json.loads(body)["files"]}
    assert ask(server, "/files/config.json", server.token) == (
        200,
        (run.path / "config.json").read_bytes(),
    )
    for path in (
        "/files/../secret",
        "/files/%2e%2e/secret",
        "/files/album/../../secret",
        "/files//etc/passwd",
        "/files/leak",
        f"/files/{TOKEN_FILE}",
        "/files/knobs.json.lock",
        "/elsewhere",
    ):
        status, body = ask(server, path, server.token)
        assert status == 404 and b"not the run's" not in body and server.token.encode() not in body


def test_commands_are_checked_as_the_run_checks_them(served, tmp_path):
    run, server = served
    knobs = (run.path / "knobs.json").read_bytes()
    for bad in (
        encode_command(SetKnobs({"horizon": 99})),  # out of range: the run's own check
        encode_command(SetKnobs({"no_such_knob": 1})),
        {"command": "SetKnobs", "fields": {"changes": {"horizon": "3"}}},
        {"command": "SetKnobs", "fields": {"changes": {}, "lane": True}},
        {"command": "FormatDisk", "fields": {}},
        {"command": "RemoveWorker", "fields": {"worker": 1, "path": "/"}},
        ["not", "a", "command"],
    ):
        status, body = ask(server, "/api/command", server.token, bad)
        assert status == 400 and json.loads(body)["error"], bad
    assert (run.path / "knobs.json").read_bytes() == knobs
    version = run.knobs.values()[0]
    status, body = ask(
        server, "/api/command", server.token, encode_command(SetKnobs({"horizon": 2}))
    )
    assert status == 200 and json.loads(body)["value"] == version + 1
    assert run.knobs.values()[1]["horizon"] == 2
    status, _ = ask(server, "/api/command", server.token, encode_command(Pause()))
    assert status == 200 and run.serve_requests()[0].action == "pause"  # to the owner
    server.read_only = True
    knobs = (run.path / "knobs.json").read_bytes()
    status, body = ask(
        server, "/api/command", server.token, encode_command(SetKnobs({"horizon": 3}))
    )
    assert status == 403 and "read-only" in json.loads(body)["error"]
    assert (run.path / "knobs.json").read_bytes() == knobs and run.serve_requests() == []


@pytest.mark.parametrize(
    "command",
    [
        SetKnobs({"horizon": 3, "temperature": 0.5}, lane=1),
        SetKnobs({"iterations": 2}),
        Pause(),
        Resume(),
        Checkpoint(),
        Stop(),
        AddWorker(1),
        AddWorker(),
        RemoveWorker(2),
        RestartWorker(),
        StartRace((Lane({"horizon": 1}, size=2), Lane(size=1, merges=False)), replicas=3),
        Promote(1, weights=False, replica=2),
    ],
)
def test_a_command_travels_as_json_and_comes_back_the_same(command):
    assert decode_command(json.loads(json.dumps(encode_command(command)))) == command


def test_every_command_that_changes_the_run_travels():
    assert {type(c) for c in (SetKnobs({}), Pause(), StartRace(()), Promote(0))} <= set(
        REMOTE_COMMANDS
    )
    assert len(REMOTE_COMMANDS) == 10


def test_the_address_is_read_from_what_the_server_printed():
    assert split_url("http://localhost:8642/?token=abc") == ("http://localhost:8642", "abc")
    assert split_url("localhost:9/?token=t") == ("http://localhost:9", "t")
    assert split_url("http://localhost:8642") == ("http://localhost:8642", "")  # asked apart
    for bad in (
        "ftp://x:1/?token=secret",
        "http://x:port/?token=secret",
        "http://:1/?token=secret",
    ):
        with pytest.raises(UserError) as refused:
            split_url(bad)
        assert "secret" not in str(refused.value)  # an error message never shows the token


@pytest.mark.parametrize("race", [False, True])
def test_a_connected_run_sees_what_an_attached_one_sees_and_steers_the_run(tmp_path, race):
    """A plain run and a race (2 lanes of 1 worker), records made up: events, knobs, the race
    record come through the mirror as they are; a knob change goes to the served run."""
    lanes = [Lane({"iterations": 1}), Lane({"iterations": 2})] if race else None
    run = Run.create(tmp_path / "run", tiny(100), RunSettings(workers=2, pack=1), lanes=lanes)
    append_episodes(run, 0, 0, 4)
    append_episodes(run, 1, 0, 3)
    server = RunServer("127.0.0.1", 0)
    server.start(run.path)
    connected = ConnectedRun.connect(server.connect_url(), tmp_path / "mirror")
    try:
        attached = Run.attach(run.path)
        seen = attached.new_events()
        assert connected.new_events() == seen and len(seen) == 7
        assert connected.race.record() == attached.race.record()
        assert connected.knobs.values() == attached.knobs.values()
        assert [w["step"] for w in connected.workers.progress()] == [30, 20]
        assert "connected to http://127.0.0.1" in connected.wording.label
        version = connected.do(SetKnobs({"horizon": 2}, lane=1 if race else None)).value
        assert attached.race.record().version == version  # the served run has it at once
        assert wait_until(lambda: connected.race.record() == attached.race.record(), timeout=10)
        with pytest.raises(UserError, match="horizon"):
            connected.do(SetKnobs({"horizon": 99}))
    finally:
        connected.stop()
        server.stop()
    with pytest.raises(UserError, match="down"):
        connected.do(Pause())  # nobody answers now: refused, nothing sent


def test_a_port_in_use_is_refused_in_one_line():
    first = RunServer("127.0.0.1", 0)
    try:
        with pytest.raises(UserError, match=f"port {first.port} .* in use"):
            RunServer("127.0.0.1", first.port)
    finally:
        first.stop()


def test_a_server_gone_wrong_cannot_write_outside_the_mirror(tmp_path):
    """The window trusts no path a server lists: one out of the mirror, absolute, or over the
    mirror's own notes is never fetched."""
    import http.server

    class Rogue(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            names = ["../escape", "/tmp/abs", ".mirror.json", "a/../../escape", "fine.jsonl"]
            files = [{"path": n, "size": 3, "ino": 1, "mtime": 1} for n in names]
            listing = "api" in self.path
            body = json.dumps({"files": files}).encode() if listing else b"bad"
            self.send_response(200 if listing else 206)
            self.send_header("Content-Range", "bytes 0-2/3")
            self.send_header("X-Ino", "1")
            self.send_header("X-Mtime", "1")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    rogue = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Rogue)
    threading.Thread(target=rogue.serve_forever, daemon=True).start()
    try:
        mirror = Mirror(f"http://127.0.0.1:{rogue.server_port}", "t", tmp_path / "m" / "mirror")
        mirror.first_copy()
    finally:
        rogue.shutdown()
    assert (tmp_path / "m" / "mirror" / "fine.jsonl").read_bytes() == b"bad"
    assert not (tmp_path / "m" / "escape").exists() and not (tmp_path / "escape").exists()
    assert json.loads((tmp_path / "m" / "mirror" / STATE).read_text()) == {"fine.jsonl": [1, 3, 1]}


def test_a_connected_window_fetches_only_the_weights_it_shows_and_not_a_windows_files(
    served, tmp_path
):
    """Of the workers' own weights, only the shown worker's travel (each is the model's size,
    rewritten at every merge); worker 0's checkpoint stands in for merged weights not made yet.
    The served run's player log and media are another window's: this one writes its own."""
    run, server = served
    for folder in ("merge", "checkpoints", "media"):
        (run.path / folder).mkdir(exist_ok=True)
        for k in (0, 1):
            atomic_write_bytes(run.path / folder / f"worker-{k}.pt", b"w" * 100)
    (run.path / "player.jsonl").write_text('{"kind": "showcase_episode"}\n')
    (tmp_path / "mirror").mkdir()
    (tmp_path / "mirror" / "player.jsonl").write_text("this window's own\n")
    connected = ConnectedRun.connect(server.connect_url(), tmp_path / "mirror")
    try:
        held = set(tree(tmp_path / "mirror"))
        assert "checkpoints/worker-0.pt" in held and "merge/members.json" in held
        others = {"player.jsonl", "media/worker-0.pt", "media/worker-1.pt"}
        deferred = {"merge/worker-0.pt", "merge/worker-1.pt", "checkpoints/worker-1.pt"}
        assert connected.link.deferred == deferred | others and not deferred & held
        connected.do(ChooseShowcase(source=1))  # worker 1's weights in the viewport
        wanted = {"merge/worker-1.pt", "checkpoints/worker-1.pt"}
        assert wait_until(lambda: wanted <= set(tree(tmp_path / "mirror")), timeout=10)
        assert connected.link.deferred == {"merge/worker-0.pt"} | others
        assert tree(tmp_path / "mirror") == {
            **{k: v for k, v in tree(run.path).items() if k not in connected.link.deferred},
            "player.jsonl": b"this window's own\n",
        }
    finally:
        connected.stop()


def test_a_large_file_does_not_hold_up_the_records_behind_it(served, tmp_path, monkeypatch):
    """Merged weights over a slow link take long: they come in a thread of their own while the
    records keep arriving."""
    import workers.remote.mirror as mirror_module

    run, server = served
    monkeypatch.setattr(mirror_module, "BULK_BYTES", 1000)
    base, token = split_url(server.connect_url())
    mirror = Mirror(base, token, tmp_path / "mirror")
    mirror.first_copy()
    slow, real = threading.Event(), Mirror._fetch

    def fetch(self, path, start=0):
        if path == "merge/merged.pt":
            slow.wait(10)  # a transfer that takes a while
        return real(self, path, start)

    monkeypatch.setattr(Mirror, "_fetch", fetch)
    mirror.start(lambda text: None)
    try:
        (run.path / "merge").mkdir(exist_ok=True)
        atomic_write_bytes(run.path / "merge" / "merged.pt", b"w" * 5000)
        assert wait_until(lambda: "merge/merged.pt" in mirror._pending, timeout=5)  # queued
        append_episodes(run, 0, 0, 3)
        copy = tmp_path / "mirror" / "worker-0.jsonl"
        assert wait_until(lambda: copy.exists() and copy.read_bytes().count(b"\n") == 3, 5)
        assert not (tmp_path / "mirror" / "merge" / "merged.pt").exists()  # still on its way
        slow.set()
        assert wait_until(lambda: tree(tmp_path / "mirror") == tree(run.path), timeout=10)
    finally:
        slow.set()
        mirror.stop()


def test_a_window_with_the_watching_token_says_so_and_steers_nothing(served, tmp_path):
    from workers.remote.tokens import WATCH

    run, server = served
    knobs = (run.path / "knobs.json").read_bytes()
    window = ConnectedRun.connect(server.connect_url(scope=WATCH), tmp_path / "mirror")
    try:
        assert "watching only" in window.wording.label
        with pytest.raises(UserError, match="this token watches"):
            window.do(SetKnobs({"horizon": 2}))
    finally:
        window.stop()
    assert (run.path / "knobs.json").read_bytes() == knobs
