#!/usr/bin/env bash
# The GPU benchmark (./run gpu-bench on a GPU machine): the bundled GPT at a
# size that fills much of one GPU, one rank, side by side in one run --
# zero-cpp stages 0-3 (bf16, the model on cuda:0) against PyTorch DDP and
# FSDP2 on the same torch (ZERO_PEER_DEVICE=cuda in peer_gpt.py), the same
# initial weights, batches, optimizer and clipping. Step time, tokens/s and
# peak GPU memory per run; prints one JSON object.
#   bench/gpu.sh BUILD_DIR PYTHON [STEPS]
# STATUS: written without a GPU to run it on; only its plumbing has run (on
# the CPU: ZERO_GPU_BENCH_DEVICE=cpu with a tiny ZERO_GPU_BENCH_MODEL).
set -euo pipefail
B=${1:-build-gpu}
PY=${2:-python3}
STEPS=${3:-8}
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)

# ~1.2B params (12 L d^2): bf16 params + fp32 master and moments ~ 20 GB at
# stage 0, activations for micro-batch 8 x 1024 tokens on top.
read -r -a MODEL <<< "${ZERO_GPU_BENCH_MODEL:---layers 24 --d-model 2048 --heads 16 --seq 1024}"
MICRO=${ZERO_GPU_BENCH_MICRO:-8}
DEVICE=${ZERO_GPU_BENCH_DEVICE:-cuda}
L=${MODEL[1]} D=${MODEL[3]} H=${MODEL[5]} S=${MODEL[7]}
"$B/bench/bench_export_gpt" "$tmp" "$L" "$D" "$H" "$S" "$MICRO" "$STEPS"

echo '{"bench": "gpu", "ranks": 1, "device": "'"$( { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "$DEVICE"; } | head -1)"'",'
echo ' "date": "'"$(date -u +%F)"'", "model": "'"${MODEL[*]}"'", "micro_batch": '"$MICRO"', "runs": ['
first=1
for stage in 0 1 2 3; do
  bench_config "$stage" bf16 "$MICRO"
  "$B/zero-run" -n 1 -- "$B/zero-train" --config "$tmp/c.json" --device "$DEVICE" --steps "$STEPS" "${MODEL[@]}" \
    --log-json "$tmp/log.jsonl" > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt" >&2; exit 1; }
  [ $first = 1 ] || echo ','
  first=0
  printf '  {"run": "zero-cpp", "stage": %s, "dtype": "bf16", "losses": %s, "summary": %s}' \
    "$stage" "$(last_losses)" "$(grep '"event":"summary"' "$tmp/log.jsonl")"
done
# The seeds' own ratios that this build can measure:
# seed 002, four backward passes per step with and without
# coalesce_grad_reduction (stage 2); seed 003, the stage-3 model built under
# zero::Init flattening each unit on the device vs in pinned host memory
# (ZERO_INIT_DEVICE_FLATTEN=off).
bench_config 2 bf16 "$MICRO"
for mode in separate coalesce; do
  flag=(); [ $mode = coalesce ] && flag=(--coalesce)
  "$B/zero-run" -n 1 -- "$B/zero-train" --config "$tmp/c.json" --device "$DEVICE" --steps "$STEPS" "${MODEL[@]}" \
    --backward-chunks 4 "${flag[@]}" --log-json "$tmp/log.jsonl" > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt" >&2; exit 1; }
  printf ',\n  {"run": "zero-cpp seed 002", "stage": 2, "backward_chunks": 4, "reduction": "%s", "summary": %s}' \
    "$mode" "$(grep '"event":"summary"' "$tmp/log.jsonl")"
done
bench_config 3 bf16 "$MICRO"
for flatten in device host; do
  env_flag=(); [ $flatten = host ] && env_flag=(ZERO_INIT_DEVICE_FLATTEN=off)
  env "${env_flag[@]}" "$B/zero-run" -n 1 -- "$B/zero-train" --config "$tmp/c.json" --device "$DEVICE" --steps 1 \
    "${MODEL[@]}" --log-json "$tmp/log.jsonl" > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt" >&2; exit 1; }
  printf ',\n  {"run": "zero-cpp seed 003", "stage": 3, "init_flatten": "%s", "setup": %s}' \
    "$flatten" "$(grep '"event":"setup"' "$tmp/log.jsonl")"
done
# seed 000, stage 3 at 2 ranks (through CUDA IPC on one GPU): the fused
# 16-bit gather against the fp32 master gathered and cast (bench/gather_fusion.sh).
ZERO_GATHER_FUSION_MODEL="${MODEL[*]}" ZERO_GATHER_FUSION_MICRO=$MICRO \
  "$here/gather_fusion.sh" "$B" "$DEVICE" "$STEPS" 1 > "$tmp/gf.json"
printf ',\n  {"run": "zero-cpp seed 000", "result": %s}' "$(cat "$tmp/gf.json")"
# seed 001: CUDA IPC vs NCCL collectives vs the device-to-device copy rate,
# 2 ranks (on one GPU when there is one; NCCL then is left out).
if [ "$DEVICE" = cuda ]; then
  "$B/zero-run" -n 2 -- "$B/bench/bench_cuda_comm" 1024 2>&1 | grep '^\[rank 0\]' | sed 's/^\[rank 0\] //' > "$tmp/cc.json"
  printf ',\n  {"run": "zero-cpp seed 001", "result": %s}' "$(cat "$tmp/cc.json")"
fi
for c in "ddp 0 fp32" "fsdp2 3 bf16"; do
  read -r peer stage dtype <<< "$c"
  bench_config "$stage" "$dtype" "$MICRO"
  ZERO_PEER_DEVICE=$DEVICE "$B/zero-run" -n 1 -- "$PY" "$here/peer_gpt.py" "$peer" "$tmp" "$L" "$D" "$H" "$S" "$STEPS" \
    "$tmp/c.json" "$tmp/peer.json" > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt" >&2; exit 1; }
  printf ',\n  {"run": "%s", "stage": %s, "dtype": "%s", "result": %s}' "$peer" "$stage" "$dtype" "$(cat "$tmp/peer.json")"
done
echo
echo ']}'
