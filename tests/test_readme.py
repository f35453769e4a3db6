"""README.md stays a file a person reads, and stays true of the code.

- Under 600 lines, and no sentence over 50 words (prose and table cells; code blocks skipped).
- Its links land: files exist, and so do the anchors it links to (its own and other .md files').
- Its knob table is the one table of agent/knobs.py (KNOBS): the block between the two markers
  must be what knob_table() renders. On a mismatch, write it again with

      .venv/bin/python tests/test_readme.py
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 600  # the file must stay under this many lines
MAX_WORDS = 50  # per sentence
BEGIN = "<!-- knobs: generated from agent/knobs.py by tests/test_readme.py; do not edit -->"
END = "<!-- /knobs -->"
REGENERATE = ".venv/bin/python tests/test_readme.py"


# --- the knob table -----------------------------------------------------------------------


def knob_table() -> str:
    """The README's knob table, from KNOBS: each knob's label, its flag as the command line
    spells it, its range, its default and its widget in the window."""
    import agent.knobs
    from agent.config import make_config
    from agent.knobs import knob_text
    from workers.cli.flags import DEFAULT_SIZE, DEFAULT_TASK, build_parser
    from workers.rundir.settings import RunSettings

    flags = {
        action.dest: next(s for s in action.option_strings if s.startswith("--"))
        for action in build_parser()._actions
        if action.option_strings
    }
    cfg = make_config(DEFAULT_SIZE, task=DEFAULT_TASK)
    rows = [
        "| knob | flag | range | default | in the window |",
        "|---|---|---|---|---|",
    ]
    for knob in agent.knobs.KNOBS:
        if knob.name not in flags:
            raise AssertionError(f"knob {knob.name} has no flag in workers/cli/flags.py")
        owner = cfg if hasattr(cfg, knob.name) else RunSettings
        value = getattr(owner, knob.name)
        default = knob_text(knob.kind(value))
        if knob.auto is not None and value == knob.auto:
            small, large = cfg.resolved_iterations(1), cfg.resolved_iterations(20)
            default += f" (chosen at start: {small}, or {large} at 20+ action dimensions)"
        if knob.name == "bf16":  # the machine's (workers/host/precision.py)
            default = "on where the CPU has a bf16 unit"
        if not knob.in_window:
            widget = "none"
        elif knob.kind is bool:
            widget = "checkbox"
        elif knob.step:
            widget = f"number field, step {knob.step}"
        else:
            widget = "slider"
        rows.append(
            f"| {knob.title} | `{flags[knob.name]}` | {knob.bounds} | {default} | {widget} |"
        )
    return "\n".join(rows)


def _split_block(text: str) -> tuple[str, str, str]:
    """(before, the generated block, after); AssertionError when the markers are not there."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise AssertionError(f"README.md must hold the knob table between {BEGIN} and {END}")
    before, rest = text.split(BEGIN)
    block, after = rest.split(END)
    return before, block.strip("\n"), after


def knob_table_problem(text: str) -> str | None:
    """What is wrong with the README's knob table (text: the README), or None."""
    _, block, _ = _split_block(text)
    want = knob_table()
    if block == want:
        return None
    return (
        "README.md's knob table is not agent/knobs.py's table; write it again with "
        f"`{REGENERATE}`.\nREADME:\n{block}\nKNOBS:\n{want}"
    )


def write_knob_table() -> None:
    before, _, after = _split_block(README.read_text())
    README.write_text(f"{before}{BEGIN}\n{knob_table()}\n{END}{after}")


def test_the_knob_table_is_agent_knobs_table():
    problem = knob_table_problem(README.read_text())
    assert problem is None, problem


@pytest.mark.parametrize("change", ["a knob added", "a range changed", "a label changed"])
def test_the_knob_check_fails_when_knobs_change(monkeypatch, change):
    import agent.knobs

    table = list(agent.knobs.KNOBS)
    if change == "a knob added":
        table.append(agent.knobs.Knob("min_std", float, 0.01, 1.0, "MPPI min std"))
    elif change == "a range changed":
        table[1] = dataclasses.replace(table[1], high=table[1].high * 2)
    else:
        table[2] = dataclasses.replace(table[2], label="MPPI rounds")
    monkeypatch.setattr(agent.knobs, "KNOBS", tuple(table))
    problem = knob_table_problem(README.read_text())
    assert problem is not None and REGENERATE in problem


