#!/usr/bin/env bash
# Mutation testing of the algorithm and the merge (TESTING.md): mutmut changes one thing at a
# time in agent/ and workers/merging/files.py and runs the tests that reach it; a mutant no test kills
# survives. Outside CI: about 1.5 hours on 2 cores. Arguments go to `mutmut run` (mutant names,
# e.g. 'agent.planner.*', to run some again). The figures: `mutmut results`, TESTING.md.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 launch.py --setup-only
.venv/bin/python -m pip install --quiet "mutmut==3.8.1"
# One OpenMP thread per test process, as in tests/run.sh: mutmut runs one per core.
export OMP_NUM_THREADS=1 TDMPC2_LIVE_TEST_THREADS=1
.venv/bin/mutmut run --max-children "$(nproc)" "$@"
.venv/bin/python tests/mutation_report.py
