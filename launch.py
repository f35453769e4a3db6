#!/usr/bin/env python3
"""TD-MPC2 Live: `python3 launch.py` sets itself up on first use, then runs.

    python3 launch.py                      # the window, training a demo preset
    python3 launch.py --attach runs/X      # the window on a run that is going on
    python3 launch.py --headless --task cartpole-balance --model-size 1 --steps 20000
    python3 launch.py bench [--model-size 5] [--json] [--learning]
    xvfb-run -a python3 launch.py bench --viewer 2   # the window's fps and cost on training

On first use this creates a virtual environment in .venv beside this file, installs the
project's dependencies into it (see pyproject.toml) and re-runs itself there.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
# torch first, pinned: on machines with a local CPU wheel this takes it; elsewhere it is the
# regular PyPI build (CUDA on Linux). The rest then installs nothing more for torch.
TORCH = "torch==2.13.0"


def _venv_python() -> Path:
    return VENV / "bin" / "python"


def _stamp() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]


def ensure_environment() -> None:
    """Create and fill .venv when needed, then re-exec this script inside it."""
    if os.environ.get("TDMPC2_LIVE_NO_BOOTSTRAP"):
        return
    marker = VENV / f".installed-{_stamp()}"
    in_venv = Path(sys.prefix).resolve() == VENV.resolve()
    if in_venv and marker.exists():
        return
    if not marker.exists():
        print("First run: setting up .venv (a few minutes, once)...", file=sys.stderr)
        if not _venv_python().exists():
            venv.create(VENV, with_pip=True)
        pip = [
            str(_venv_python()),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ]
        try:
            subprocess.run([*pip, TORCH], check=True)
            subprocess.run([*pip, "-e", f"{ROOT}[dev]"], check=True)
        except subprocess.CalledProcessError as err:
            sys.exit(f"error: installing dependencies failed ({err}); see the pip output above")
        for old in VENV.glob(".installed-*"):
            old.unlink()
        marker.touch()
    os.execv(
        str(_venv_python()), [str(_venv_python()), str(Path(__file__).resolve()), *sys.argv[1:]]
    )


def main() -> int:
    ensure_environment()
    if sys.argv[1:] == ["--setup-only"]:
        return 0
    sys.path.insert(0, str(ROOT))
    argv = sys.argv[1:]
    if argv[:1] == ["bench"] and "--viewer" in argv:
        from viewer.bench import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["bench"] or "--headless" in argv:
        from workers.cli import main as cli_main
    else:
        from viewer.main import main as cli_main
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
