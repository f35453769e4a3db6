#!/usr/bin/env bash
# Benchmark on a CUDA machine (run by hand there; CI has no GPU). Results go to $OUT.
# Expects the dependencies importable (on the lent device: wheels carried in .whl/).
#   .ci/gpu-bench.sh [--device cpu] [SECTION ...]   sections: speed learn pack walker (default
#   all) and pixels (not in the default: walker-walk from pixels against the authors' curve)
# First, whatever the sections: the start-up self-check of the first user's process (walker-walk,
# 5M, a pack of 4: `python3 launch.py` on a GPU), its verdict and time (self-check.json).
# The whole script ends within BUDGET_S (570 s): each step's timeout is cut to what is left, and
# a step with under 20 s left is skipped (all four sections take longer: pick some). A learning
# run cut short keeps the evaluations it logged. `--device cpu`: a dry run of every step with
# tiny settings (1M, few repeats, few steps), a few minutes on a CPU.
set -uo pipefail
DEVICE=cuda
if [ "${1:-}" = --device ]; then DEVICE=$2 && shift 2; fi
SECTIONS=" ${*:-speed learn pack walker} "
PY=${PYTHON:-python3}
export TDMPC2_LIVE_NO_BOOTSTRAP=1 PYTHONUNBUFFERED=1
if [ "$DEVICE" = cpu ]; then
  OUT=${OUT:-/tmp/gpu-bench-dry} BUDGET_S=${BUDGET_S:-420} CAP_S=120
  # Appended to the commands: the last of a repeated flag wins.
  TINY=(--model-size 1 --batch-size 32 --num-samples 64 --num-elites 8 --num-pi-trajs 4
    --iterations 2 --enc-dim 32 --mlp-dim 64 --latent-dim 32)
  FEW=(--repeats 2 --warmup 1 --rounds 2)
  SHORT=(--steps 300 --seed-steps 100 --episode-length 50 --eval-every 150 --eval-episodes 1)
  PACKS=1,2 PACKS_VS=1,2 WORKERS=(--workers 2 --pack 2) RESUME_STEPS=400 CHECK=(--self-check 2)
else
  OUT=${OUT:-gpu-results} BUDGET_S=${BUDGET_S:-570} CAP_S=600 TINY=() FEW=() SHORT=()
  PACKS=1,4,8,16 PACKS_VS=1,4 WORKERS=(--workers 4 --pack 4) RESUME_STEPS=50000
  CHECK=(--self-check 4)
fi
mkdir -p "$OUT"
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
fi
$PY -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/gpu.txt"

# limit S CMD...: CMD under a timeout of S seconds, cut to what is left of the budget (less 40 s:
# 30 for a clean stop after the TERM, 10 to write up); skipped when under 20 s are left.
limit() {
  local left=$((BUDGET_S - SECONDS - 40)) t=$1
  t=$((t < CAP_S ? t : CAP_S)) && t=$((t < left ? t : left))
  if [ "$t" -lt 20 ]; then echo "skipped (${left}s of the budget left): ${*:2}" >&2; return 0; fi
  timeout -k 30 "$t" "${@:2}"
}
has() { [[ $SECTIONS == *" $1 "* ]]; }
bench() {
  limit "$1" $PY launch.py bench --device "$DEVICE" --json "${@:2}" "${TINY[@]}" "${FEW[@]}" |
    tee -a "$OUT/bench.jsonl"
}
# The self-check first: is the fast path sound on this device? (Compiling included: graphs
# that fail fall back to a compile without them, a second compile.) A verdict that is not sound
# exits 1; the other sections still run.
limit 300 $PY launch.py bench --device "$DEVICE" --task walker-walk --model-size 5 "${CHECK[@]}" \
  --json "${TINY[@]}" >"$OUT/self-check.json" 2>"$OUT/self-check.log"
$PY -c 'import json, sys; from bench.self_check import format_self_check as f
print(f(json.load(open(sys.argv[1]))))' "$OUT/self-check.json" 2>/dev/null ||
  { echo "self-check: no verdict (see $OUT/self-check.log)"; tail -5 "$OUT/self-check.log"; }
