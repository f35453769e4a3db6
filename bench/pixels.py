"""Learning from pixels against states on this machine, in one run (BENCHMARKS.md, issue 55):

    python -m bench.pixels [--sizes 1,5] [--task walker-walk] [--repeats 10] [--render-steps 200]

An update, a plan and an env step (rendering included) at each model size, from states and from
pixels: `launch.py bench --json` in a process of its own for each, one after another, then
their ratios. Then what a 64x64 frame costs per agent step with each GL backend MuJoCo can use
here (EGL, OSMesa: MUJOCO_GL is read at import, so a process each): the pixel env's step
against the state env's, and one frame alone. One JSON line per measurement, then a table."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench_line(size: int, obs: str, task: str, repeats: int) -> dict:
    """`launch.py bench --json` of one model size and observation kind."""
    argv = [sys.executable, str(ROOT / "launch.py"), "bench", "--json", "--task", task]
    argv += ["--model-size", str(size), "--obs", obs, "--repeats", str(repeats)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def render_costs(task: str, steps: int) -> dict:
    """In this process (MUJOCO_GL as set): ms per agent step of the state env and of the pixel
    env (medians over `steps` steps after 10), and of one 64x64 frame alone."""
    import numpy as np

    from agent.envs import make_env

    result = {"gl": os.environ.get("MUJOCO_GL")}
    for obs in ("state", "rgb"):
        env = make_env(task, seed=0, obs=obs)
        env.reset(seed=0)
        actions = np.random.default_rng(0).uniform(-1, 1, (steps + 10, *env.action_space.shape))
        times = []
        for n, action in enumerate(actions.astype(np.float32)):
            start = time.perf_counter()
            *_, truncated, _ = env.step(action)
            if n >= 10:
                times.append((time.perf_counter() - start) * 1000)
            if truncated:
                env.reset()
        result[f"{obs}_step_ms"] = round(statistics.median(times), 3)
        if obs == "rgb":
            frames = []
            for _ in range(steps):
                start = time.perf_counter()
                env.pixel_frame()
                frames.append((time.perf_counter() - start) * 1000)
            result["frame_ms"] = round(statistics.median(frames), 3)
        env.close()
    result["render_ms_per_step"] = round(result["rgb_step_ms"] - result["state_step_ms"], 3)
    return result


def render_line(gl: str, task: str, steps: int) -> dict:
    """render_costs in a process whose MUJOCO_GL is `gl` (its error when it fails here)."""
    env = {**os.environ, "MUJOCO_GL": gl, "PYOPENGL_PLATFORM": gl}
    code = f"import json, bench.pixels as p; print(json.dumps(p.render_costs({task!r}, {steps})))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT
    )
    if out.returncode:
        return {"gl": gl, "error": (out.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,5", help="model sizes, comma-separated")
    parser.add_argument("--task", default="walker-walk")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--render-steps", type=int, default=200)
    args = parser.parse_args()
    rows = {}
    for size in (int(s) for s in args.sizes.split(",")):
        for obs in ("state", "rgb"):
            line = bench_line(size, obs, args.task, args.repeats)
            rows[size, obs] = line
            print(json.dumps({"size": size, "obs": obs, **line}), flush=True)
    renders = [render_line(gl, args.task, args.render_steps) for gl in ("egl", "osmesa")]
    for line in renders:
        print(json.dumps(line), flush=True)
    first = next(iter(rows.values()))
    print(f"\n{args.task}, {first['device_name']}, {first['threads']} threads")
    print(f"{'model':>6} {'obs':>6} {'update ms':>10} {'plan ms':>9} {'env ms':>8} {'x states':>9}")
    for (size, obs), r in rows.items():
        both = r["update_ms"] + r["plan_ms"]
        base = rows[size, "state"]
        ratio = both / (base["update_ms"] + base["plan_ms"])
        times = f"{r['update_ms']:10.1f} {r['plan_ms']:9.1f} {r['env_step_ms']:8.2f}"
        print(f"{size:>5}M {obs:>6} {times} {ratio:9.2f}")
    for line in renders:
        if "error" in line:
            print(f"{line['gl']}: {line['error']}")
        else:
            print(
                f"{line['gl']}: a 64x64 frame {line['frame_ms']:.1f} ms; an agent step "
                f"{line['rgb_step_ms']:.1f} ms from pixels, {line['state_step_ms']:.2f} from states"
            )


if __name__ == "__main__":
    main()
