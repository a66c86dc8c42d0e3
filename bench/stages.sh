#!/usr/bin/env bash
# Step time, tokens/s, peak RSS and model-state bytes of stages 0/1/2/3 on 2
# local ranks, for the standard GPT (4 layers, d_model 256, seq 128,
# micro-batch 4) and a ~100M-param GPT (8 layers, d_model 1024). Stages run
# back to back in one invocation, so compare them as ratios.
# Prints one JSON object (the summary record of each zero-train run).
#   bench/stages.sh BUILD_DIR [STEPS_SMALL] [STEPS_100M]
set -euo pipefail
B=${1:-build}
STEPS_SMALL=${2:-30}
STEPS_BIG=${3:-6}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() {  # name stage dtype steps zero-train-args...
  local name=$1 stage=$2 dtype=$3 steps=$4; shift 4
  local prec=""
  [ "$dtype" = bf16 ] && prec='"bf16": {"enabled": true},'
  cat > "$tmp/c.json" <<JSON
{ "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0, $prec
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}},
  "zero_optimization": {"stage": $stage, "overlap_comm": true, "reduce_bucket_size": 5e7,
                        "stage3_prefetch_bucket_size": 2e7, "stage3_max_live_parameters": 4e7,
                        "stage3_max_reuse_distance": 0, "stage3_param_persistence_threshold": 1e4} }
JSON
  "$B/zero-run" -n 2 -- "$B/zero-train" --config "$tmp/c.json" --steps "$steps" --log-json "$tmp/log.jsonl" "$@" \
    > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt" >&2; exit 1; }
  local summary
  summary=$(grep '"event":"summary"' "$tmp/log.jsonl")
  printf '    {"run": "%s", "stage": %s, "dtype": "%s", "summary": %s}' "$name" "$stage" "$dtype" "$summary"
}

echo '{"bench": "stages", "ranks": 2, "omp_threads_per_rank": 1, "date": "'"$(date -u +%F)"'", "runs": ['
first=1
for model in small big; do
  if [ $model = small ]; then args=(--layers 4 --d-model 256 --heads 4 --seq 128); steps=$STEPS_SMALL
  else args=(--layers 8 --d-model 1024 --heads 16 --seq 128); steps=$STEPS_BIG; fi
  for dtype in fp32 bf16; do
    for stage in 0 1 2 3; do
      [ $first = 1 ] || echo ','
      first=0
      run "gpt_$model" $stage $dtype $steps "${args[@]}"
    done
  done
done
echo
echo ']}'