if has speed; then # side by side: compiled (CUDA graphs) and eager, per model size
  bench 240 --model-size 5 --repeats 50 --warmup 10
  bench 90 --model-size 5 --no-compile --repeats 30 --warmup 5
  bench 240 --model-size 5 --obs rgb --repeats 50 --warmup 10 # from pixels (EGL rendering)
  bench 240 --model-size 1 --repeats 50 --warmup 10
  bench 90 --model-size 1 --no-compile --repeats 30 --warmup 5
fi
if has learn; then # the authors' cartpole-balance protocol: 1M, 3 eval episodes every 1k steps
  limit "${LEARN_S:-200}" $PY launch.py --headless --device "$DEVICE" --task cartpole-balance \
    --model-size 1 --steps 6000 --eval-every 1000 --eval-episodes 3 --quiet \
    --run-dir "$OUT/learn-cartpole-balance" "${TINY[@]}" "${SHORT[@]}" 2>&1 |
    tee "$OUT/learn-cartpole-balance.log" | tail -3
  grep -s '"eval"' "$OUT/learn-cartpole-balance/metrics.jsonl" | cut -c1-160
fi
if has pack; then
  # Compiled packs alone (CUDA graphs; the baseline is the pack of 1: one worker), then K
  # workers as one pack against K processes, eager: compiling in each of the K processes too
  # would take minutes per K (about 100 s for one compile on the H200).
  bench 330 --pack "$PACKS" --pack-only --model-size 5 --repeats 20 --warmup 3 |
    tee "$OUT/pack-compiled.json"
  bench 200 --pack "$PACKS_VS" --model-size 5 --no-compile --repeats 20 --warmup 3 |
    tee "$OUT/pack-vs-processes.json"
fi
if has walker; then # learning with a pack of 4 workers in one process, for as long as is left
  # less 100 s: the stopped run (a checkpoint per worker) is then resumed for 60 s, the check
  # that a compiled pack's checkpoints load on the GPU.
  limit $((BUDGET_S - SECONDS - 140)) $PY launch.py --headless --device "$DEVICE" \
    --task walker-walk "${WORKERS[@]}" --steps 50000 --eval-every 5000 --eval-episodes 3 \
    --quiet --run-dir "$OUT/walker-pack4" "${TINY[@]}" "${SHORT[@]}" 2>&1 |
    tee "$OUT/walker-pack4.log" | tail -3
  limit 60 $PY launch.py --headless --resume "$OUT/walker-pack4" --steps "$RESUME_STEPS" \
    --quiet 2>&1 | tee "$OUT/walker-resume.log" | tail -3
  grep -hs '"resumed"\|"error"\|"crashed"' "$OUT"/walker-pack4/worker-*.jsonl | cut -c1-300 |
    tee "$OUT/walker-resume.txt"
  grep -s '"eval"' "$OUT"/walker-pack4/worker-*.jsonl | cut -c1-200 | tee "$OUT/walker-pack4.txt"
fi
if has pixels; then # walker-walk from pixels, 5M, a pack of 4, as long as is left (the
  # authors' pixel curve: 464 at 100k environment steps, 50k agent steps; their 3 seeds' mean)
  limit $((BUDGET_S - SECONDS - 60)) $PY launch.py --headless --device "$DEVICE" \
    --task walker-walk --obs rgb "${WORKERS[@]}" --steps 100000 --eval-every 5000 \
    --eval-episodes 3 --quiet --run-dir "$OUT/walker-pixels" "${TINY[@]}" "${SHORT[@]}" 2>&1 |
    tee "$OUT/walker-pixels.log" | tail -3
  grep -s '"eval"' "$OUT"/walker-pixels/worker-*.jsonl | cut -c1-200 | tee "$OUT/walker-pixels.txt"
fi
# Why any compiled graph ran without CUDA graphs (the bench JSON has them per run as well).
grep -hs "skipping cudagraphs" "$OUT"/*.log | sort | uniq -c | tee "$OUT/cudagraph-skips.txt"
echo "gpu-bench: ${SECONDS}s of ${BUDGET_S}s, results in $OUT"
