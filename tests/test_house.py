"""The house plan (ARCHITECTURE.md) held by the code itself: rooms import only downward, workers/
sub-packages only the ones ARCHITECTURE.md lets them, the viewer enters workers/ by one door, no
folder outgrows a screen of names, a long module says why, no class offers more than 20 public
methods, the run's merge-frequency default is written once, and what ARCHITECTURE.md names
and draws is the code's."""

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ("agent", "workers", "viewer", "bench")  # each imports only those before it
# workers/ sub-packages and the ones each may import (ARCHITECTURE.md, "The import rule").
WORKERS = {
    "host": set(),
    "rundir": set(),
    "merging": {"rundir"},
    "training": {"host", "rundir", "merging"},
    "showcase": {"host", "rundir"},
    "race": {"host", "rundir"},
    "run": {"host", "rundir", "merging", "training", "showcase", "race"},
    "remote": {"rundir", "run"},
    "cli": {"host", "rundir", "merging", "training", "showcase", "race", "run", "remote"},
}
DOOR = "workers.door"  # the window's one way into workers/ (it may import every sub-package)
# What bench/'s micro-benchmarks may take from inside workers/: one part timed alone. Whole runs,
# races and the window's model come through the door.
BENCH_PARTS = {"host", "merging", "training", "rundir"}
MAX_MODULES, MAX_LINES = 16, 300
MAX_METHODS = 20  # a class's public methods, inherited ones too (issue 35: split by subject)


@functools.cache
def parsed(path: Path) -> ast.Module:
    """`path`'s syntax tree, parsed once for all the tests here."""
    return ast.parse(path.read_text())


def modules() -> list[Path]:
    return sorted(p for room in ROOMS for p in (ROOT / room).rglob("*.py"))


def imported(path: Path) -> set[str]:
    """Every module name `path` imports, at any depth (imports inside functions too)."""
    names = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def workers_modules(path: Path) -> set[str]:
    """The modules of workers/ that `path` imports (`from workers import x`: workers.x)."""
    names = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "workers":
                names.update(f"workers.{a.name}" for a in node.names)
            else:
                names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n for n in names if n.split(".")[0] == "workers"}


def test_rooms_import_only_downward():
    wrong = []
    for path in modules():
        room = path.relative_to(ROOT).parts[0]
        above = ROOMS[ROOMS.index(room) + 1 :]
        wrong += [(str(path), n) for n in imported(path) if n.split(".")[0] in above]
    assert wrong == []


def test_agent_cpu_is_a_layer_of_its_own():
    """agent/cpu/ is imported by the agent, never the other way: no arrow back into agent/."""
    wrong = [
        (path.name, name)
        for path in (ROOT / "agent" / "cpu").glob("*.py")
        for name in imported(path)
        if name.split(".")[0] == "agent" and not name.startswith("agent.cpu")
    ]
    assert wrong == []


def test_workers_sub_packages_import_only_those_the_rule_allows():
    assert {
        p.name for p in (ROOT / "workers").iterdir() if p.is_dir() and p.name != "__pycache__"
    } == set(WORKERS)
    assert sorted(p.name for p in (ROOT / "workers").glob("*.py")) == ["__init__.py", "door.py"]
    wrong = []
    for path in (ROOT / "workers").rglob("*.py"):
        own = path.relative_to(ROOT / "workers").parts[0]
        if own == "door.py":  # re-exports from every sub-package
            continue
        if DOOR in workers_modules(path):  # the door is for those outside
            wrong.append((str(path.relative_to(ROOT)), DOOR))
        for name in imported(path):
            parts = name.split(".")
            if parts[0] == "workers" and len(parts) > 1 and parts[1] in WORKERS:
                if parts[1] != own and parts[1] not in WORKERS[own]:
                    wrong.append((str(path.relative_to(ROOT)), name))
    assert wrong == []


def test_the_viewer_enters_workers_only_through_the_door():
    wrong = [
        (str(path.relative_to(ROOT)), name)
        for path in sorted((ROOT / "viewer").rglob("*.py"))
        for name in workers_modules(path)
        if name != DOOR
    ]
    assert wrong == []


