#!/usr/bin/env python3
"""TD-MPC2 Live: `python3 launch.py` sets itself up on first use, then runs.

    python3 launch.py                      # the window, training a demo preset
    python3 launch.py --attach runs/X      # the window on a run that is going on
    python3 launch.py --headless --task cartpole-balance --model-size 1 --steps 20000
    python3 launch.py --headless task=cartpole-balance model_size=1 steps=20000   # the same
    python3 launch.py bench [--model-size 5] [--json] [--learning]
    python3 launch.py montage runs/X       # an MP4 of album episodes at increasing steps
    python3 launch.py serve runs/X         # serve a run to a window elsewhere (--connect URL)
    xvfb-run -a python3 launch.py bench --viewer 2   # the window's fps and cost on training
    python3 launch.py --install-desktop    # a menu entry (--uninstall-desktop removes it)

When this Python already has the dependencies (an environment with a CUDA torch, say), they are
used. Otherwise the first run creates a virtual environment in .venv beside this file, installs
the project's dependencies into it (see pyproject.toml) and re-runs itself there; later runs go
straight there. `--setup-only` always prepares .venv (the tests run from it). Installed with pip,
the `tdmpc2-live` command runs the same program in the environment it was installed into.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
# torch first, pinned: on machines with a local CPU wheel this takes it; elsewhere it is the
# regular PyPI build (CUDA on Linux). The rest then installs nothing more for torch.
TORCH = "torch==2.13.0"
# Distributions whose import name is not their name with - as _.
IMPORT_NAMES = {"pyyaml": "yaml", "pillow": "PIL", "opencv-python": "cv2"}
SWITCH_OFF = {"false", "no", "off", "0"}
DESKTOP_FLAGS = {"--install-desktop", "--uninstall-desktop"}


def _venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _stamp() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]


def dependency_modules(pyproject: str) -> list[str]:
    """Import names of the [project] dependencies listed in pyproject.toml's text (read with a
    regex: tomllib is not in Python 3.10, and this runs before anything is installed)."""
    block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", pyproject, re.DOTALL | re.MULTILINE)
    names = re.findall(r'^\s*"([A-Za-z0-9][A-Za-z0-9._-]*)', block.group(1) if block else "", re.M)
    return [
        IMPORT_NAMES.get(n.lower(), n.lower().replace("-", "_").replace(".", "_")) for n in names
    ]


def dependencies_here(modules: list[str], find_spec=importlib.util.find_spec) -> bool:
    """Whether every module can be imported by this Python (found, not imported: cheap)."""
    try:
        return bool(modules) and all(find_spec(name) is not None for name in modules)
    except (ImportError, ValueError):
        return False


def choose_environment(
    *, no_bootstrap: bool, setup_only: bool, in_venv: bool, venv_ready: bool, deps_here: bool
) -> str:
    """Where to run: 'here' (silently), 'current' (here, saying so), 'venv' (re-run in the
    ready .venv) or 'build' (install into .venv first)."""
    if no_bootstrap:
        return "here"
    if setup_only:  # the tests run from .venv whatever this Python has: always prepare it
        return "here" if venv_ready else "build"
    if in_venv:  # our own .venv follows pyproject.toml: refill it when that changed
        return "here" if venv_ready else "build"
    if deps_here:
        return "current"
    return "venv" if venv_ready else "build"


def _build_venv(marker: Path) -> None:
    print("First run: setting up .venv (a few minutes, once)...", file=sys.stderr)
    if not _venv_python().exists():
        venv.create(VENV, with_pip=True)
    pip = [str(_venv_python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    try:
        subprocess.run([*pip, TORCH], check=True)
        subprocess.run([*pip, "-e", f"{ROOT}[dev]"], check=True)
    except subprocess.CalledProcessError as err:
        sys.exit(f"error: installing dependencies failed ({err}); see the pip output above")
    for old in VENV.glob(".installed-*"):
        old.unlink()
    marker.touch()


def environment_choice(argv: list[str]) -> str:
    """choose_environment() for this Python and these arguments."""
    return choose_environment(
        no_bootstrap=bool(os.environ.get("TDMPC2_LIVE_NO_BOOTSTRAP")),
        setup_only=argv == ["--setup-only"],
        in_venv=Path(sys.prefix).resolve() == VENV.resolve(),
        venv_ready=(VENV / f".installed-{_stamp()}").exists(),
        deps_here=dependencies_here(dependency_modules((ROOT / "pyproject.toml").read_text())),
    )


def ensure_environment(argv: list[str]) -> None:
    """Make sure the dependencies import: here, or in .venv (built when needed, then re-run)."""
    choice = environment_choice(argv)
    if choice == "current" and not {"-h", "--help"} & set(argv):
        print(f"using this Python's packages: {sys.executable}", file=sys.stderr)
    if choice == "build":
        _build_venv(VENV / f".installed-{_stamp()}")
    if choice in ("venv", "build") and argv != ["--setup-only"]:
        python = str(_venv_python())
        os.execv(python, [python, str(Path(__file__).resolve()), *argv])


def _given(argv: list[str], name: str, switch: bool = True) -> bool:
    """Whether `--name`, `--name=V` or the key=value form `name=V` is among the arguments (for
    a switch, name=false does not count)."""
    for arg in argv:
        if arg == f"--{name}" or arg.startswith(f"--{name}="):
            return True
        key, eq, value = arg.partition("=")
        if eq and key == name and not (switch and value.strip().lower() in SWITCH_OFF):
            return True
    return False


def desktop_entry(argv: list[str]) -> int:
    """--install-desktop / --uninstall-desktop: standard library only, no environment needed."""
    sys.path.insert(0, str(ROOT))
    from workers.cli import desktop

    if len(argv) != 1:
        flag = next(a for a in argv if a in DESKTOP_FLAGS)
        print(f"error: {flag} takes no other arguments", file=sys.stderr)
        return 2
    if argv[0] == "--uninstall-desktop":
        path = desktop.uninstall()
        where = desktop.applications_dir() / desktop.FILE_NAME
        print(f"removed {path}" if path else f"no desktop entry to remove ({where})")
        return 0
    try:
        path = desktop.install(sys.executable, ROOT / "launch.py", ROOT)
    except OSError as err:
        print(f"error: cannot write the desktop entry: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}: the menu now has {desktop.NAME} (--uninstall-desktop removes it)")
    return 0


def run(argv: list[str]) -> int:
    """The program itself, in an environment that has the dependencies."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if argv[:1] == ["bench"] and _given(argv, "viewer", switch=False):
        from bench.viewer import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["bench"]:
        from bench.cli import main as cli_main
    elif argv[:1] == ["montage"]:
        from workers.cli.montage import main as cli_main
    elif argv[:1] == ["serve"]:
        from workers.cli.serve import main as cli_main
    elif _given(argv, "headless"):
        from workers.cli.headless import main as cli_main
    else:
        from viewer.main import main as cli_main
    return cli_main(argv)


def console_main() -> int:
    """The `tdmpc2-live` console script: pip installed it into an environment that already has
    the dependencies, so there is no .venv to set up."""
    argv = sys.argv[1:]
    if DESKTOP_FLAGS & set(argv):
        return desktop_entry(argv)
    if argv == ["--setup-only"]:
        return 0
    return run(argv)


def main() -> int:
    argv = sys.argv[1:]
    if DESKTOP_FLAGS & set(argv):
        return desktop_entry(argv)  # before the bootstrap: it needs nothing installed
    ensure_environment(argv)
    if argv == ["--setup-only"]:
        return 0
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
