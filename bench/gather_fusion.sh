#!/usr/bin/env bash
# Seed 000's ratio: stage 3 on 2 local ranks, bf16 params and bf16 compute,
# the fused path (16-bit shards gathered straight into each unit's buffer,
# the downcast done in the optimizer's pass) against the unfused one the
# seed replaced (zero_cpp.stage3_gather_fp32_master: the fp32 master is
# gathered, then cast). Runs alternate, REPS of each; prints one JSON object
# with every run's summary and losses, and the ratio of the median steps.
#   bench/gather_fusion.sh BUILD_DIR [DEVICE cpu|cuda] [STEPS] [REPS]
# ZERO_GATHER_FUSION_MODEL (zero-train model args) defaults to the ~101M GPT;
# ZERO_GATHER_FUSION_MICRO to 4.
set -euo pipefail
B=${1:-build}
DEVICE=${2:-cpu}
STEPS=${3:-6}
REPS=${4:-2}
. "$(dirname "$0")/lib.sh"
bench_model big
[ -n "${ZERO_GATHER_FUSION_MODEL:-}" ] && read -r -a model_args <<< "$ZERO_GATHER_FUSION_MODEL"

for ((rep = 0; rep < REPS; ++rep)); do
  for fp32_master in false true; do
    bench_config 3 bf16 "${ZERO_GATHER_FUSION_MICRO:-4}"
    sed -i '1s/^{ /{ "zero_cpp": {"compute_dtype": "bf16", "stage3_gather_fp32_master": '"$fp32_master"'}, /' "$tmp/c.json"
    summary=$(zero_train_summary --device "$DEVICE" --steps "$STEPS" "${model_args[@]}")
    printf '{"fp32_master_gather": %s, "summary": %s, "losses": %s}\n' "$fp32_master" "$summary" "$(last_losses)" \
      >> "$tmp/runs.jsonl"
  done
done
python3 - "$tmp/runs.jsonl" "$DEVICE" "${model_args[*]}" <<'PY'
import json, statistics, sys, datetime
runs = [json.loads(line) for line in open(sys.argv[1])]
def median(unfused):
    return statistics.median(r["summary"]["median_step_ms"] for r in runs if r["fp32_master_gather"] == unfused)
print(json.dumps({"bench": "gather_fusion", "seed": "000", "ranks": 2, "device": sys.argv[2],
                  "date": datetime.date.today().isoformat(), "model": sys.argv[3],
                  "fused_step_ms": median(False), "unfused_step_ms": median(True),
                  "unfused_over_fused": median(True) / median(False), "runs": runs}, indent=1))
PY