def test_the_door_only_passes_names_on():
    """Nothing the window calls per frame goes through an extra layer: the door defines nothing."""
    tree = ast.parse((ROOT / "workers" / "door.py").read_text())
    kinds = {type(node).__name__ for node in tree.body}
    assert kinds <= {"Expr", "ImportFrom", "Assign"}  # docstring, re-exports, __all__
    assigned = [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
    assert assigned == ["__all__"]
    import workers.door

    assert sorted(workers.door.__all__) == sorted(
        a.asname or a.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for a in node.names
    )


def door_users() -> dict[str, set[str]]:
    """Each name the door exports and the files that import it from the door (the window,
    bench/, launch.py and the tests)."""
    import workers.door

    users: dict[str, set[str]] = {name: set() for name in workers.door.__all__}
    files = [*modules(), ROOT / "launch.py", *(ROOT / "tests").rglob("*.py")]
    for path in files:
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ImportFrom) and node.module == DOOR:
                for alias in node.names:
                    users.setdefault(alias.name, set()).add(str(path.relative_to(ROOT)))
    return users


def test_the_door_exports_only_what_its_users_import():
    unused = sorted(name for name, files in door_users().items() if not files)
    assert unused == []


def test_bench_drives_whole_runs_through_the_door():
    """bench/ enters workers/ by the door, but for its micro-benchmarks of one part alone (a
    merge, a collective, one trainer, a pack's threads), which may reach inside those parts."""
    wrong = [
        (str(path.relative_to(ROOT)), name)
        for path in sorted((ROOT / "bench").rglob("*.py"))
        for name in workers_modules(path)
        if name != DOOR and name.split(".")[1] not in BENCH_PARTS
    ]
    assert wrong == []


@pytest.mark.parametrize("room", ROOMS)
def test_no_folder_holds_more_than_a_screen_of_modules(room):
    folders = [ROOT / room, *[p for p in (ROOT / room).rglob("*") if p.is_dir()]]
    for folder in folders:
        count = len([p for p in folder.glob("*.py") if p.name != "__init__.py"])
        assert count <= MAX_MODULES, f"{folder}: {count} modules"


def test_a_module_over_300_lines_says_why():
    silent = [
        str(p.relative_to(ROOT))
        for p in modules()
        if len(p.read_text().splitlines()) > MAX_LINES
        and "Over 300 lines because" not in p.read_text()
    ]
    assert silent == []


def public_methods() -> dict[str, set[str]]:
    """Each class of the rooms and the public methods (properties too) it defines or inherits
    from a class of the rooms (class names are unique in them)."""
    own, bases = {}, {}
    for path in modules():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ClassDef):
                own[node.name] = {
                    item.name
                    for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and not item.name.startswith("_")
                }
                bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]

    def offered(name: str) -> set[str]:
        return own.get(name, set()).union(*(offered(b) for b in bases.get(name, [])))

    return {name: offered(name) for name in own}


def test_no_class_offers_more_than_20_public_methods():
    methods = public_methods()
    assert {"Run", "AttachedRun", "Controller"} <= methods.keys()
    assert {"start", "stop", "new_events"} <= methods["Run"]  # inherited from BaseRun count
    wide = {name: len(names) for name, names in methods.items() if len(names) > MAX_METHODS}
    assert wide == {}


def test_the_window_queues_commands_as_data_not_lambdas():
    """What the window asks of a run travels as a frozen dataclass (workers/run/commands.py),
    which can be logged and compared; a queued lambda can be neither."""
    queued = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted((ROOT / "viewer").rglob("*.py"))
        for node in ast.walk(parsed(path))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("put", "send")
        and any(isinstance(arg, ast.Lambda) for arg in node.args)
    ]
    assert queued == []


def test_the_merge_frequency_default_is_written_once():
    from workers.rundir.settings import RunSettings

    default = str(RunSettings.merge_every)
    places = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in [*modules(), ROOT / "launch.py"]
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(rf"(?<![\w.]){default}(?![\w.])", line.split("#")[0])
    ]
    assert len(places) == 1 and places[0].startswith("workers/rundir/settings.py:"), places


