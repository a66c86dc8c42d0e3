#!/usr/bin/env bash
# Several backward passes per step, with and without
# engine.coalesce_grad_reduction(): step time and reduce-scatter calls/bytes
# per step for K = 4 backward chunks per micro-batch, stages 2 and 3, 2 local
# ranks, the standard GPT (4 layers, d_model 256, seq 128) at micro-batch 8
# (chunks of 2 sequences). The seed (DeepSpeed PR 7992) reports 203 -> 120 ms
# (stage 2) and 177 -> 133 ms (stage 3) on GPUs. Runs alternate within one
# invocation: compare them as ratios. Prints one JSON object.
#   bench/coalesce.sh BUILD_DIR [STEPS] [CHUNKS]
set -euo pipefail
B=${1:-build}
STEPS=${2:-20}
K=${3:-4}
. "$(dirname "$0")/lib.sh"
bench_model small

echo '{"bench": "coalesce", "ranks": 2, "backward_chunks": '"$K"', "omp_threads_per_rank": 1, "date": "'"$(date -u +%F)"'", "runs": ['
first=1
for stage in 2 3; do
  bench_config "$stage" fp32 8
  for mode in separate coalesce; do
    flag=(); [ $mode = coalesce ] && flag=(--coalesce)
    [ $first = 1 ] || echo ','
    first=0
    printf '    {"stage": %s, "mode": "%s", "summary": %s}' "$stage" "$mode" \
      "$(zero_train_summary --steps "$STEPS" "${model_args[@]}" --backward-chunks "$K" "${flag[@]}")"
  done
done
echo
echo ']}'
