#!/usr/bin/env bash
# The GPU benchmark (./run gpu-bench on a GPU machine): the bundled GPT on
# one GPU, one rank, side by side in one run -- zero-cpp stages 0-3 (bf16,
# the model on cuda:0) against PyTorch DDP (autocast bf16) and FSDP2 (bf16
# params) on the same torch and DeepSpeed's stages 0, 2 and 3 (bf16; carried
# as wheels, bench/peer_wheels.sh), all from the same initial weights and
# batches (bench_export_gpt), with the same optimizer, clipping and
# ds_config; ZeRO-Offload (stage 2 with the optimizer on the host, stage 3
# with the params too) against DeepSpeed's own (DeepSpeedCPUAdam, JIT-built
# there); then the seeds' ratios, each from runs taken here (000: fused
# vs unfused stage-3 gather at 2 ranks through CUDA IPC; 001: CUDA IPC vs
# NCCL collectives; 002: four backward passes per step, coalesced or not;
# 003: zero::Init flattening on the device vs in host memory). Step time
# (median of the timed steps, the first two left out), tokens/s, peak GPU
# memory and the losses per run; prints one JSON object on stdout. The
# runs each goal of issue 36 needs go first (the end of the file lists the
# order), so a budget spent skips only the rest.
# bench/gpu_report.py turns it into one markdown table.
#   bench/gpu.sh BUILD_DIR PYTHON [STEPS]
# Environment (defaults in brackets):
#   ZERO_GPU_BENCH_MODEL   zero-train's model args [--layers 12 --d-model 2048 --heads 16 --seq 1024]
#   ZERO_GPU_BENCH_MICRO   micro-batch = global batch (1 rank) [8]
#   ZERO_GPU_BENCH_DEVICE  cuda | cpu (the plumbing check without a GPU) [cuda]
#   ZERO_GPU_BENCH_INIT_LARGE  model args of seed 003's larger build, the GPT's
#                          host footprint while built on the device
#                          [--layers 24 --d-model 3072 --heads 24 --seq 1024, ~2.7B]
#   ZERO_GPU_BENCH_LOGS    a folder for every run's log; emptied first [bench/results/gpu-logs]
#   ZERO_GPU_BENCH_BUDGET  seconds for the whole bench; runs that would start
#                          after it are recorded as skipped [300]
#   ZERO_GPU_BENCH_RUN_TIMEOUT  seconds one run may take before it is stopped [150]
#   ZERO_PEER_DS_ADAM      DeepSpeed's AdamW: torch (torch.optim.AdamW, as the
#                          other peers; nothing to compile) | fused (FusedAdam, JIT) [torch]
# A run that fails or times out is recorded with its error and the others go
# on; the console gets one line per run, the logs stay in ZERO_GPU_BENCH_LOGS.
# STATUS: ran whole on an H100 on 2026-11-26, every run in 230 s (figures in
# docs/gpu.md); its plumbing also runs on the CPU (ZERO_GPU_BENCH_DEVICE=cpu
# with a tiny ZERO_GPU_BENCH_MODEL).
set -euo pipefail
B=${1:-build-gpu}
PY=${2:-python3}
STEPS=${3:-10}
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)