def test_every_knob_is_in_the_table_with_its_flag():
    from agent.knobs import KNOBS

    for knob in KNOBS:
        flag = "--" + knob.name.replace("_", "-")
        assert re.search(rf"^\| {re.escape(knob.title)} \| `{flag}` \| ", knob_table(), re.M)


# --- sentences and lines ------------------------------------------------------------------

_CODE_SPAN = re.compile(r"`[^`]*`")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[^a-z\s])")
_LIST_ITEM = re.compile(r"^\s*(?:[-*]|\d+\.)\s+")


def _table_cells(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [c.strip() for c in cells if c.strip() and not re.fullmatch(r":?-+:?", c.strip())]


def paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each run of prose: paragraphs, list items, headings and
    table cells; fenced code blocks and HTML comments are left out."""
    found: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    fenced = False

    def close() -> None:
        if current:
            found.append((start, " ".join(current)))
            current.clear()

    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            close()
            fenced = not fenced
            continue
        if fenced or stripped.startswith("<!--"):
            continue
        if not stripped:
            close()
        elif stripped.startswith("|"):
            close()
            found.extend((number, cell) for cell in _table_cells(stripped))
        elif stripped.startswith("#") or _LIST_ITEM.match(line):
            close()
            start = number
            current.append(_LIST_ITEM.sub("", stripped).lstrip("# "))
        else:
            if not current:
                start = number
            current.append(stripped)
    close()
    return found


def sentences(paragraph: str) -> list[str]:
    """A paragraph's sentences. A code span counts its words but never ends a sentence; one
    may start a sentence (its placeholder words are capitalised)."""
    masked = _CODE_SPAN.sub(lambda m: " ".join(["Code"] * max(1, len(m[0].split()))), paragraph)
    plain = _LINK.sub(r"\1", masked).replace("**", "")
    return [s for s in _SENTENCE_END.split(plain) if s.strip()]


def long_sentences(text: str) -> list[tuple[int, int, str]]:
    """(line, words, sentence) of every sentence over MAX_WORDS words."""
    return [
        (line, len(s.split()), s)
        for line, paragraph in paragraphs(text)
        for s in sentences(paragraph)
        if len(s.split()) > MAX_WORDS
    ]


def test_sentences_are_split_as_a_reader_would():
    text = (
        "One short sentence. Then `a b. C d` and [a link](X.md#y), e.g. this.\n"
        "A second line of it.\n\n- an item\n- another. Two\n\n```\nskipped. Code\n```\n"
        "| a cell. Two | b |\n|---|---|\n"
    )
    found = [s for _, p in paragraphs(text) for s in sentences(p)]
    assert found == [
        "One short sentence.",
        "Then Code Code Code Code and a link, e.g. this.",
        "A second line of it.",
        "an item",
        "another.",
        "Two",
        "a cell.",
        "Two",
        "b",
    ]


def test_the_sentence_check_catches_a_long_one():
    long = " ".join(["word"] * (MAX_WORDS + 1)) + "."
    assert long_sentences(f"Short.\n\n{long}\n") == [(3, MAX_WORDS + 1, long)]
    assert long_sentences(f"| {long} |\n") != []
    assert long_sentences(f"```\n{long}\n```\n") == []


def test_no_sentence_over_50_words():
    found = long_sentences(README.read_text())
    listing = "\n".join(f"line {line}: {words} words: {s[:100]}..." for line, words, s in found)
    assert not found, f"README.md sentences over {MAX_WORDS} words:\n{listing}"


def test_readme_is_under_600_lines():
    lines = len(README.read_text().splitlines())
    assert lines < MAX_LINES, f"README.md has {lines} lines; keep it under {MAX_LINES}"


# --- links --------------------------------------------------------------------------------


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a file's headings."""
    found: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"#{1,6} ", line):
            continue
        title = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower())
        slug = base = title.replace(" ", "-")
        n = 0
        while slug in found:
            n += 1
            slug = f"{base}-{n}"
        found.add(slug)
    return found


def test_anchors_are_githubs():
    assert anchors("# Using it\n## Where it runs\n## Where it runs\n### `--flag`: a, b (c.d)") == {
        "using-it",
        "where-it-runs",
        "where-it-runs-1",
        "--flag-a-b-cd",
    }


def test_every_link_lands():
    text = README.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else README
        if not file.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(f"{target}: no heading with that anchor in {file.name}")
    assert not broken, "README.md links that do not land:\n" + "\n".join(broken)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    write_knob_table()
    print(f"wrote the knob table into {README}")
