"""`launch.py bench --viewer N`: the open window's frame rate and its cost on training.

One run of N workers, phases of equal length in this order: no window, window left alone
(a user watching), window with the mouse moving over it all the time (a user interacting),
no window again. Steps/s per worker in each phase give the window's cost; the two windowless
phases bracket the drift of the run itself. Needs a display (xvfb-run -a on a server); the
interacting phase moves the pointer with xdotool.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from agent.envs import env_of
from agent.errors import UserError
from bench.cli import build_bench_parser
from viewer.app import FRAME_H, FRAME_W, App
from viewer.controller import WORKER_NICE, Controller
from viewer.main import check_display
from workers.door import (
    LAYOUTS,
    MODES,
    Run,
    RunSettings,
    ShowPanes,
    config_from_args,
    default_run_dir,
    demo_preset,
    demo_requested,
)


def step_seconds(cfg) -> float:
    """Simulated seconds per agent step of the run's task."""
    env = env_of(cfg, 0)
    try:
        return env.control_timestep
    finally:
        env.close()


def _wiggle_pointer(stop: threading.Event) -> None:
    """Move the X pointer in a circle-ish path over the window until stopped."""
    xdotool = shutil.which("xdotool")
    i = 0
    while xdotool and not stop.is_set():
        x, y = 300 + (i * 37) % 800, 150 + (i * 23) % 500
        subprocess.run([xdotool, "mousemove", str(x), str(y)], check=False)
        i += 1
        time.sleep(0.05)


def frame_stats(stamps: list[float], work_ms: list[float], start: float, end: float) -> dict:
    """Frame rate and per-frame work of the frames drawn between start and end."""
    inside = [w for t, w in zip(stamps, work_ms) if start <= t < end]
    if not inside:
        return {"fps": 0.0}
    return {
        "fps": round(len(inside) / (end - start), 1),
        "work_ms_median": round(float(np.median(inside)), 2),
        "work_ms_p99": round(float(np.percentile(inside, 99)), 2),
        "work_ms_max": round(float(np.max(inside)), 2),
    }


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used so far; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def x_server_pids() -> list[int]:
    """The X servers on this machine (Xvfb under xvfb-run): part of what a window costs."""
    pids = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() in ("Xvfb", "Xorg", "Xwayland"):
                pids.append(int(comm.parent.name))
        except OSError:
            continue
    return pids


def viewport_stats(shown: list[tuple[float, dict]], start: float, end: float, dt: float) -> dict:
    """New viewport frames per second between start and end, what they showed (live or
    replay) and the replay's playback speed: simulated time advanced over wall time, between
    consecutive frames of one replayed episode (dt: simulated seconds per agent step)."""
    inside = [(t, info) for t, info in shown if start <= t < end]
    if not inside:
        return {"fps": 0.0}
    replays = [(t, i) for t, i in inside if i.get("replay")]
    simulated = wall = 0.0
    for (t0, a), (t1, b) in zip(replays, replays[1:]):
        same = (a["replay_worker"], a["weights_step"]) == (b["replay_worker"], b["weights_step"])
        if same and b["step"] >= a["step"] and b["step"] < b["replay_length"]:
            simulated, wall = simulated + (b["step"] - a["step"]) * dt, wall + t1 - t0
    return {
        "fps": round(len(inside) / (end - start), 1),
        "replay_share": round(len(replays) / len(inside), 2),
        "replay_speed": round(simulated / wall, 2) if wall else None,
    }


