"""Writes tests/durations.json (each test file's seconds, longest first) from a run's JUnit XML:
`bash tests/run.sh --junitxml=/tmp/run.xml && .venv/bin/python tests/durations.py /tmp/run.xml`.
The suite's order follows it (conftest.py); nothing else reads it."""

import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def file_seconds(junit: Path) -> dict[str, float]:
    totals: dict[str, float] = collections.defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        totals[case.get("classname", "").replace(".", "/") + ".py"] += float(case.get("time", 0))
    return {path: round(s, 1) for path, s in sorted(totals.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    out = Path(__file__).parent / "durations.json"
    out.write_text(json.dumps(file_seconds(Path(sys.argv[1])), indent=0) + "\n")
