#!/usr/bin/env bash
# Issue 35's speed goals, in one invocation: the Python front end (zero_cpp,
# bench/peer_gpt.py's GPT -- nanoGPT-style, the bundled GPT's twin -- under
# a DeepSpeed script with the one changed import) at stages 0 and 3 against
# DeepSpeed stage 3, FSDP2 and DDP on the same model, weights and batches,
# and against the C++ API (zero-train) on the same model. fp32, 2 ranks of
# one thread, Gloo; ZERO_BENCH_ROUNDS rounds (1), the order turned every
# round. Prints the runs and each goal as a ratio of median step times
# (steps 3 and later) or peak RSS per rank (rank 0's), the medians over
# rounds and each round's own ratio:
#   py3_vs_ds3       zero_cpp stage 3 / DeepSpeed stage 3     goal <= 0.75
#   py3_vs_fsdp2     zero_cpp stage 3 / FSDP2                 goal <= 1.0
#   py0_vs_ddp       zero_cpp stage 0 / DDP                   goal <= 1.0
#   rss_py0_vs_cpp0  zero_cpp stage 0's peak RSS / the C++ API's   goal <= 1.1
#   rss_py3_vs_cpp3  zero_cpp stage 3's peak RSS / the C++ API's   goal <= 1.1
# and, as figures: each stage's step against the C++ API's, and where the
# front end's time goes at stage 3 (the module hooks per step, the part of
# them inside the C++ engine, the rest Python's; ZERO_CPP_HOOK_TIMES=1).
#   bench/python_frontend.sh BUILD_DIR PYTHON [small|big|large] [STEPS]
set -euo pipefail
B=${1:-build}
PY=${2:?the python of the torch environment}
MODEL=${3:-big}
STEPS=${4:-6}
ROUNDS=${ZERO_BENCH_ROUNDS:-1}
RANKS=${ZERO_BENCH_RANKS:-2}
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH=$(cd "$B/python" && pwd)${PYTHONPATH:+:$PYTHONPATH} ZERO_CPP_HOOK_TIMES=1

run_gpt_cases "zero_cpp 0" "zero_cpp 3" "zero 0" "zero 3" "ddp 0" "fsdp2 3" "deepspeed 3"

python3 - "$runs" "$MODEL" "$RANKS" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
rounds = max(r["round"] for r in runs) + 1

def ratios(of):
    def med(who, stage, key):
        return statistics.median(r["result"][key] for r in of if r["who"] == who and r["stage"] == stage)
    step = lambda who, stage: med(who, stage, "median_step_ms")
    rss = lambda who, stage: med(who, stage, "peak_rss_bytes")
    return {
        "py3_vs_ds3": step("zero_cpp", 3) / step("deepspeed", 3),
        "py3_vs_fsdp2": step("zero_cpp", 3) / step("fsdp2", 3),
        "py0_vs_ddp": step("zero_cpp", 0) / step("ddp", 0),
        "rss_py0_vs_cpp0": rss("zero_cpp", 0) / rss("zero", 0),
        "rss_py3_vs_cpp3": rss("zero_cpp", 3) / rss("zero", 3),
        "py0_vs_cpp0": step("zero_cpp", 0) / step("zero", 0),
        "py3_vs_cpp3": step("zero_cpp", 3) / step("zero", 3),
    }
goals = {"py3_vs_ds3": ("<=", 0.75), "py3_vs_fsdp2": ("<=", 1.0), "py0_vs_ddp": ("<=", 1.0),
         "rss_py0_vs_cpp0": ("<=", 1.1), "rss_py3_vs_cpp3": ("<=", 1.1)}
overall = ratios(runs)
per_round = [ratios([r for r in runs if r["round"] == i]) for i in range(rounds)]
hooks = [h for r in runs if r["who"] == "zero_cpp" and r["stage"] == 3
         for h in r["result"].get("hook_times_per_step", [])[2:]]
step3 = statistics.median(r["result"]["median_step_ms"] for r in runs if r["who"] == "zero_cpp" and r["stage"] == 3)
hook_summary = None
if hooks:
    total = statistics.median(h["total_s"] for h in hooks) * 1000
    engine = statistics.median(h["engine_s"] for h in hooks) * 1000
    hook_summary = {"calls_per_step": statistics.median(h["calls"] for h in hooks), "hooks_ms_per_step": round(total, 2),
                    "in_cpp_engine_ms": round(engine, 2), "python_ms": round(total - engine, 2),
                    "python_share_of_step": round((total - engine) / step3, 4)}
out = {"bench": "python_frontend", "model": sys.argv[2], "ranks": int(sys.argv[3]), "dtype": "fp32",
       "rounds": rounds,
       "goals": {k: {"ratio": round(overall[k], 3), "goal": f"{op} {g}",
                     "met": overall[k] <= g if op == "<=" else overall[k] >= g,
                     "rounds": [round(r[k], 3) for r in per_round]} for k, (op, g) in goals.items()},
       "figures": {k: {"ratio": round(overall[k], 3), "rounds": [round(r[k], 3) for r in per_round]}
                   for k in ("py0_vs_cpp0", "py3_vs_cpp3")},
       "stage3_hooks": hook_summary, "runs": runs}
print(json.dumps(out, indent=1))
PY
