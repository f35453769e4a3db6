"""`launch.py bench --viewer N`: the open window's frame rate and its cost on training.

One run of N workers, phases of equal length in this order: no window, window left alone
(a user watching), window with the mouse moving over it all the time (a user interacting),
no window again. Steps/s per worker in each phase give the window's cost; the two windowless
phases bracket the drift of the run itself. Needs a display (xvfb-run -a on a server); the
interacting phase moves the pointer with xdotool.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

from viewer.app import FRAME_H, FRAME_W, App
from viewer.controller import WORKER_NICE, Controller
from viewer.main import check_display
from workers.cli import build_bench_parser, config_from_args, default_run_dir, demo_requested
from workers.presets import UserError, demo_preset
from workers.run import Run, RunSettings


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


def viewer_benchmark(run: Run, seconds: float) -> dict:
    workers = run.settings.workers
    run.start(nice=WORKER_NICE)  # as the window starts them
    while not all(w["state"] == "training" for w in run.progress()):
        time.sleep(0.5)
    marks: list[tuple[float, list[float]]] = []  # (time, steps of each worker)

    def mark() -> None:
        marks.append((time.perf_counter(), [w["step"] for w in run.progress()]))

    def rate(i: int) -> float:
        (t0, s0), (t1, s1) = marks[i], marks[i + 1]
        return sum(b - a for a, b in zip(s0, s1)) / (t1 - t0) / workers

    controller = Controller((FRAME_H, FRAME_W))
    mark()
    time.sleep(seconds)
    mark()
    controller.open(lambda: run)  # starts the showcase player; the workers already run
    # One window for both windowed phases (Dear PyGui cannot open a second one per process):
    # watching for `seconds`, then the pointer moves over it for `seconds`.
    stop = threading.Event()

    def start_moving() -> None:
        mark()
        threading.Thread(target=_wiggle_pointer, args=(stop,), daemon=True).start()

    def stop_moving() -> None:
        mark()
        stop.set()

    timers = [threading.Timer(seconds, start_moving), threading.Timer(2 * seconds, stop_moving)]
    for timer in timers:
        timer.start()
    app = App(controller, None, max_seconds=2 * seconds + 0.5)
    app.run()
    run.stop_player()
    mark()  # (a half-second of closing the window is not counted below)
    time.sleep(seconds)
    mark()
    controller.shutdown()
    before, watching, interacting, after = rate(0), rate(1), rate(2), rate(4)
    baseline = (before + after) / 2
    t_watch, t_move, t_end = marks[1][0], marks[2][0], marks[3][0]
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
    }


def main(argv: list[str]) -> int:
    parser = build_bench_parser()
    parser.add_argument("--viewer", type=int, default=2, metavar="N", help="workers")
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
    result = viewer_benchmark(run, args.seconds)
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
    return 0
