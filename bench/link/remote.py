"""`bench --remote N`: a run of N workers served on loopback (as --serve serves it, in the
training's process) and watched by a connected window's run (a mirror) for `--seconds`: the delay
from a worker's episode record to the connected window's events (polled at the window's
controller's cadence), and from a knob change sent by the connected window to every worker's
knobs_applied (20 of each: median and worst); the bytes the link carried (per second, per agent
step, by kind); then agent steps/s of the same run without server or window, alternated
`--rounds` times."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from agent.config import Config
from viewer.controller import POLL_S
from workers.door import ConnectedRun, Episode, KnobsApplied, Run, RunServer, RunSettings, SetKnobs

SAMPLES = 20


def _rate(episodes: list[Episode]) -> float:
    """Agent steps/s of all workers together, from their episodes after the first 3 (seeding
    and pretraining left out)."""
    total = 0.0
    for worker in {e.worker for e in episodes}:
        mine = [e for e in episodes if e.worker == worker][3:]
        if len(mine) >= 2:
            total += (mine[-1].step - mine[0].step) / (mine[-1].time - mine[0].time)
    return total


def _watched(cfg: Config, settings: RunSettings, seconds: float, path: Path) -> dict:
    workers = settings.workers
    run = Run.create(path, cfg, settings)
    server = RunServer("127.0.0.1", 0)
    server.start(run.path)
    run.start()
    window = ConnectedRun.connect(server.connect_url(), path.with_name(path.name + "-mirror"))
    start, record_delays, knob_delays, episodes = time.time(), [], [], []
    horizon, sent, applied = cfg.horizon, None, {}
    while time.time() - start < seconds or min(len(knob_delays), len(record_delays)) < SAMPLES:
        now = time.time()
        for record in window.new_events():
            if isinstance(record, Episode):
                record_delays.append(now - record.time)
        for record in run.new_events():
            if isinstance(record, KnobsApplied):
                applied[(record.worker, record.version)] = record.time
            elif isinstance(record, Episode):
                episodes.append(record)
        if sent is not None and all((w, sent[0]) in applied for w in range(workers)):
            knob_delays.append(max(applied[(w, sent[0])] for w in range(workers)) - sent[1])
            sent = None
        # Knob changes once every worker trains: seeding has no planner, pretraining no step.
        training = all(w["state"] == "training" for w in run.workers.progress())
        if sent is None and len(knob_delays) < SAMPLES and training:
            horizon, asked = 2 if horizon != 2 else 3, time.time()
            sent = (window.do(SetKnobs({"horizon": horizon})).value, asked)
        if now - start > 3 * seconds:
            break  # a stalled run: report what there is
        time.sleep(POLL_S)
    elapsed = time.time() - start
    steps = sum(w["step"] for w in run.workers.progress())
    link = window.link
    window.stop()
    server.stop()
    run.stop()
    return {
        "record_to_window_s": _spread(record_delays),
        "knob_to_every_worker_s": _spread(knob_delays),
        "link_bytes_per_s": round(link.bytes_in / elapsed),
        "link_bytes_per_agent_step": round(link.bytes_in / max(steps, 1)),
        "link_bytes_by_kind": dict(link.bytes_by),
        "agent_steps_per_s_watched": round(_rate(episodes), 2),
    }


def _plain(cfg: Config, settings: RunSettings, seconds: float, path: Path) -> float:
    run = Run.create(path, cfg, settings)
    run.start()
    time.sleep(seconds)
    episodes = [r for r in run.new_events() if isinstance(r, Episode)]
    run.stop()
    return round(_rate(episodes), 2)


def _spread(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "median": round(statistics.median(values), 3),
        "worst": round(max(values), 3),
    }


def remote_benchmark(
    cfg: Config, workers: int, merge_every: int, seconds: float, root: str, rounds: int
) -> dict:
    settings = RunSettings(workers=workers, merge_every=merge_every)
    rounds_out = []
    for r in range(rounds):
        watched = _watched(cfg, settings, seconds, Path(root) / f"watched-{r}")
        plain = _plain(cfg, settings, seconds, Path(root) / f"plain-{r}")
        watched["agent_steps_per_s_plain"] = plain
        rounds_out.append(watched)
    return {
        "workers": workers,
        "task": cfg.task,
        "merge_every": merge_every,
        "seconds": seconds,
        "rounds": rounds_out,
    }
