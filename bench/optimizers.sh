#!/usr/bin/env bash
# The optimizer step of each optimizer (AdamW, Lion, Adagrad, Lamb, Muon) at
# stages 0 and 3 on the 101M GPT (8 x 1024), 2 ranks, fp32: DeepSpeed's
# wall_clock_breakdown "step" time (the update, and at stage 3 nothing
# else; the params' all-gather is "step_allgather"), averaged over the run.
#
#   bench/optimizers.sh [build] [steps] > bench/results/optimizers.json
# ZERO_BENCH_OPTIMIZERS ("AdamW Lion Adagrad Lamb Muon") narrows a run (Muon
# takes about a minute a step here).
set -euo pipefail
B=${1:-build}
STEPS=${2:-4}

. "$(dirname "$0")/lib.sh"

bench_model big
echo '{"bench": "optimizers", "model": "gpt 8x1024", "ranks": 2, "date": "'"$(date -u +%F)"'", "runs": ['
first=1
for opt in ${ZERO_BENCH_OPTIMIZERS:-AdamW Lion Adagrad Lamb Muon}; do
  for stage in 0 3; do
    bench_config "$stage" fp32
    # The same config with this optimizer and the timers printed once, at the last step.
    sed -i "s/\"type\": \"AdamW\"/\"type\": \"$opt\"/; s/^{ /{ \"wall_clock_breakdown\": true, \"steps_per_print\": $STEPS, /" "$tmp/c.json"
    "$B/zero-run" -n 2 -- "$B/zero-train" --config "$tmp/c.json" --steps "$STEPS" "${model_args[@]}" \
      > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt" >&2; exit 1; }
    line=$(grep 'time (ms, per step)' "$tmp/out.txt" | tail -1)
    step=$(sed -n 's/.* step: \([0-9.]*\).*/\1/p' <<< "$line")
    gather=$(sed -n 's/.*step_allgather: \([0-9.]*\).*/\1/p' <<< "$line")
    [ $first = 1 ] || echo ','
    first=0
    printf '    {"optimizer": "%s", "stage": %s, "step_ms": %s, "step_allgather_ms": %s}' "$opt" "$stage" \
      "${step:-null}" "${gather:-null}"
  done
done
echo
echo ']}'
