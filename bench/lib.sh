# Helpers shared by the shell benchmarks. Source it after setting B (the
# build dir); it makes $tmp, a scratch dir removed at exit.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Writes a ds_config for the benchmark GPTs: stage $1, dtype $2 (fp32|bf16),
# micro-batch $3, to $tmp/c.json. ZERO_BENCH_PREFETCH overrides
# stage3_prefetch_bucket_size (elements; 0: gather on demand only).
bench_config() {
  local stage=$1 dtype=$2 micro=${3:-4} prec=""
  [ "$dtype" = bf16 ] && prec='"bf16": {"enabled": true},'
  cat > "$tmp/c.json" <<JSON
{ "train_micro_batch_size_per_gpu": $micro, "gradient_clipping": 1.0, $prec
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}},
  "zero_optimization": {"stage": $stage, "overlap_comm": true, "reduce_bucket_size": 5e7,
                        "stage3_prefetch_bucket_size": ${ZERO_BENCH_PREFETCH:-2e7}, "stage3_max_live_parameters": 4e7,
                        "stage3_max_reuse_distance": 0, "stage3_param_persistence_threshold": 1e4} }
JSON
}

# Runs zero-train on ZERO_BENCH_RANKS local ranks (2) with $tmp/c.json and the given args;
# prints its summary record (one JSON object).
zero_train_summary() {
  "$B/zero-run" -n "${ZERO_BENCH_RANKS:-2}" -- "$B/zero-train" --config "$tmp/c.json" --log-json "$tmp/log.jsonl" "$@" \
    > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt" >&2; exit 1; }
  grep '"event":"summary"' "$tmp/log.jsonl"
}

# Sets the array `order` to the cases after ROUND: as given in even rounds,
# reversed in odd ones, so a machine that drifts favours no one.
turned_order() {
  local round=$1 i
  shift
  order=("$@")
  if [ $((round % 2)) = 1 ]; then for ((i = $#; i > 0; i--)); do order[$# - i]=${!i}; done; fi
}

# One run of a GPT benchmark's case: WHO (zero | ddp | fsdp2 | deepspeed) at
# STAGE in fp32, STEPS steps, on ZERO_BENCH_RANKS ranks (2); zero-train gets
# the further args, the peers (bench/peer_gpt.py) start from the export in
# $tmp. Needs model_args, L D H S (bench_model), PY and here (bench/).
# Prints zero-train's summary record or the peer's result (one JSON object).
gpt_case_result() {
  local who=$1 stage=$2 steps=$3
  shift 3
  bench_config "$stage" fp32
  if [ "$who" = zero ]; then
    zero_train_summary --steps "$steps" "$@" "${model_args[@]}"
  else
    DS_ACCELERATOR=cpu "$B/zero-run" -n "${ZERO_BENCH_RANKS:-2}" -- "$PY" "$here/peer_gpt.py" "$who" "$tmp" \
      "$L" "$D" "$H" "$S" "$steps" "$tmp/c.json" "$tmp/peer.json" > "$tmp/out.txt" 2>&1 ||
      { cat "$tmp/out.txt" >&2; exit 1; }
    cat "$tmp/peer.json"
  fi
}

# The rounds of a GPT benchmark of several cases ("WHO STAGE" each), after
# exporting MODEL's weights and batches: ROUNDS rounds of STEPS steps, the
# order turned every round, each run's record a line of $tmp/runs.jsonl.
# Needs MODEL, RANKS, ROUNDS, STEPS, PY and here; sets L D H S and runs.
run_gpt_cases() {
  bench_model "$MODEL"
  L=${model_args[1]} D=${model_args[3]} H=${model_args[5]} S=${model_args[7]}
  "$B/bench/bench_export_gpt" "$tmp" "$L" "$D" "$H" "$S" $((4 * RANKS)) "$STEPS"
  runs=$tmp/runs.jsonl
  local round c who stage result
  for ((round = 0; round < ROUNDS; round++)); do
    turned_order "$round" "$@"
    for c in "${order[@]}"; do
      read -r who stage <<< "$c"
      result=$(gpt_case_result "$who" "$stage" "$STEPS")
      printf '{"round": %d, "who": "%s", "stage": %s, "result": %s}\n' "$round" "$who" "$stage" "$result" >> "$runs"
    done
  done
}

# The per-step losses of the last zero_train_summary run, as a JSON array.
last_losses() {
  echo "[$(grep '"event":"step"' "$tmp/log.jsonl" | grep -o '"loss":[^,]*' | cut -d: -f2 | paste -sd, -)]"
}

# The benchmark GPTs: sets `model_args` for "small" (4 x 256, 3.3M params),
# "big" (8 x 1024, ~101M) or "large" (24 x 1024, ~302M: the largest on which
# stage 0 and every peer fit in 24 GiB at 2 ranks; a ~1B GPT's stage 0 needs
# 2 x 15.6 GB of model state alone).
bench_model() {
  case $1 in
    small) model_args=(--layers 4 --d-model 256 --heads 4 --seq 128) ;;
    large) model_args=(--layers 24 --d-model 1024 --heads 16 --seq 128) ;;
    *) model_args=(--layers 8 --d-model 1024 --heads 16 --seq 128) ;;
  esac
}

# GB/s of direct sequential I/O in directory $1 by fio (io_uring, 1 MiB
# blocks, queue depth 8: the aio block's defaults), $2 read | write, over a
# file of $3 (e.g. 1G); null without fio. What NVMe offload runs are set against.
disk_gbps() {
  command -v fio >/dev/null || { echo null; return; }
  fio --name=bw --directory="$1" --size="$3" --bs=1M --iodepth=8 --ioengine=io_uring --direct=1 \
    --rw="$2" --output-format=json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]['$2']; print(round(j['bw_bytes']/1e9, 3))"
  rm -f "$1"/bw.*
}
