#!/usr/bin/env bash
# End-to-end step time of stages 1/2/3 with the shared-memory fast path (the
# default) and without it (ZERO_COMM_FASTPATH=off: Gloo over loopback), on 2
# local ranks, fp32 and bf16, for the standard GPT and the ~100M-param GPT.
# The two runs of each pair are back to back in one invocation: compare them
# as ratios. Prints one JSON object.
#   bench/fastpath.sh BUILD_DIR [STEPS_SMALL] [STEPS_100M]
set -euo pipefail
B=${1:-build}
STEPS_SMALL=${2:-30}
STEPS_BIG=${3:-6}
. "$(dirname "$0")/lib.sh"

echo '{"bench": "fastpath", "ranks": 2, "omp_threads_per_rank": 1, "date": "'"$(date -u +%F)"'", "runs": ['
first=1
for model in small big; do
  bench_model $model
  steps=$STEPS_BIG; [ $model = small ] && steps=$STEPS_SMALL
  for dtype in fp32 bf16; do
    for stage in 1 2 3; do
      bench_config "$stage" "$dtype"
      for fast in on off; do
        [ $first = 1 ] || echo ','
        first=0
        printf '    {"model": "gpt_%s", "stage": %s, "dtype": "%s", "fast_path": "%s", "summary": %s}' \
          "$model" "$stage" "$dtype" "$fast" \
          "$(ZERO_COMM_FASTPATH=$fast zero_train_summary --steps "$steps" "${model_args[@]}")"
      done
    done
  done
done
echo
echo ']}'