def viewer_benchmark(
    run: Run, seconds: float, warmup: float = 5.0, viewport: str = "auto", panes: str = "single"
) -> dict:
    workers = run.settings.workers
    run.start(nice=WORKER_NICE)  # as the window starts them
    while not all(w["state"] == "training" for w in run.workers.progress()):
        time.sleep(0.5)
    # (time, steps of each worker, CPU seconds of each process group)
    marks: list[tuple[float, list[float], dict[str, float]]] = []
    paces: dict[str, float] = {}  # the showcase's speed (share of real time) in each phase
    pids = {"window": [os.getpid()], "x_server": x_server_pids()}

    def mark() -> None:
        pids.update(workers=run.workers.pids(), player=run.showcase.pids())
        cpu = {name: sum(cpu_seconds(pid) for pid in group) for name, group in pids.items()}
        marks.append((time.perf_counter(), [w["step"] for w in run.workers.progress()], cpu))

    def rate(i: int) -> float:
        (t0, s0, _), (t1, s1, _) = marks[i], marks[i + 1]
        return sum(b - a for a, b in zip(s0, s1)) / (t1 - t0) / workers

    def cores(i: int) -> dict[str, float]:
        """CPU cores each process group used between mark i and mark i + 1."""
        (t0, _, c0), (t1, _, c1) = marks[i], marks[i + 1]
        return {name: round((c1[name] - c0.get(name, 0.0)) / (t1 - t0), 3) for name in c1}

    controller = Controller((FRAME_H, FRAME_W), viewport=viewport)
    mark()
    time.sleep(seconds)
    mark()
    controller.open(lambda: run)  # starts the showcase player; the workers already run
    if panes != "single":
        controller.send(ShowPanes(panes))  # after the open: the queue keeps their order
    app = App(controller, None)
    stop = threading.Event()

    def drive() -> None:
        # One window for both windowed phases (Dear PyGui cannot open a second one per
        # process). Its start-up (the player loading PyTorch and the task) is not measured:
        # phases start once the first showcase frame is on screen.
        deadline = time.monotonic() + 180
        while app.frame_info is None and time.monotonic() < deadline and not app.quit_requested:
            time.sleep(0.2)
        time.sleep(warmup)
        mark()  # watching: nobody touches the window
        time.sleep(seconds)
        paces["watching"] = (app.frame_info or {}).get("pace", 0.0)
        mark()  # interacting: the pointer moves over it all the time
        threading.Thread(target=_wiggle_pointer, args=(stop,), daemon=True).start()
        time.sleep(seconds)
        paces["interacting"] = (app.frame_info or {}).get("pace", 0.0)
        mark()
        stop.set()
        app.quit_requested = True

    threading.Thread(target=drive, daemon=True).start()
    app.run()
    run.showcase.stop()
    mark()  # (closing the window and the player is not counted below)
    time.sleep(seconds)
    mark()
    controller.shutdown()
    before, watching, interacting, after = rate(0), rate(2), rate(3), rate(5)
    shown, dt = list(app.showcase.shown), step_seconds(run.cfg)
    baseline = (before + after) / 2
    t_watch, t_move, t_end = marks[2][0], marks[3][0], marks[4][0]
    return {
        "workers": workers,
        "phase_seconds": seconds,
        "steps_per_s_per_worker": {
            "no_window_before": round(before, 2),
            "window_watching": round(watching, 2),
            "window_interacting": round(interacting, 2),
            "no_window_after": round(after, 2),
        },
        "window_cost_watching": round(1 - watching / baseline, 3),
        "window_cost_interacting": round(1 - interacting / baseline, 3),
        "window_watching": frame_stats(app.frame_stamps, app.work_ms, t_watch, t_move),
        "window_interacting": frame_stats(app.frame_stamps, app.work_ms, t_move, t_end),
        "showcase_pace": paces,
        "viewport": viewport,
        "panes": panes,
        "viewport_watching": viewport_stats(shown, t_watch, t_move, dt),
        "viewport_interacting": viewport_stats(shown, t_move, t_end, dt),
        "cores_used": {
            "no_window_before": cores(0),
            "window_watching": cores(2),
            "window_interacting": cores(3),
            "no_window_after": cores(5),
        },
    }


def main(argv: list[str]) -> int:
    parser = build_bench_parser()
    parser.add_argument("--viewer", type=int, default=2, metavar="N", help="workers")
    parser.add_argument(
        "--viewport", choices=MODES, default="auto", help="what the viewport shows (--viewer)"
    )
    parser.add_argument(
        "--panes",
        choices=LAYOUTS,
        default="single",
        help="the viewport's panes (--viewer): then-now-2 / then-now-4 tile album replays",
    )
    args = parser.parse_args(argv)
    try:
        check_display()
        preset = demo_preset(args.device) if demo_requested(args) else None
        cfg = config_from_args(args, preset)
        root = args.run_dir or str(default_run_dir(f"viewer-bench-{cfg.task}"))
        run = Run.create(root, cfg, RunSettings(workers=args.viewer, merge_every=10**6))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = viewer_benchmark(run, args.seconds, viewport=args.viewport, panes=args.panes)
    if args.json:
        print(json.dumps(result))
    else:
        for phase, rate in result["steps_per_s_per_worker"].items():
            print(f"{phase:>22}: {rate:6.2f} agent steps/s per worker")
        for name in ("watching", "interacting"):
            s = result[f"window_{name}"]
            print(
                f"window {name}: {s['fps']} fps, work per frame median {s['work_ms_median']} ms"
                f" (p99 {s['work_ms_p99']}, max {s['work_ms_max']}); cost on training "
                f"{result[f'window_cost_{name}'] * 100:.1f} %"
            )
        print("showcase speed (share of real time):", result["showcase_pace"])
        for name in ("watching", "interacting"):
            print(
                f"viewport {name} ({args.viewport}, panes {args.panes}):",
                result[f"viewport_{name}"],
            )
        for phase, used in result["cores_used"].items():
            print(f"cores used, {phase}: " + ", ".join(f"{k} {v}" for k, v in used.items()))
    return 0
