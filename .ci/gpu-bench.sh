#!/usr/bin/env bash
# Benchmark on a CUDA machine (run by hand there; CI has no GPU). Results go to $OUT.
# Expects the dependencies importable (on the lent device: wheels carried in .whl/).
set -uo pipefail
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export TDMPC2_LIVE_NO_BOOTSTRAP=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
bench() { timeout "$1" python3 launch.py bench --device cuda --json "${@:2}" | tee -a "$OUT/bench.jsonl"; }
# Side by side: compiled (CUDA graphs) and eager, per model size.
bench 240 --model-size 5 --repeats 50 --warmup 10
bench 90 --model-size 5 --no-compile --repeats 30 --warmup 5
bench 240 --model-size 1 --repeats 50 --warmup 10
bench 90 --model-size 1 --no-compile --repeats 30 --warmup 5
# The authors' cartpole-balance protocol: 1M, default planning, 3 eval episodes every 1k steps.
timeout "${LEARN_S:-200}" python3 launch.py --headless --device cuda --task cartpole-balance \
  --model-size 1 --steps 6000 --eval-every 1000 --eval-episodes 3 --quiet \
  --run-dir "$OUT/learn-cartpole-balance" 2>&1 | tail -3
grep '"eval"' "$OUT/learn-cartpole-balance/metrics.jsonl" | cut -c1-160
