"""The plain headless run on a loaded machine: torch's default threads against the thread policy.

    TDMPC2_LIVE_NO_BOOTSTRAP=1 .venv/bin/python -m bench.load [--seconds 60] [--load 1]

Starts `--load` CPU-bound processes (a Python busy loop each), then runs the plain headless
command (`launch.py --headless`) for `--seconds`, stops it with SIGTERM and reads its progress
lines (pretraining updates/s; training agent steps/s if it gets there): once with `--threads`
set to torch's default (what the command used before the policy), once as the policy chooses;
`--rounds` repeats the pair in the order before, after, after, before, ... so that a drift in
the machine's other work touches both alike.
Prints a Markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
BUSY = "while True: pass"


def _clean_env() -> dict[str, str]:
    """The environment a user's shell gives: no thread variables, so torch's default holds."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env["TDMPC2_LIVE_NO_BOOTSTRAP"] = "1"
    return env


def torch_default_threads() -> int:
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


def measure(args: argparse.Namespace, threads: int | None, run_dir: Path) -> dict:
    """One headless run of args.seconds; its speed, read from its progress lines."""
    command = [
        sys.executable,
        str(ROOT / "launch.py"),
        "--headless",
        f"--task={args.task}",
        f"--model-size={args.model_size}",
        "--device=cpu",
        f"--seed-steps={args.seed_steps}",
        "--steps=10000000",
        "--no-tensorboard",
        f"--run-dir={run_dir}",
    ]
    if threads is not None:
        command.append(f"--threads={threads}")
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=_clean_env())
    time.sleep(args.seconds)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=900)
    lines = stderr.splitlines()
    chosen = next((line for line in lines if line.startswith("torch threads")), "?")
    return {"threads_line": chosen, "exit": proc.returncode, **speeds(lines)}


ELAPSED = re.compile(r"\[(?:(\d+):)?(\d+):(\d+)<")
PRETRAINING = re.compile(r"pretraining (\d+)/\d+ updates")
STEPS = re.compile(r"\| (\d+)/\d+ \[")


def speeds(lines: list[str]) -> dict:
    """Pretraining updates/s and training agent steps/s from the progress lines (one every
    10 s when not on a terminal): the change between the first and last line of each phase."""
    seen: dict[str, list[tuple[float, int]]] = {"pretraining": [], "training": []}
    for line in lines:
        elapsed, steps = ELAPSED.search(line), STEPS.search(line)
        if not elapsed or not steps:
            continue
        h, m, s = (int(g or 0) for g in elapsed.groups())
        t = 3600 * h + 60 * m + s
        if pretraining := PRETRAINING.search(line):
            seen["pretraining"].append((t, int(pretraining.group(1))))
        elif ", training" in line:
            seen["training"].append((t, int(steps.group(1))))
    out: dict = {"updates": seen["pretraining"][-1][1] if seen["pretraining"] else 0}
    for phase, key in (("pretraining", "updates_per_s"), ("training", "steps_per_s")):
        points = seen[phase]
        ok = len(points) >= 2 and points[-1][0] > points[0][0]
        rate = (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0]) if ok else None
        out[key] = rate
    return out


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__)
    parser.add_argument("--task", default="cartpole-balance")
    parser.add_argument("--model-size", type=int, default=1)
    parser.add_argument("--seed-steps", type=int, default=500, help="also the pretraining updates")
    parser.add_argument("--seconds", type=float, default=60.0, help="per headless run")
    parser.add_argument("--load", type=int, default=1, help="busy-loop processes beside it")
    parser.add_argument("--rounds", type=int, default=1, help="before/after pairs")
    args = parser.parse_args(argv)
    default = torch_default_threads()
    load = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.load)]
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            order = []
            for r in range(args.rounds):
                pair = [("before", default), ("after", None)]
                order += pair if r % 2 == 0 else pair[::-1]
            for i, (label, threads) in enumerate(order):
                result = measure(args, threads, Path(tmp) / f"run-{i}")
                rows.append((label, result))
                print(f"{label}: {result}", file=sys.stderr)
    finally:
        for proc in load:
            proc.kill()
            proc.wait()
    cores = len(os.sched_getaffinity(0))
    print(
        f"{args.task} {args.model_size}M, {cores} cores, {args.load} busy-loop process(es) "
        f"beside it, {args.seconds:.0f} s per run, seed steps {args.seed_steps}; "
        f"load average at the end {os.getloadavg()[0]:.1f}\n"
    )
    print("| run | torch threads | pretraining updates/s | updates done | training steps/s |")
    print("|---|---|---|---|---|")
    for label, r in rows:
        threads = r["threads_line"].removeprefix("torch threads: ")
        print(
            f"| {label} | {threads} | {_fmt(r['updates_per_s'], 2)} | {r['updates']} | "
            f"{_fmt(r['steps_per_s'])} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
