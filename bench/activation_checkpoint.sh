#!/usr/bin/env bash
# What activation checkpointing saves and costs on the ~100M-param GPT (8
# layers, d_model 1024, seq 128) on 2 local ranks: peak RSS and step time
# with each block's activations kept vs recomputed in backward
# (zero-train --checkpoint-activations), side by side in one invocation.
# Prints one JSON object (each run's zero-train summary record).
#   bench/activation_checkpoint.sh BUILD_DIR [STEPS] [MICRO_BATCH]
# ZERO_BENCH_STAGES ("0 3") and ZERO_BENCH_DTYPES ("fp32") narrow or widen it.
set -euo pipefail
B=${1:-build}
STEPS=${2:-4}
MICRO=${3:-8}

. "$(dirname "$0")/lib.sh"
bench_model big

echo '{"bench": "activation_checkpoint", "ranks": 2, "micro_batch": '"$MICRO"', "date": "'"$(date -u +%F)"'", "runs": ['
first=1
for stage in ${ZERO_BENCH_STAGES:-0 3}; do
  for dtype in ${ZERO_BENCH_DTYPES:-fp32}; do
    for ckpt in off on; do
      bench_config "$stage" "$dtype" "$MICRO"
      args=(--steps "$STEPS" "${model_args[@]}")
      [ $ckpt = on ] && args+=(--checkpoint-activations)
      summary=$(zero_train_summary "${args[@]}")
      [ $first = 1 ] || echo ','
      first=0
      printf '    {"stage": %s, "dtype": "%s", "checkpoint_activations": "%s", "summary": %s}' "$stage" "$dtype" \
        "$ckpt" "$summary"
    done
  done
done
printf '\n]}\n'
