#!/usr/bin/env bash
# The peers -- PyTorch DDP, PyTorch FSDP2 and DeepSpeed ZeRO (the torch in
# the project's environment, Gloo, 2 processes, 1 thread each) -- training
# the same GPTs as bench/stages.sh from the same initial weights and batches
# (exported by bench_export_gpt), with the same ds_config, optimizer,
# clipping and steps. Prints one JSON object.
#   bench/peers.sh BUILD_DIR PYTHON [STEPS_SMALL] [STEPS_100M]
set -euo pipefail
B=${1:-build}
PY=${2:?the python of the torch environment}
STEPS_SMALL=${3:-30}
STEPS_BIG=${4:-6}
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)

# "peer stage dtype" cases. DDP is fp32 and stage-less; FSDP2 and DeepSpeed's
# CPU accelerator take bf16, which they compute in bf16: on CPUs without
# AVX512-BF16 that runs ~10x slower than fp32 (the 100M GPT took over 3
# minutes a step), so bf16 runs on the small GPT only. ZERO_BENCH_MODELS and
# ZERO_PEER_CASES (cases separated by ';') narrow a run.
IFS=';' read -r -a CASES <<< "${ZERO_PEER_CASES:-ddp 0 fp32;fsdp2 3 fp32;fsdp2 3 bf16;deepspeed 0 fp32;deepspeed 3 fp32;deepspeed 3 bf16}"

echo '{"bench": "peers", "ranks": 2, "date": "'"$(date -u +%F)"'", "runs": ['
first=1
for model in ${ZERO_BENCH_MODELS:-small big}; do
  bench_model $model
  steps=$STEPS_BIG; [ $model = small ] && steps=$STEPS_SMALL
  # model_args: --layers L --d-model D --heads H --seq S
  L=${model_args[1]} D=${model_args[3]} H=${model_args[5]} S=${model_args[7]}
  "$B/bench/bench_export_gpt" "$tmp" "$L" "$D" "$H" "$S" 8 "$steps"
  for c in "${CASES[@]}"; do
    read -r peer stage dtype <<< "$c"
    [ "$model" = big ] && [ "$dtype" = bf16 ] && [ -z "${ZERO_PEER_CASES:-}" ] && continue
    bench_config "$stage" "$dtype"
    DS_ACCELERATOR=cpu "$B/zero-run" -n 2 -- "$PY" "$here/peer_gpt.py" "$peer" "$tmp" "$L" "$D" "$H" "$S" "$steps" \
      "$tmp/c.json" "$tmp/peer.json" > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt" >&2; exit 1; }
    [ $first = 1 ] || echo ','
    first=0
    printf '    {"run": "gpt_%s", "peer": "%s", "stage": %s, "dtype": "%s", "result": %s}' \
      "$model" "$peer" "$stage" "$dtype" "$(cat "$tmp/peer.json")"
  done
done
echo
echo ']}'
