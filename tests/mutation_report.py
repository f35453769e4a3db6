"""The mutation score of the algorithm and the merge (tests/mutate.sh, TESTING.md).

Reads mutmut's results under mutants/ and the triage list tests/mutants_triaged.txt, prints one
row per module and the score (mutants caught / mutants that are not equivalent), and lists every
survivor that no line of the triage list explains: each needs a test that fails on it, or a line
saying why it changes nothing that matters. Exits 1 while there is one.

  .venv/bin/python tests/mutation_report.py            # the table and the open survivors
  .venv/bin/python tests/mutation_report.py --diffs    # each open survivor's diff too
"""

from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import functools
import json
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRIAGE = ROOT / "tests" / "mutants_triaged.txt"
CAUGHT = {"killed", "timeout", "segfault", "caught by type check"}


def status(exit_code: int | None) -> str:
    from mutmut.stats import status_by_exit_code

    return status_by_exit_code[exit_code]


def results(mutants: Path) -> dict[str, str]:
    """{mutant name: mutmut's status} for every mutant of a mutants/ folder."""
    found = {}
    for meta in sorted(mutants.rglob("*.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        found.update({name: status(code) for name, code in codes.items()})
    return found


def triage(path: Path) -> list[tuple[str, str]]:
    """(mutant-name pattern, why) per line: `pattern  why`; # starts a comment line."""
    entries = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            pattern, _, why = line.partition(" ")
            entries.append((pattern, why.strip()))
    return entries


@functools.cache
def functions(path: Path) -> dict[str, str]:
    """{function name: source} of a mutated file (the original is `<name>__mutmut_orig`)."""
    source = path.read_text()
    tree = ast.parse(source)
    return {
        node.name: ast.get_source_segment(source, node)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and "__mutmut_" in node.name
    }


def changed_lines(name: str) -> tuple[list[str], list[str]]:
    """The lines a mutant removes and adds, from the copy of its module under mutants/."""
    found = functions(ROOT / "mutants" / module(name))
    function = name.rsplit(".", 1)[1]
    orig_name = function.rsplit("__mutmut_", 1)[0] + "__mutmut_orig"
    original = found[orig_name].splitlines()
    mutant = found[function].replace(function, orig_name, 1).splitlines()
    diff = list(difflib.unified_diff(original, mutant, lineterm="", n=0))
    removed = [ln[1:].strip() for ln in diff if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:].strip() for ln in diff if ln.startswith("+") and not ln.startswith("+++")]
    return removed, added


# A tensor's device given as the agent's or an input's (self.device, x.device, device), as None
# or not at all: all the CPU, the one device the tests have. On a GPU, gpu-bench's runs catch
# these, not unit tests.
DEVICE = re.compile(r"(,\s*)?device=([\w.]*device|None)|\.to\(([\w.]*device|None),?\s*")


def only_the_device(name: str) -> bool:
    """Whether the mutant changes nothing but which device a tensor is made on or moved to."""
    removed, added = changed_lines(name)
    if not removed or len(removed) != len(added):
        return False

    def plain(line: str) -> str:
        return re.sub(r",\s*\)", ")", DEVICE.sub(lambda m: ".to(" if "to(" in m[0] else "", line))

    return all(plain(a) == plain(b) for a, b in zip(removed, added))


def module(name: str) -> str:
    """agent.planner.x_plan__mutmut_3 -> agent/planner.py"""
    head = name.split("__mutmut_")[0].rsplit(".", 1)[0]
    return head.replace(".", "/") + ".py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--diffs", action="store_true", help="show each open survivor's diff")
    parser.add_argument("--only", default="*", help="list only survivors matching this pattern")
    parser.add_argument(
        "--earlier",
        type=Path,
        action="append",
        default=[],
        help="a copy of an earlier run's mutants/ whose results fill in what this one left",
    )
    args = parser.parse_args()
    found = results(ROOT / "mutants")
    for earlier in args.earlier:  # a run of some mutants by name leaves the rest unchecked
        for name, state in results(earlier).items():
            if found.get(name, "not checked") == "not checked":
                found[name] = state
    if not found:
        print("no results under mutants/: run tests/mutate.sh first", file=sys.stderr)
        return 2
    entries = triage(TRIAGE)
    used = Counter()
    rows: dict[str, Counter] = {}
    open_survivors = []
    for name, state in sorted(found.items()):
        row = rows.setdefault(module(name), Counter())
        row["mutants"] += 1
        if state in CAUGHT:
            row["caught"] += 1
            continue
        if state == "not checked":
            row["not checked"] += 1
            continue
        matched = next((p for p, _ in entries if fnmatch.fnmatchcase(name, p)), None)
        if matched is not None:
            used[matched] += 1
            row["equivalent"] += 1
        elif only_the_device(name):
            row["equivalent"] += 1
            row["device"] += 1
        else:
            row["open"] += 1
            open_survivors.append((name, state))
    print("| module | mutants | caught | equivalent or CUDA-only (triaged) | open | not checked |")
    print("|---|---:|---:|---:|---:|---:|")
    total = Counter()
    for path, row in sorted(rows.items()):
        total.update(row)
        cells = [row[k] for k in ("mutants", "caught", "equivalent", "open", "not checked")]
        print(f"| `{path}` | " + " | ".join(str(c) for c in cells) + " |")
    cells = [total[k] for k in ("mutants", "caught", "equivalent", "open", "not checked")]
    print("| all | " + " | ".join(str(c) for c in cells) + " |")
    print(f"\n(equivalent: {total['device']} only move a tensor to the CPU's device; the rest")
    print(f" by the {len(entries)} lines of {TRIAGE.relative_to(ROOT)})")
    scored = total["mutants"] - total["equivalent"] - total["not checked"]
    print(f"\nscore: {total['caught']} of {scored} non-equivalent mutants caught", end="")
    print(f" ({100 * total['caught'] / max(scored, 1):.1f}%)")
    # A line is stale when the mutants it names ran and none of them survived (a run of some
    # mutants by name leaves the others' lines unjudged).
    checked = [name for name, state in found.items() if state != "not checked"]
    stale = [
        p for p, _ in entries if not used[p] and any(fnmatch.fnmatchcase(n, p) for n in checked)
    ]
    if stale:
        print(f"\ntriage lines that match no survivor now ({len(stale)}):")
        print("\n".join(f"  {p}" for p in stale))
    if open_survivors:
        print(f"\nsurvivors with neither a test nor a triage line ({len(open_survivors)}):")
        for name, state in open_survivors:
            if not fnmatch.fnmatchcase(name, args.only):
                continue
            print(f"  {name}  ({state})")
            if args.diffs:
                removed, added = changed_lines(name)
                print(
                    "\n".join(
                        [f"      - {ln}" for ln in removed] + [f"      + {ln}" for ln in added]
                    )
                )
    return 1 if open_survivors else 0


if __name__ == "__main__":
    sys.exit(main())
