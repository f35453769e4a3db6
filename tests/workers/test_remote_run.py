"""A training race served to a connected window, end to end on loopback: the window steers a
lane, sees what an attached window sees, and a server SIGKILLed mid-run and started again leaves
its mirror equal to the run directory byte for byte (less the weights of workers not shown).
Only real workers writing while the link
drops show that no line is lost or doubled."""

import os
import signal
import sys
from pathlib import Path

from conftest import events, start_program, wait_until
from conftest import tiny_run as tiny
from helpers.mirror_files import tree

from workers.race.text import race_of
from workers.remote.connected import WORKER_WEIGHTS, ConnectedRun
from workers.remote.server import RunServer
from workers.run.commands import SetKnobs
from workers.run.owner import Run, RunSettings
from workers.rundir.lanes import Lane
from workers.rundir.records import KnobsApplied

ROOT = Path(__file__).resolve().parents[2]


def serve(run_path: Path, port: int):
    """`launch.py serve RUN_DIR --port P` in its own process; returns it once it listens."""
    proc = start_program(
        sys.executable, str(ROOT / "launch.py"), "serve", str(run_path), "--port", str(port)
    )
    line = proc.stderr.readline()
    assert line.startswith("serving"), line + proc.stderr.read()
    return proc


def test_a_served_race_is_watched_and_steered_and_a_killed_server_loses_nothing(tmp_path):
    lanes = [Lane({"iterations": 1}), Lane({"iterations": 1})]
    settings = RunSettings(workers=2, pack=1, merge_every=40, checkpoint_every=100)
    run = Run.create(tmp_path / "run", tiny(320), settings, lanes=lanes)
    server = RunServer("127.0.0.1", 0)  # as --serve runs it: in the training's process
    server.start(run.path)
    run.start()
    connected = ConnectedRun.connect(server.connect_url(), tmp_path / "mirror")
    # A second window, through `launch.py serve` in its own process, which dies mid-run.
    second = RunServer("127.0.0.1", 0)
    port = second.port
    second.stop()
    proc = serve(run.path, port)
    url = server.connect_url().replace(f":{server.port}/", f":{port}/")
    watcher = ConnectedRun.connect(url, tmp_path / "mirror2")
    try:
        assert wait_until(lambda: run.workers.progress()[0]["step"] >= 120, timeout=240)
        version = connected.do(SetKnobs({"iterations": 2}, lane=1)).value
        os.kill(proc.pid, signal.SIGKILL)  # mid-episode: the workers write on
        proc.wait()
        assert wait_until(lambda: watcher.link.state().startswith("link down"), timeout=10)
        assert wait_until(lambda: run.workers.progress()[0]["step"] >= 200, timeout=240)
        proc = serve(run.path, port)  # the same port and token: the window comes back
        run.workers.wait()
        applied = [r for r in events(run, KnobsApplied, 1) if r.version == version]
        assert applied and applied[0].values["iterations"] == 2  # lane 1 took it
        for view in (connected, watcher):  # every file, less the workers' weights not shown

            def caught_up(view=view) -> bool:
                shown = {k: v for k, v in tree(run.path).items() if k not in view.link.deferred}
                return tree(view.path) == shown

            assert wait_until(caught_up, timeout=30), view.path
            assert view.link.deferred and all(WORKER_WEIGHTS.search(p) for p in view.link.deferred)
        assert "link back" in " ".join(watcher.notices())
        attached = Run.attach(run.path)
        assert connected.new_events() == attached.new_events()
        assert connected.race.record() == attached.race.record()
        assert [(w["state"], w["step"]) for w in connected.workers.progress()] == [
            (w["state"], w["step"]) for w in attached.workers.progress()
        ]
        table = race_of(run.path, attached.race.record(), attached.workers.progress(), run.cfg)
        assert table and table == race_of(
            connected.path, connected.race.record(), connected.workers.progress(), run.cfg
        )
    finally:
        proc.kill()  # first: a server process must not outlive a failed test
        proc.wait()
        for view in (connected, watcher):
            view.stop()
        server.stop()
        run.stop()
