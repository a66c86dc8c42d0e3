#!/usr/bin/env bash
# Issue 34's goals, with every default, in one invocation: zero-cpp at
# stages 0 and 3 and the peers -- PyTorch DDP, FSDP2 and DeepSpeed stage 3
# (fp32, ZERO_BENCH_RANKS ranks of 1 thread (2), Gloo; bench/peer_gpt.py) -- on one GPT, from
# the same exported weights and batches, ZERO_BENCH_ROUNDS rounds (default
# 1), the order turned every round. Prints the runs and each goal as a
# ratio of the runs' median step times (steps 3 and later) and peak RSS
# per rank (rank 0's), the medians over rounds, and each round's own ratio:
#   stage0_vs_ddp      zero-cpp stage 0 / DDP                  goal <= 0.95
#   stage3_vs_ds3      zero-cpp stage 3 / DeepSpeed stage 3    goal <= 0.70
#   stage3_vs_fsdp2    zero-cpp stage 3 / FSDP2                goal <= 0.75
#   stage3_vs_stage0   zero-cpp stage 3 / stage 0              goal <= 1.05
#   rss3_vs_ds3        stage 3's peak RSS / DeepSpeed stage 3's goal <= 0.5
#   saving_vs_ideal    (stage 0 - stage 3 peak RSS) / 16 psi (1 - 1/N)  goal >= 0.9
#   bench/goals.sh BUILD_DIR PYTHON [small|big|large] [STEPS]
set -euo pipefail
B=${1:-build}
PY=${2:?the python of the torch environment}
MODEL=${3:-big}
STEPS=${4:-6}
ROUNDS=${ZERO_BENCH_ROUNDS:-1}
RANKS=${ZERO_BENCH_RANKS:-2}  # micro-batch 4 each: the export holds 4 x RANKS sequences a step
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)

run_gpt_cases "zero 0" "zero 3" "ddp 0" "fsdp2 3" "deepspeed 3"

python3 - "$runs" "$MODEL" "$RANKS" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
ranks = int(sys.argv[3])
rounds = max(r["round"] for r in runs) + 1

# Each goal's ratio from the given runs: the medians over them.
def ratios(of):
    def med(who, stage, key):
        return statistics.median(r["result"][key] for r in of if r["who"] == who and r["stage"] == stage)
    step = lambda who, stage: med(who, stage, "median_step_ms")
    rss = lambda who, stage: med(who, stage, "peak_rss_bytes")
    ideal = statistics.median(r["result"]["model_state_bytes_stage0"] for r in of if r["who"] == "zero") * (1 - 1 / ranks)
    return {
        "stage0_vs_ddp": step("zero", 0) / step("ddp", 0),
        "stage3_vs_ds3": step("zero", 3) / step("deepspeed", 3),
        "stage3_vs_fsdp2": step("zero", 3) / step("fsdp2", 3),
        "stage3_vs_stage0": step("zero", 3) / step("zero", 0),
        "rss3_vs_ds3": rss("zero", 3) / rss("deepspeed", 3),
        "saving_vs_ideal": (rss("zero", 0) - rss("zero", 3)) / ideal,
    }
goals = {"stage0_vs_ddp": ("<=", 0.95), "stage3_vs_ds3": ("<=", 0.70), "stage3_vs_fsdp2": ("<=", 0.75),
         "stage3_vs_stage0": ("<=", 1.05), "rss3_vs_ds3": ("<=", 0.5), "saving_vs_ideal": (">=", 0.9)}
overall = ratios(runs)
# Each round's own ratio beside the verdict: on a shared machine the spread
# between rounds is the measurement's error bar.
per_round = [ratios([r for r in runs if r["round"] == i]) for i in range(rounds)]
out = {"bench": "goals", "model": sys.argv[2], "ranks": ranks, "dtype": "fp32", "rounds": rounds,
       "goals": {k: {"ratio": round(overall[k], 3), "goal": f"{op} {g}",
                     "met": overall[k] <= g if op == "<=" else overall[k] >= g,
                     "rounds": [round(r[k], 3) for r in per_round]}
                 for k, (op, g) in goals.items()},
       "runs": runs}
print(json.dumps(out, indent=1))
PY
