"""The desktop menu entry for launch.py (`--install-desktop`, `--uninstall-desktop`).

Standard library only: launch.py runs this before the dependencies are installed, so a fresh
clone can be put in the menu first and set itself up on the first double-click.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

FILE_NAME = "tdmpc2-live.desktop"
NAME = "TD-MPC2 Live"
COMMENT = "Watch TD-MPC2 learn in real time and tune its speed knobs while it runs"
# Characters that make the Desktop Entry spec require an Exec argument to be quoted.
_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")


def applications_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The user's applications folder: $XDG_DATA_HOME/applications, by default
    ~/.local/share/applications (a relative XDG_DATA_HOME is invalid and ignored, per the spec)."""
    data_home = env.get("XDG_DATA_HOME", "")
    base = Path(data_home) if os.path.isabs(data_home) else Path.home() / ".local" / "share"
    return base / "applications"


def exec_argument(arg: str) -> str:
    """One argument of the Exec key: quoted and escaped as the Desktop Entry spec asks, with a
    literal % doubled (a lone % starts a field code)."""
    arg = arg.replace("%", "%%")
    if arg and not set(arg) & _RESERVED:
        return arg
    inner = "".join("\\" + c if c in '"`$\\' else c for c in arg)
    return f'"{inner}"'


def escape_value(text: str) -> str:
    """The spec's escapes for any string value (applied after the Exec quoting)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def entry_text(python: str, launcher: Path, project: Path, icon: Path) -> str:
    """The desktop entry that runs `python launcher` in the project directory."""
    command = " ".join(exec_argument(a) for a in (python, str(launcher)))
    keys = {
        "Type": "Application",
        "Version": "1.4",
        "Name": NAME,
        "GenericName": "Reinforcement learning viewer",
        "Comment": COMMENT,
        "Icon": escape_value(str(icon)),
        "TryExec": escape_value(python),  # the menu hides the entry if that Python is gone
        "Exec": escape_value(command),
        "Path": escape_value(str(project)),
        "Terminal": "false",
        "Categories": "Science;Education;",
        "Keywords": "reinforcement learning;TD-MPC2;MuJoCo;",
    }
    return "[Desktop Entry]\n" + "".join(f"{k}={v}\n" for k, v in keys.items())


def install(
    python: str, launcher: Path, project: Path, env: Mapping[str, str] = os.environ
) -> Path:
    """Write the entry into the user's applications folder; return its path. OSError when it
    cannot be written; FileNotFoundError when the icon is missing."""
    icon = project / "assets" / "icon.png"
    if not icon.is_file():
        raise FileNotFoundError(f"the icon {icon} is missing")
    folder = applications_dir(env)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAME
    tmp = path.with_name(f".{FILE_NAME}.tmp")  # a menu never reads half an entry
    tmp.write_text(entry_text(python, launcher.absolute(), project.absolute(), icon.absolute()))
    os.replace(tmp, path)
    return path


def uninstall(env: Mapping[str, str] = os.environ) -> Path | None:
    """Remove the entry; its path, or None when there was none."""
    path = applications_dir(env) / FILE_NAME
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    return path
