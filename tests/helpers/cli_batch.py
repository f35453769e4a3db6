"""launch.py's program (`launch.run`, what runs once the environment is set up) given one argv
after another in this one process, for the bad-input cases of tests/e2e/test_cli.py: one
interpreter start for all of them instead of one each. Reads a JSON list of argv lists on stdin
and prints a JSON list of [exit code, stderr], one per argv; whatever escapes a case (a
traceback) is in its stderr, with exit code 1, as a process would show it."""

import contextlib
import io
import json
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import launch  # noqa: E402


def run_one(argv: list[str]) -> list:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = launch.run(argv)
        except SystemExit as exit_:  # argparse's refusals
            code = exit_.code if isinstance(exit_.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
    return [code, err.getvalue()]


if __name__ == "__main__":
    print(json.dumps([run_one(argv) for argv in json.load(sys.stdin)]))
