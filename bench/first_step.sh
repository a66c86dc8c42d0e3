#!/usr/bin/env bash
# Time to the first step (issue 34): zero-cpp at stages 0 and 3 against
# PyTorch DDP, FSDP2 and DeepSpeed stage 3 (fp32, 2 ranks of 1 thread, Gloo;
# bench/peer_gpt.py), each starting from the same exported weights (zero-train
# --init-from, the peers load_state_dict) and training one step. Each rank
# reports its process's age (/proc/self/stat's start to now, so the loader,
# the interpreter and the imports count) at three points: the rendezvous
# done, ready to step (model built, weights in, engine or wrapper set up:
# flattening, broadcast, the compute-dtype probe), the first step done.
# Rank 0's figures; the median over ZERO_BENCH_ROUNDS rounds (default 3), the
# order turned every round, after one round left out: a first run pays
# once for what later runs find cached (DeepSpeed's first took 53 s to its
# rendezvous here, its next ones 4 s), which is not what a user sees twice. Prints one JSON object: the runs, each case's
# medians, and zero-cpp's ratios to DDP's and DeepSpeed's.
#   bench/first_step.sh BUILD_DIR PYTHON [small|big|large]
set -euo pipefail
B=${1:-build}
PY=${2:?the python of the torch environment}
MODEL=${3:-big}
ROUNDS=${ZERO_BENCH_ROUNDS:-3}
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)

bench_model "$MODEL"
L=${model_args[1]} D=${model_args[3]} H=${model_args[5]} S=${model_args[7]}
"$B/bench/bench_export_gpt" "$tmp" "$L" "$D" "$H" "$S" 8 1

cases=("zero 0" "zero 3" "ddp 0" "fsdp2 3" "deepspeed 3")
runs=$tmp/runs.jsonl
for ((round = -1; round < ROUNDS; round++)); do  # round -1: the warm-up, not recorded
  turned_order "$round" "${cases[@]}"
  for c in "${order[@]}"; do
    read -r who stage <<< "$c"
    result=$(gpt_case_result "$who" "$stage" 1 --init-from "$tmp/init.safetensors")
    ((round < 0)) && continue
    printf '{"round": %d, "who": "%s", "stage": %s, "ages_ms": %s}\n' "$round" "$who" "$stage" \
      "$(echo "$result" | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["process_age_ms"]))')" \
      >> "$runs"
  done
done

python3 - "$runs" "$MODEL" "$ROUNDS" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
points = ("rendezvous", "ready", "first_step")
def med(who, stage, point):
    return statistics.median(r["ages_ms"][point] for r in runs if r["who"] == who and r["stage"] == stage)
cases = [("zero", 0), ("zero", 3), ("ddp", 0), ("fsdp2", 3), ("deepspeed", 3)]
medians = {f"{w} stage {s}": {p: round(med(w, s, p)) for p in points} for w, s in cases}
ratios = {
    "zero0_vs_ddp_first_step": med("zero", 0, "first_step") / med("ddp", 0, "first_step"),
    "zero3_vs_ds3_first_step": med("zero", 3, "first_step") / med("deepspeed", 3, "first_step"),
    "zero3_vs_fsdp2_first_step": med("zero", 3, "first_step") / med("fsdp2", 3, "first_step"),
    "zero0_vs_ddp_ready": med("zero", 0, "ready") / med("ddp", 0, "ready"),
    "zero3_vs_ds3_ready": med("zero", 3, "ready") / med("deepspeed", 3, "ready"),
}
print(json.dumps({"bench": "first_step", "model": sys.argv[2], "rounds": int(sys.argv[3]), "ranks": 2,
                  "what": "rank 0's process age (ms) at the rendezvous's end, ready to step, first step done; "
                          "medians over rounds",
                  "medians_ms": medians, "ratios": {k: round(v, 3) for k, v in ratios.items()}, "runs": runs},
                 indent=1))
PY
