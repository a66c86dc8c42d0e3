#!/usr/bin/env bash
# The peer: PyTorch's DistributedDataParallel (Debian's python3-torch, Gloo,
# 2 processes, 1 thread each) training the same GPTs as bench/stages.sh from
# the same initial weights and batches (exported by bench_export_gpt), with
# the same optimizer, clipping and steps. Prints one JSON object.
#   bench/ddp.sh BUILD_DIR [STEPS_SMALL] [STEPS_100M]
set -euo pipefail
B=${1:-build}
STEPS_SMALL=${2:-30}
STEPS_BIG=${3:-6}
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)

echo '{"bench": "ddp", "ranks": 2, "date": "'"$(date -u +%F)"'", "runs": ['
first=1
for model in small big; do
  bench_model $model
  steps=$STEPS_BIG; [ $model = small ] && steps=$STEPS_SMALL
  # model_args: --layers L --d-model D --heads H --seq S
  L=${model_args[1]} D=${model_args[3]} H=${model_args[5]} S=${model_args[7]}
  "$B/bench/bench_export_gpt" "$tmp" "$L" "$D" "$H" "$S" 8 "$steps"
  "$B/zero-run" -n 2 -- /usr/bin/python3 "$here/ddp_gpt.py" "$tmp" "$L" "$D" "$H" "$S" "$steps" 3e-4 0.01 \
    "$tmp/ddp.json" > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt" >&2; exit 1; }
  [ $first = 1 ] || echo ','
  first=0
  printf '    {"run": "gpt_%s", "result": %s}' "$model" "$(cat "$tmp/ddp.json")"
done
echo
echo ']}'
