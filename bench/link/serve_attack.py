"""`bench --serve-attack N`: a run served on loopback as `--serve` serves it (in the training's
process), attacked by another process that holds N half-open connections (half a request head
each, opened again as soon as the server closes one), against the same run unattacked, phase
after phase in alternating order over `--rounds`. Reported per phase: the token holder's request
times (a new connection, /api/hello then the listing, once a second: median and worst), the
server's threads (its handlers, most seen) and the training's agent steps/s."""

from __future__ import annotations

import multiprocessing
import selectors
import socket
import statistics
import threading
import time
from pathlib import Path

from agent.config import Config
from workers.door import Link, Run, RunServer, RunSettings

HEAD = b"GET /api/files HTTP/1.1\r\nHost: x\r\n"  # never the blank line that ends it


def _attack(port: int, connections: int, stop) -> None:  # another process
    selector = selectors.DefaultSelector()

    def open_one() -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(HEAD)
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        except OSError:
            time.sleep(0.01)

    for _ in range(connections):
        open_one()
    while not stop.is_set():
        for key, _ in selector.select(timeout=0.2):
            selector.unregister(key.fileobj)
            key.fileobj.close()  # the server closed (or answered) it: another in its place
            open_one()
        while len(selector.get_map()) < connections and not stop.is_set():
            open_one()


def _handlers() -> int:
    return sum(t.name.startswith("run-server_") for t in threading.enumerate())


def _phase(run: Run, server: RunServer, seconds: float, attackers: int) -> dict:
    stop = multiprocessing.get_context("spawn").Event()
    attacker = None
    if attackers:
        attacker = multiprocessing.get_context("spawn").Process(
            target=_attack, args=(server.port, attackers, stop), daemon=True
        )
        attacker.start()
        time.sleep(3)  # the flood in place
    link = Link(f"http://127.0.0.1:{server.port}", server.tokens.watch, timeout=30)
    times, threads = [], 0
    steps_before, start = sum(w["step"] for w in run.workers.progress()), time.monotonic()
    while time.monotonic() - start < seconds:
        asked = time.monotonic()
        ok = link.ask("/api/hello", 1 << 16).status == 200
        ok = ok and link.ask("/api/files", 1 << 24).status == 200
        times.append(time.monotonic() - asked if ok else float("inf"))
        threads = max(threads, _handlers())
        time.sleep(max(0.0, 1.0 - (time.monotonic() - asked)))
    elapsed = time.monotonic() - start
    steps = sum(w["step"] for w in run.workers.progress()) - steps_before
    if attacker is not None:
        stop.set()
        attacker.join(timeout=10)
    return {
        "half_open": attackers,
        "request_s": {
            "n": len(times),
            "median": round(statistics.median(times), 4),
            "worst": round(max(times), 4),
        },
        "handler_threads_most": threads,
        "handler_cap": server.gate.limits.handlers,
        "waiting_cap": server.gate.limits.max_waiting,
        "evicted": server.gate.evicted,
        "agent_steps_per_s": round(steps / elapsed, 2),
    }


def serve_attack_benchmark(
    cfg: Config, connections: int, workers: int, seconds: float, root: str, rounds: int
) -> dict:
    run = Run.create(Path(root) / "run", cfg, RunSettings(workers=workers))
    server = RunServer("127.0.0.1", 0)
    server.start(run.path)
    run.start()
    try:
        while not all(w["state"] == "training" for w in run.workers.progress()):
            time.sleep(1)  # seeding and pretraining run at other speeds than training
        phases = []
        for r in range(rounds):
            order = (connections, 0) if r % 2 == 0 else (0, connections)
            phases += [_phase(run, server, seconds, n) for n in order]
    finally:
        server.stop()
        run.stop()
    attacked = [p["agent_steps_per_s"] for p in phases if p["half_open"]]
    calm = [p["agent_steps_per_s"] for p in phases if not p["half_open"]]
    return {
        "task": cfg.task,
        "workers": workers,
        "seconds": seconds,
        "phases": phases,
        "agent_steps_per_s_attacked_over_calm": round(
            statistics.mean(attacked) / statistics.mean(calm), 3
        ),
    }
