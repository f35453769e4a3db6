#!/usr/bin/env bash
# The montage's render time (BENCHMARKS.md, issue 37) for humanoid-walk: an album of 8 episodes of
# 500 agent steps (random actions: the render time does not depend on the policy), then
# `launch.py montage` on it, timed. Usage: bash bench/montage_time.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: bash bench/montage_time.sh DIR}
.venv/bin/python -c "
import sys; from pathlib import Path; sys.path[:0] = ['tests']
from helpers.album_run import make_album_run
make_album_run(Path(sys.argv[1]), task='humanoid-walk', lengths=(500,) * 8)" "$dir"
/usr/bin/time -f "%e s wall, %U s user, %M KB at most" .venv/bin/python launch.py montage "$dir" \
  --out "$dir/montage.mp4"
