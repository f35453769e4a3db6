"""launch.py --install-desktop: the menu entry is well formed and its command starts the program."""

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_FLAGS

from workers.cli import desktop

ROOT = Path(__file__).resolve().parents[2]
# The tiny run of tests/e2e/test_cli.py: every code path in seconds.
TINY = [*TINY_FLAGS, "--steps=150", "--quiet"]


def user_env(tmp_path: Path) -> dict[str, str]:
    """A desktop user's environment: no bootstrap bypass, applications folder in tmp_path."""
    env = {k: v for k, v in os.environ.items() if k != "TDMPC2_LIVE_NO_BOOTSTRAP"}
    return {**env, "XDG_DATA_HOME": str(tmp_path / "data"), "OMP_NUM_THREADS": "1"}


def launch(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def read_entry(path: Path) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # keys are case-sensitive in desktop entries
    parser.read(path)
    return dict(parser["Desktop Entry"])


def exec_argv(value: str) -> list[str]:
    """The Exec key as a desktop runs it: the string escapes undone, then split into arguments by
    the spec's quoting (in double quotes a backslash escapes " ` $ \\), then %% as a literal %.
    (shlex.split is close but does not take backslash-$ or backslash-` inside quotes.)"""
    text = value.replace("\\\\", "\0").replace("\\n", "\n").replace("\0", "\\")
    args, current, quoted, chars = [], None, False, iter(text)
    for char in chars:
        if quoted and char == "\\":
            current += next(chars)
        elif char == '"':
            quoted, current = not quoted, current or ""
        elif char == " " and not quoted:
            if current is not None:
                args.append(current)
            current = None
        else:
            current = (current or "") + char
    assert not quoted, value
    if current is not None:
        args.append(current)
    return [arg.replace("%%", "%") for arg in args]


def test_exec_quoting_round_trips_awkward_paths():
    for path in ["/usr/bin/python3", '/home/a b/x$y/"q"/back\\slash/`t`/100%/launch.py']:
        written = desktop.escape_value(desktop.exec_argument(path))
        assert exec_argv(written) == [path]
    assert desktop.exec_argument("/usr/bin/python3") == "/usr/bin/python3"  # plain stays plain
    assert desktop.exec_argument("/a b") == '"/a b"'
    assert desktop.exec_argument("/50%") == "/50%%"


def test_applications_folder_follows_xdg(tmp_path):
    assert desktop.applications_dir({"XDG_DATA_HOME": str(tmp_path)}) == tmp_path / "applications"
    default = Path.home() / ".local/share/applications"
    assert desktop.applications_dir({}) == default
    assert desktop.applications_dir({"XDG_DATA_HOME": "relative/dir"}) == default  # invalid


def test_install_run_and_uninstall_the_desktop_entry(tmp_path, monkeypatch):
    """The entry's own Exec command, run as a desktop runs it (in Path, no bootstrap bypass,
    under xvfb-run), trains a tiny headless run; then the entry is removed. Only running that
    command shows it starts the program on the installed packages."""
    env = user_env(tmp_path)
    installed = launch("--install-desktop", env=env)
    entry_path = tmp_path / "data" / "applications" / "tdmpc2-live.desktop"
    assert installed.returncode == 0, installed.stderr
    assert str(entry_path) in installed.stdout

    entry = read_entry(entry_path)
    assert entry["Type"] == "Application" and entry["Name"] == "TD-MPC2 Live"
    assert entry["Comment"] and entry["Terminal"] == "false"
    assert entry["Categories"] == "Science;Education;"
    icon, project = Path(entry["Icon"]), Path(entry["Path"])
    assert icon.is_absolute() and icon.is_file() and icon.suffix == ".png"
    assert project.is_absolute() and project.resolve() == ROOT
    if shutil.which("desktop-file-validate"):  # desktop-file-utils, where installed
        check = subprocess.run(["desktop-file-validate", str(entry_path)], capture_output=True)
        assert check.returncode == 0, check.stdout
    command = exec_argv(entry["Exec"])
    assert command == [sys.executable, str(ROOT / "launch.py")]

    # Run the entry's command as the desktop would (in Path, no bootstrap bypass), headless and
    # tiny, under Xvfb where there is one. The test's Python is .venv: no installing, unless
    # .venv is behind pyproject.toml (then launch.py would reinstall: not in a test).
    import launch as launcher

    monkeypatch.delenv("TDMPC2_LIVE_NO_BOOTSTRAP", raising=False)
    if launcher.environment_choice([]) == "build":
        pytest.skip(".venv is older than pyproject.toml: run python3 launch.py --setup-only")
    xvfb = ["xvfb-run", "-a"] if shutil.which("xvfb-run") else []
    run_dir = tmp_path / "run"
    ran = subprocess.run(
        [*xvfb, *command, "--headless", *TINY, "--run-dir", str(run_dir)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    assert "First run" not in ran.stderr  # it used what is installed
    assert (run_dir / "worker-0.jsonl").stat().st_size > 0

    removed = launch("--uninstall-desktop", env=env)
    assert removed.returncode == 0 and "removed" in removed.stdout, removed.stderr
    assert not entry_path.exists()
    again = launch("--uninstall-desktop", env=env)
    assert again.returncode == 0 and "no desktop entry to remove" in again.stdout


def test_install_desktop_refuses_other_arguments_and_unwritable_folders(tmp_path):
    """--install-desktop with other flags, or under an unwritable XDG_DATA_HOME: exit 2 and one
    line. Only launch.py as a process shows the flag routed before the parser and the OS error as
    that line."""
    env = user_env(tmp_path)
    mixed = launch("--headless", "--install-desktop", env=env)
    assert mixed.returncode == 2 and mixed.stderr.startswith("error: --install-desktop takes")
    (tmp_path / "data").write_text("a file where the folder should be")
    blocked = launch("--install-desktop", env=env)
    assert blocked.returncode == 2, blocked.stderr
    assert len(blocked.stderr.splitlines()) == 1 and "cannot write" in blocked.stderr
