"""Which task modules may be imported: a `module:EnvId` task runs its module's code, so only a
module a person named here (`name_task`: the command line, the new-run dialog, or the
TDMPC2_LIVE_MODULES variable) is imported, and never one that lies in a run directory or a
window's copy of one, however it is named: a run directory is data, never code."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from agent.errors import ConfigError

# The modules a person named (a `module:EnvId` task on the command line, in the new-run dialog,
# or in this variable): only these are imported. The environment carries the list to the
# processes this one starts (workers, the player), as it carries the path to find them.
NAMED_MODULES = "TDMPC2_LIVE_MODULES"
# What marks a folder as a run directory or a window's copy of one: data, never code.
RUN_MARKERS = (("run.json", "config.json"), (".mirror.json",))


def named_modules() -> set[str]:
    return {m for m in os.environ.get(NAMED_MODULES, "").split(",") if m}


def name_task(task: str) -> None:
    """A person named `task` here: its module may be imported by this process and those it
    starts, found where they start the program (as `python -m` finds it) as well."""
    module = task.rpartition(":")[0]
    if module:
        os.environ[NAMED_MODULES] = ",".join(sorted(named_modules() | {module}))
        if os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())


def check_task_named(task: str) -> None:
    """ConfigError (one line) when `task` imports a module nobody named here: a task read
    from a run directory (attached, resumed, connected, a montage's) imports nothing unless
    the person names it again."""
    module = task.rpartition(":")[0]
    if module and module not in named_modules():
        raise ConfigError(
            f"the run's task {task} imports the module {module!r}, and a run directory is "
            f"data, never code: name the task to import it (--task {task}, or "
            f"{NAMED_MODULES}={module})",
            "task",
        )


def in_run_directory(path: str | os.PathLike) -> bool:
    """Whether `path` lies in a run directory or a window's copy of one (RUN_MARKERS)."""
    here = Path(path).resolve()
    for folder in (here, *here.parents):
        if any(all((folder / name).exists() for name in marker) for marker in RUN_MARKERS):
            return True
    return False


def import_named(module: str) -> None:
    """Import `module`, each package on the way checked before it runs: none may lie in a run
    directory (where a served or copied run could have put it)."""
    parts = module.split(".")
    for n in range(1, len(parts) + 1):
        name = ".".join(parts[:n])
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)  # imports the parent, checked the step before
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r}")
        places = list(spec.submodule_search_locations or [])
        places += [spec.origin] if spec.has_location and spec.origin else []
        if any(in_run_directory(place) for place in places):
            raise ConfigError(
                f"the module {name!r} lies in a run directory (data, never code): not imported",
                "task",
            )
        importlib.import_module(name)
