#!/usr/bin/env bash
# The race bookkeeping's cost to training: agent steps/s of the same 2R-worker headless run
# without a race and as a race of two 1-worker lanes with the same knobs, R replicas of each
# (REPLICAS=R, default 1), alternated ROUNDS times.
# Usage: [REPLICAS=R] bash bench/race_cost.sh ROUNDS SECONDS OUT_DIR [extra launch.py flags]
# SECONDS: 300 or more on 2 cores with R=1 (start-up, seeding and pretraining take about a
# minute), about 300 x R with more workers sharing the cores.
set -euo pipefail
rounds=$1 seconds=$2 out=$3 replicas=${REPLICAS:-1}
shift 3
mkdir -p "$out"
flags=(--headless --workers $((2 * replicas)) --task cartpole-swingup --model-size 1 --action-repeat 8
  --episode-length 125 --seed-steps 250 --pretrain-updates 100 --num-samples 128
  --num-elites 16 --num-pi-trajs 8 --iterations 2 --merge-every 500 --no-bf16
  --eval-every 0 --steps 1000000 "$@")
rate() {  # agent steps/s of all workers together over their episodes after the first 3
  python3 - "$1" <<'PY'
import json, pathlib, sys
total = 0.0
files = sorted(pathlib.Path(sys.argv[1]).glob("worker-*.jsonl"))
if not files:
    sys.exit(f"{sys.argv[1]}: no worker records (see {sys.argv[1]}.log)")
for f in files:
    eps = [json.loads(line) for line in f.open() if '"kind": "episode"' in line][3:]
    if len(eps) < 2:
        sys.exit(f"{f}: under 5 episodes; give each run more SECONDS")
    total += (eps[-1]["step"] - eps[0]["step"]) / (eps[-1]["time"] - eps[0]["time"])
print(f"{total:.2f}")
PY
}
for round in $(seq "$rounds"); do
  for mode in plain race; do
    dir="$out/$mode-$round"
    rm -rf "$dir"
    lanes=()
    [ "$mode" = race ] && lanes=(--lane iterations=2 --lane iterations=2)
    [ "$mode" = race ] && [ "$replicas" -gt 1 ] && lanes+=(--replicas "$replicas")
    timeout -s INT "$seconds" python3 launch.py "${flags[@]}" "${lanes[@]}" --run-dir "$dir" \
      > "$dir.log" 2>&1 || true
    sleep 5
    echo "round $round, $mode: $(rate "$dir") agent steps/s"
  done
done