# ~604M params (12 L d^2 + embeddings): at stage 0 bf16 params + fp32 master
# and moments ~10 GB, activations for 8 x 1024 tokens on top (~15 GB
# when the attention kept B x heads x T x T scores; fused now, far less). Small enough that DDP's
# autocast (fp32 params, fp32 softmax) and seed 000's two ranks sharing the
# GPU fit an H100, and that ~16 runs fit the bench's time budget.
read -r -a MODEL <<< "${ZERO_GPU_BENCH_MODEL:---layers 12 --d-model 2048 --heads 16 --seq 1024}"
MICRO=${ZERO_GPU_BENCH_MICRO:-8}
DEVICE=${ZERO_GPU_BENCH_DEVICE:-cuda}
LOGS=${ZERO_GPU_BENCH_LOGS:-bench/results/gpu-logs}
BUDGET=${ZERO_GPU_BENCH_BUDGET:-300}
RUN_TIMEOUT=${ZERO_GPU_BENCH_RUN_TIMEOUT:-150}
export ZERO_PEER_DS_ADAM=${ZERO_PEER_DS_ADAM:-torch}
L=${MODEL[1]} D=${MODEL[3]} H=${MODEL[5]} S=${MODEL[7]}
mkdir -p "$LOGS"
rm -f "$LOGS"/*.log "$LOGS"/*.jsonl "$LOGS"/*.json
records=$tmp/records.jsonl
: > "$records"
start=$SECONDS

say() { echo "gpu.sh: $*" >&2; }
json_str() { python3 -c 'import json, sys; print(json.dumps(sys.stdin.read().strip()))'; }
compact() { python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$1"; }  # one line

# attempt FIELDS NAME STDOUT CMD...: runs CMD with a timeout, its stderr (and
# its stdout when STDOUT is -) into $LOGS/NAME.log. On failure, a timeout or a
# spent budget, appends a record {FIELDS, "error" or "skipped": ...} and
# returns 1; the caller appends the record of a success.
attempt() {
  local fields=$1 name=$2 out=$3; shift 3
  local left=$((BUDGET - (SECONDS - start)))
  if ((left < 15)); then
    echo "{$fields, \"skipped\": \"the bench's time budget (ZERO_GPU_BENCH_BUDGET=$BUDGET s) was spent\"}" >> "$records"
    say "$name skipped (budget spent)"
    return 1
  fi
  local t=$((left < RUN_TIMEOUT ? left : RUN_TIMEOUT)) rc=0 t0=$SECONDS
  if [ "$out" = - ]; then
    timeout -k 10 "$t" "$@" > "$LOGS/$name.log" 2>&1 || rc=$?
  else
    timeout -k 10 "$t" "$@" > "$out" 2> "$LOGS/$name.log" || rc=$?
  fi
  if ((rc != 0)); then
    local why="exit $rc"
    ((rc == 124 || rc == 137)) && why="stopped after $t s (ZERO_GPU_BENCH_RUN_TIMEOUT=$RUN_TIMEOUT, budget left $left s)"
    local last
    # The last line that is not the launcher's own (zero-run names the rank
    # that stopped; the rank's own last words say why).
    last=$( { grep -v -e '^[[:space:]]*$' -e '^zero-run:' "$LOGS/$name.log" || true; } | tail -n 1 | cut -c1-400 | json_str)
    echo "{$fields, \"error\": $(echo "$why" | json_str), \"last_line\": $last, \"log\": \"$name.log\"}" >> "$records"
    say "$name FAILED ($why; $LOGS/$name.log)"
    return 1
  fi
  say "$name ok ($((SECONDS - t0)) s)"
}

# zero_train FIELDS NAME RANKS [ENV=VALUE...] -- ZERO-TRAIN ARGS...: zero-train
# on RANKS local ranks (sharing the GPU) with $tmp/c.json; rank 0's JSON log is
# $LOGS/NAME.jsonl.
zero_train() {
  local fields=$1 name=$2 ranks=$3; shift 3
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  attempt "$fields" "$name" - env "${envs[@]}" "$B/zero-run" -n "$ranks" -- "$B/zero-train" --config "$tmp/c.json" \
    --device "$DEVICE" "${MODEL[@]}" --log-json "$LOGS/$name.jsonl" "$@"
}
record_of() { grep "\"event\":\"$2\"" "$LOGS/$1.jsonl" | tail -n 1; }
# The median over the timed steps (3 on) of each wall_clock_breakdown timer
# zero-train logged (times_ms: forward, backward, backward_allreduce, step,
# step_allgather); {} when the run had none.
times_of() {
  python3 - "$LOGS/$1.jsonl" <<'PY'
import json, statistics, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "step" and "times_ms" in r]
steps = steps[2:] or steps
names = steps[0]["times_ms"] if steps else {}
print(json.dumps({n: round(statistics.median(r["times_ms"][n] for r in steps), 3) for n in names}))
PY
}
losses_of() {
  echo "[$(grep '"event":"step"' "$LOGS/$1.jsonl" | grep -o '"loss":[^,]*' | cut -d: -f2 | paste -sd, -)]"
}

# What this machine has: the GPU, torch, DeepSpeed (an import, offline).
gpu_name=$( { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "$DEVICE"; } | head -1)
torch_version=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "not importable")
ds_import=$tmp/ds_import.txt
if DS_ACCELERATOR=$DEVICE "$PY" -c 'import deepspeed; print(deepspeed.__version__)' > "$ds_import" 2>&1; then
  ds_version=$(tail -n 1 "$ds_import")
  ds_error=""
else
  ds_version=""
  ds_error=$(grep -v '^[[:space:]]*$' "$ds_import" | tail -n 1)
  cp "$ds_import" "$LOGS/deepspeed-import.log"
  say "deepspeed does not import with $PY ($ds_error): its runs are skipped (bench/peer_wheels.sh install DIR, then PYTHONPATH)"
fi

# 1. The weights and batches every run starts from.
export_ok=1
attempt '"run": "export"' export - "$B/bench/bench_export_gpt" "$tmp" "$L" "$D" "$H" "$S" "$MICRO" "$STEPS" || export_ok=0

# 2. zero-cpp at STAGE.
zero_stage() {
  local stage=$1 f
  bench_config "$stage" bf16 "$MICRO"
  f="\"run\": \"zero-cpp\", \"stage\": $stage, \"dtype\": \"bf16\""
  if zero_train "$f" "zero-stage$stage" 1 -- --steps "$STEPS"; then
    echo "{$f, \"log\": \"zero-stage$stage.log\", \"losses\": $(losses_of "zero-stage$stage"), \
\"summary\": $(record_of "zero-stage$stage" summary)}" >> "$records"
  fi
}

# zero-cpp's Python front end (issue 35 item 8): the package beside this
# build's extension (ZERO_GPU_BENCH_PYTHONPATH, default BUILD/python), built
# for this machine's python.
zc_path=${ZERO_GPU_BENCH_PYTHONPATH:-$B/python}
zc_import=$tmp/zc_import.txt
if PYTHONPATH=$zc_path${PYTHONPATH:+:$PYTHONPATH} "$PY" -c 'import zero_cpp' > "$zc_import" 2>&1; then
  zc_error=""
else
  zc_error=$(grep -v '^[[:space:]]*$' "$zc_import" | tail -n 1)
  say "zero_cpp does not import from $zc_path ($zc_error): the Python front end's runs are skipped"
fi

# 3. PEER at STAGE, same dtype, same weights and batches (the export); the
# Python front end (zero_cpp) is one of them.
peer_run() {
  local peer=$1 stage=$2 f name
  f="\"run\": \"$peer\", \"stage\": $stage, \"dtype\": \"bf16\""
  name="$peer-stage$stage"
  if [ $export_ok = 0 ]; then
    echo "{$f, \"skipped\": \"the export failed\"}" >> "$records"
    return
  fi
  if [ "$peer" = deepspeed ] && [ -n "$ds_error" ]; then
    echo "{$f, \"skipped\": $(echo "deepspeed does not import: $ds_error" | json_str)}" >> "$records"
    return
  fi
  if [ "$peer" = zero_cpp ] && [ -n "$zc_error" ]; then
    echo "{$f, \"skipped\": $(echo "zero_cpp does not import: $zc_error" | json_str)}" >> "$records"
    return
  fi
  bench_config "$stage" bf16 "$MICRO"
  if attempt "$f" "$name" - env ZERO_PEER_DEVICE="$DEVICE" DS_ACCELERATOR="$DEVICE" ZERO_CPP_HOOK_TIMES=1 \
      PYTHONPATH="$zc_path${PYTHONPATH:+:$PYTHONPATH}" "$B/zero-run" -n 1 -- \
      "$PY" "$here/peer_gpt.py" "$peer" "$tmp" "$L" "$D" "$H" "$S" "$STEPS" "$tmp/c.json" "$LOGS/$name.json"; then
    echo "{$f, \"log\": \"$name.log\", \"result\": $(compact "$LOGS/$name.json")}" >> "$records"
  fi
}

# 4. ZeRO-Offload against DeepSpeed's (issue 36 item 5), same model and
# batches: stage 2 with the optimizer's state and step on the host, stage 3
# with the params' shards there too (pinned). DeepSpeed runs its own
# ZeRO-Offload optimizer, DeepSpeedCPUAdam (ZERO_PEER_DS_ADAM=fused: with
# offload its engine picks the CPU Adam, a JIT build of its cpu_adam op with
# ninja and the machine's compiler, counted in that run's time, not in its
# step).
offload_config() {  # edits $tmp/c.json: optimizer | param+optimizer on the host
  python3 - "$tmp/c.json" "$1" <<'PY'
import json, sys
path, what = sys.argv[1:3]
c = json.load(open(path))
z = c["zero_optimization"]
z["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
c["wall_clock_breakdown"] = True  # where the step's time goes (device-synchronised timers)
if what == "param+optimizer":
    z["offload_param"] = {"device": "cpu", "pin_memory": True}
json.dump(c, open(path, "w"), indent=1)
PY
}
offload_pair() {  # STAGE WHAT: zero-cpp's run, then DeepSpeed's
  local stage=$1 what=$2 f name
  bench_config "$stage" bf16 "$MICRO"
  offload_config "$what"
  f="\"run\": \"zero-cpp\", \"stage\": $stage, \"dtype\": \"bf16\", \"offload\": \"$what\""
  name="zero-stage$stage-offload"
  if zero_train "$f" "$name" 1 -- --steps "$STEPS"; then
    echo "{$f, \"log\": \"$name.log\", \"losses\": $(losses_of "$name"), \"summary\": $(record_of "$name" summary), \
\"times_ms\": $(times_of "$name")}" >> "$records"
  fi
  f="\"run\": \"deepspeed\", \"stage\": $stage, \"dtype\": \"bf16\", \"offload\": \"$what\""
  name="deepspeed-stage$stage-offload"
  if [ $export_ok = 0 ] || [ -n "$ds_error" ]; then
    echo "{$f, \"skipped\": $(echo "the export failed or deepspeed does not import: $ds_error" | json_str)}" >> "$records"
  elif attempt "$f" "$name" - env ZERO_PEER_DEVICE="$DEVICE" DS_ACCELERATOR="$DEVICE" ZERO_PEER_DS_ADAM=fused \
      "$B/zero-run" -n 1 -- \
      "$PY" "$here/peer_gpt.py" deepspeed "$tmp" "$L" "$D" "$H" "$S" "$STEPS" "$tmp/c.json" "$LOGS/$name.json"; then
    echo "{$f, \"log\": \"$name.log\", \"result\": $(compact "$LOGS/$name.json")}" >> "$records"
  fi
}

# 5. The seeds.
# Seed 003: the stage-3 model built under zero::Init, each unit flattened on
# the device vs in pinned host memory (ZERO_INIT_DEVICE_FLATTEN=off); one
# step each, the setup record's build_ms compared. FLATTEN: device, the
# units' draws deferred into their flat buffers on the GPU (zero::defer_init,
# issue 36 item 4); device-eager, drawn on the host and flattened on the GPU
# (before item 4); host, drawn and flattened on the host.
# device-large: as device, on a larger GPT (ZERO_GPU_BENCH_INIT_LARGE): its
# build time and the host's peak RSS against the model's size, for item 4's
# second goal (a model larger than the host's RAM built in <= 10 s). At one
# rank the model's training state (16 bytes a param) must fit the one lent
# GPU, far less than its host's RAM, so what a lease can show is the host's
# footprint staying flat as the model grows.
seed003() {
  local flatten=$1 f envs=() larger=()
  bench_config 3 bf16 "$MICRO"
  [ $flatten = host ] && envs=(ZERO_INIT_DEVICE_FLATTEN=off ZERO_INIT_DEFER=off)
  [ $flatten = device-eager ] && envs=(ZERO_INIT_DEFER=off)
  [ $flatten = device-large ] && read -r -a larger <<< "${ZERO_GPU_BENCH_INIT_LARGE:---layers 24 --d-model 3072 --heads 24 --seq 1024}"
  f="\"run\": \"zero-cpp seed 003\", \"stage\": 3, \"init_flatten\": \"$flatten\""
  if zero_train "$f" "seed003-$flatten" 1 "${envs[@]}" -- --steps 1 "${larger[@]}"; then
    echo "{$f, \"log\": \"seed003-$flatten.log\", \"setup\": $(record_of "seed003-$flatten" setup)}" >> "$records"
  fi
}
# Seed 001: allgather, reduce-scatter and all-reduce through CUDA IPC and
# NCCL at 2 ranks, against the device-to-device copy rate. NCCL refuses two
# ranks on one GPU: on a one-GPU machine only CUDA IPC is measured.
# CUDA IPC runs three ways: staged through each rank's buffer; direct
# (peers read each other's inputs in place; issue 36 item 2), opening them
# each collective; and direct with the mappings kept -- each against the
# copy rate measured in its own run.
seed001() {  # PATH: staged | direct | direct-cached
  local path=$1 f direct=off cache=off
  f="\"run\": \"zero-cpp seed 001\", \"ranks\": 2, \"ipc_path\": \"$path\""
  [ $path != staged ] && direct=on
  [ $path = direct-cached ] && cache=on
  if [ "$DEVICE" != cuda ]; then
    echo "{$f, \"skipped\": \"CUDA collectives need a GPU (ZERO_GPU_BENCH_DEVICE=$DEVICE)\"}" >> "$records"
  elif [ ! -x "$B/bench/bench_cuda_comm" ]; then
    echo "{$f, \"skipped\": \"$B/bench/bench_cuda_comm was not built (ZERO_CUDA off)\"}" >> "$records"
  elif attempt "$f" "seed001-$path" - env ZERO_CUDA_IPC_DIRECT=$direct ZERO_CUDA_IPC_DIRECT_CACHE=$cache \
      "$B/zero-run" -n 2 -- "$B/bench/bench_cuda_comm" 1024; then
    # Rank 0's JSON object, from its first line on: the engine's own lines
    # (the transport it chose, say) come before it.
    grep '^\[rank 0\]' "$LOGS/seed001-$path.log" | sed 's/^\[rank 0\] //' | sed -n '/^{/,$p' > "$LOGS/seed001-$path.json"
    echo "{$f, \"log\": \"seed001-$path.log\", \"result\": $(compact "$LOGS/seed001-$path.json")}" >> "$records"
  fi
}

# Seed 002: four backward passes per step at stage 2, one reduction each or
# one for all (coalesce_grad_reduction); 2 ranks, as seed 000 (at 1 rank
# there is no reduction to save).
seed002() {  # MODE: separate | coalesce
  local mode=$1 f flag=()
  bench_config 2 bf16 "$MICRO"
  [ $mode = coalesce ] && flag=(--coalesce)
  f="\"run\": \"zero-cpp seed 002\", \"stage\": 2, \"ranks\": 2, \"backward_chunks\": 4, \"reduction\": \"$mode\""
  if zero_train "$f" "seed002-$mode" 2 -- --steps "$STEPS" --backward-chunks 4 "${flag[@]}"; then
    echo "{$f, \"log\": \"seed002-$mode.log\", \"losses\": $(losses_of "seed002-$mode"), \
\"summary\": $(record_of "seed002-$mode" summary)}" >> "$records"
  fi
}
# Seed 000: stage 3 at 2 ranks (on one GPU: they share it through CUDA IPC),
# the fused 16-bit gather against the fp32 master gathered and cast, one run
# of each (bench/gather_fusion.sh).
seed000() {
  local f='"run": "zero-cpp seed 000", "ranks": 2'
  if attempt "$f" seed000 "$LOGS/seed000.json" env ZERO_GATHER_FUSION_MODEL="${MODEL[*]}" \
      ZERO_GATHER_FUSION_MICRO="$MICRO" "$here/gather_fusion.sh" "$B" "$DEVICE" "$STEPS" 1; then
    echo "{$f, \"log\": \"seed000.log\", \"result\": $(compact "$LOGS/seed000.json")}" >> "$records"
  fi
}

# The runs, most wanted first: a budget spent skips the last. First what
# measures each goal of issue 36 -- MFU and the step against FSDP2 and
# DeepSpeed (item 3), ZeRO-Offload against DeepSpeed's (item 5), CUDA IPC
# staged and direct (item 2), the build under zero::Init (item 4) -- then
# the rest of the table and the seeds.
zero_stage 0
zero_stage 3
peer_run ddp 0
peer_run fsdp2 3
peer_run deepspeed 3
offload_pair 2 optimizer
offload_pair 3 param+optimizer
seed001 staged
seed001 direct
seed003 device
seed003 device-eager
seed003 host
seed003 device-large
zero_stage 1
zero_stage 2
peer_run deepspeed 0
peer_run deepspeed 2
peer_run zero_cpp 0
peer_run zero_cpp 3
seed001 direct-cached
seed002 separate
seed002 coalesce
seed000
# One JSON object: the machine, the settings, every run's record in order.
python3 - "$records" <<PY
import json, sys
runs = []
for line in open(sys.argv[1]):  # one record a line
    if line.strip():
        try:
            runs.append(json.loads(line))
        except ValueError as e:  # a run that wrote no summary, say: kept, marked
            runs.append({"run": "?", "error": f"malformed record ({e})", "text": line[:400]})
print(json.dumps({
    "bench": "gpu", "ranks": 1, "device": "$gpu_name", "torch": "$torch_version",
    "deepspeed": "$ds_version" or None, "date": "$(date -u +%F)", "model": "${MODEL[*]}",
    "micro_batch": $MICRO, "steps": $STEPS, "timed_steps": "steps 3-$STEPS (the first two left out)",
    "ds_adam": "$ZERO_PEER_DS_ADAM", "budget_s": $BUDGET, "run_timeout_s": $RUN_TIMEOUT,
    "elapsed_s": $((SECONDS - start)), "logs": "$LOGS", "runs": runs}, indent=1))
PY
