#!/usr/bin/env bash
# Step time, tokens/s, peak RSS and model-state bytes of stages 0/1/2/3 on 2
# local ranks, for the standard GPT (4 layers, d_model 256, seq 128,
# micro-batch 4) and a ~100M-param GPT (8 layers, d_model 1024). Stages run
# back to back in one invocation, so compare them as ratios.
# Prints one JSON object (the summary record of each zero-train run).
#   bench/stages.sh BUILD_DIR [STEPS_SMALL] [STEPS_100M]
# ZERO_BENCH_MODELS ("small big"), ZERO_BENCH_DTYPES, ZERO_BENCH_STAGES narrow a run.
set -euo pipefail
B=${1:-build}
STEPS_SMALL=${2:-30}
STEPS_BIG=${3:-6}

. "$(dirname "$0")/lib.sh"

run() {  # name stage dtype steps zero-train-args...
  local name=$1 stage=$2 dtype=$3 steps=$4; shift 4
  bench_config "$stage" "$dtype"
  local summary
  summary=$(zero_train_summary --steps "$steps" "$@")
  printf '    {"run": "%s", "stage": %s, "dtype": "%s", "summary": %s, "losses": %s}' "$name" "$stage" "$dtype" \
    "$summary" "$(last_losses)"
}

echo '{"bench": "stages", "ranks": 2, "omp_threads_per_rank": 1, "date": "'"$(date -u +%F)"'", "runs": ['
first=1
for model in ${ZERO_BENCH_MODELS:-small big}; do
  bench_model $model
  steps=$STEPS_BIG; [ $model = small ] && steps=$STEPS_SMALL
  for dtype in ${ZERO_BENCH_DTYPES:-fp32 bf16}; do
    for stage in ${ZERO_BENCH_STAGES:-0 1 2 3}; do
      [ $first = 1 ] || echo ','
      first=0
      run "gpt_$model" $stage $dtype $steps "${model_args[@]}"
    done
  done
done
echo
echo ']}'
