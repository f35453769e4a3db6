#!/usr/bin/env bash
# Sets up the project (first time only, via launch.py's bootstrap) and runs lint and all tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 launch.py --setup-only
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# One OpenMP thread per test process: the tests start subprocesses of their own, and on a
# 2-core machine oversubscribed OpenMP threads spin against each other. Two test processes
# (pytest-xdist), each taking a whole test file as it frees up, the longest files first (the
# learning check leads: tests/conftest.py): TEST_PROCESSES=0 runs them all in this one.
OMP_NUM_THREADS=1 .venv/bin/python -m pytest -n "${TEST_PROCESSES:-2}" --dist loadfile --no-loadscope-reorder "$@"
