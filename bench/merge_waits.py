"""Whether a run's merges waited for partners: each worker's merge rounds, the workers left out
of them (a partner that timed out, say) and what a merge took (mostly the wait for the slowest
partner), from its records. A race's figure means what it says only where no partner was left out.

    TDMPC2_LIVE_NO_BOOTSTRAP=1 .venv/bin/python -m bench.merge_waits RUN_DIR

Prints a Markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from workers.rundir.paths import metrics_name
from workers.rundir.records import Merge, parse_records


def merge_waits(path: Path) -> list[dict]:
    """One row per worker with merge records: rounds, left out (worker: reason, each time),
    notes of the merge rule, and merge_ms median and largest."""
    rows = []
    index = 0
    while (path / metrics_name(index)).exists():
        records = parse_records((path / metrics_name(index)).read_bytes(), index)[0]
        merges = [r for r in records if isinstance(r, Merge)]
        if merges:
            times = [m.merge_ms for m in merges if m.merge_ms is not None]
            rows.append(
                {
                    "worker": index,
                    "rounds": len(merges),
                    "left_out": [f"{w}: {why}" for m in merges for w, why in m.left_out.items()],
                    "notes": sorted({m.note for m in merges if m.note}),
                    "median_ms": statistics.median(times) if times else None,
                    "max_ms": max(times) if times else None,
                }
            )
        index += 1
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    rows = merge_waits(parser.parse_args().run_dir)
    print("| worker | merges | left out | merge ms, median / largest | rule notes |")
    print("|---|---|---|---|---|")
    for row in rows:
        left = "; ".join(row["left_out"]) or "none"
        times = f"{row['median_ms']:.0f} / {row['max_ms']:.0f}"
        notes = "; ".join(row["notes"])
        print(f"| {row['worker']} | {row['rounds']} | {left} | {times} | {notes} |")


if __name__ == "__main__":
    main()