def calls_made(name: str) -> list[set[str]]:
    """For each definition of `name` ("Class.method" or a function) in agent/, workers/ and
    viewer/: the names it calls (`f(...)`, `x.f(...)`: f)."""
    owner, _, function = name.rpartition(".")
    found = []
    for path in modules():
        tree = parsed(path)
        scopes = [tree] if not owner else []
        scopes += [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == owner]
        for scope in scopes:
            for node in scope.body:
                if isinstance(node, ast.FunctionDef) and node.name == function:
                    called = {
                        c.func.attr if isinstance(c.func, ast.Attribute) else c.func.id
                        for c in ast.walk(node)
                        if isinstance(c, ast.Call) and isinstance(c.func, (ast.Attribute, ast.Name))
                    }
                    found.append(called)
    return found


def defined_names() -> dict[str, set[str]]:
    """Every name the rooms define, by where: "" for module level (functions, classes,
    assignments), a class name for its methods, fields and `self.x =` attributes."""
    names: dict[str, set[str]] = {"": set()}
    for path in modules():
        tree = parsed(path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names[""].add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names[""].update(t.id for t in targets if isinstance(t, ast.Name))
                names[""].update(t.attr for t in targets if isinstance(t, ast.Attribute))
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            own = names.setdefault(cls.name, set())
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    own.add(node.name)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    own.add(node.target.id)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    own.update(t.id for t in targets if isinstance(t, ast.Name))
                    own.update(t.attr for t in targets if isinstance(t, ast.Attribute))
            for base in (b.id for b in cls.bases if isinstance(b, ast.Name)):
                own.add(f"<base>{base}")
    return names


def has(names: dict[str, set[str]], cls: str, attr: str) -> bool:
    """Whether class `cls` (or a class of the rooms it derives from) has `attr`."""
    own = names.get(cls, set())
    bases = [b.removeprefix("<base>") for b in own if b.startswith("<base>")]
    return attr in own or any(has(names, b, attr) for b in bases)


def test_every_name_architecture_md_gives_is_in_the_code():
    """Each `Class.member`, `name` and `path.py` it names exists (`run.x`: the run's part x)."""
    names = defined_names()
    files = [str(p.relative_to(ROOT)) for p in modules()]
    wrong = []
    for token in re.findall(r"`([^`]+)`", (ROOT / "ARCHITECTURE.md").read_text()):
        token = re.sub(r"\(.*\)$", "", token)  # ChartsPanel.apply(view): the method
        if " " in token or "-" in token or token.endswith((".json", ".jsonl", "/")):
            continue  # a command, a file of the run directory, a room (the test above)
        if token.endswith(".py"):
            found = any(f == token or f.endswith("/" + token) for f in files)
        elif re.fullmatch(r"\.?[a-z_]+(\.[a-z_]+)?", token) and "." in token:
            found = has(names, "BaseRun", token.rsplit(".", 1)[1])  # run.showcase, .knobs
        elif "." in token:
            cls, _, attr = token.partition(".")
            found = has(names, cls, attr)
        else:
            found = token in names[""]
        if not found:
            wrong.append(token)
    assert wrong == []


def test_each_call_architecture_md_draws_for_a_metric_and_a_frame_is_made():
    """`A.f` -> `B.g` in its last section: f's body calls g (the knob path is followed as it
    runs: tests/viewer/test_knob_path.py)."""
    text = (ROOT / "ARCHITECTURE.md").read_text().split("## A metric")[1]
    arrows = re.findall(
        r"`([A-Z]\w*\.\w+)`(?:\s*\([^)]*\))?\s*->\s*(?=`([A-Z]\w*\.\w+)(?:\(\w*\))?`)", text
    )
    assert len(arrows) >= 8, arrows
    for caller, callee in arrows:
        made = calls_made(caller)
        assert made, f"ARCHITECTURE.md names {caller}, which the code does not define"
        assert any(callee.rpartition(".")[2] in calls for calls in made), (caller, callee)


def test_architecture_md_is_one_screen():
    lines = (ROOT / "ARCHITECTURE.md").read_text().splitlines()
    assert len(lines) <= 50 and max(map(len, lines)) <= 100
