#!/usr/bin/env bash
# ZeRO-Offload's host update (issue 36 item 5, the part of an offloaded step
# the CPU does): zero-cpp's fused AdamW over a flat fp32 shard against
# DeepSpeed's own DeepSpeedCPUAdam -- the kernel DeepSpeed's ZeRO-Offload
# steps with -- at the same size and thread count, alternated A B A B (the
# order turned every round) in one run. Params updated per second, and
# zero-cpp's time over DeepSpeed's per round. One JSON object on stdout.
#
#   bench/host_adam.sh [build] [python] [rounds] > bench/results/host_adam.json
#
# PYTHON must import torch and deepspeed (its CPUAdam op is JIT-built on
# first use; ninja and a compiler needed). Threads: OMP_NUM_THREADS, else
# all CPUs, for both.
set -euo pipefail
B=${1:-build}
PY=${2:-python3}
ROUNDS=${3:-3}
N=100000000  # bench_adam's large size: 1.6 GB of fp32 state, far past every cache
THREADS=${OMP_NUM_THREADS:-$(nproc)}
export OMP_NUM_THREADS=$THREADS

. "$(dirname "$0")/lib.sh"

ours() {  # seconds per step of zero-cpp's kernel
  "$B/bench/bench_adam" --benchmark_filter="^BM_ZeroAdamW/$N/" --benchmark_format=json > "$tmp/ours.json"
  "$PY" -c 'import json, sys; b = json.load(open(sys.argv[1]))["benchmarks"][0]; print(b["real_time"] / 1000)' \
    "$tmp/ours.json"
}

theirs() {  # seconds per step of DeepSpeedCPUAdam, the median of 5 after 2
  # (DeepSpeed prints to stdout too: the figure is the line it is named on)
  "$PY" - "$N" <<'PY' 2> "$tmp/ds.log" | sed -n 's/^seconds //p' 
import statistics, sys, time
import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam
n = int(sys.argv[1])
torch.manual_seed(0)
p = torch.nn.Parameter(torch.randn(n))
p.grad = torch.randn(n)
opt = DeepSpeedCPUAdam([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, adamw_mode=True)
times = []
for i in range(7):
    t0 = time.perf_counter()
    opt.step()
    if i >= 2:
        times.append(time.perf_counter() - t0)
print("seconds", statistics.median(times))
PY
}

rounds=()
for ((r = 0; r < ROUNDS; r++)); do
  turned_order "$r" ours theirs
  declare -A s=()
  for who in "${order[@]}"; do s[$who]=$($who) || { cat "$tmp/ds.log" >&2; exit 1; }; done
  rounds+=("{\"zero_cpp_s\": ${s[ours]}, \"deepspeed_s\": ${s[theirs]}}")
  unset s
done
"$PY" - "$N" "$THREADS" "${rounds[@]}" <<'PY'
import json, statistics, sys, datetime
n, threads = int(sys.argv[1]), int(sys.argv[2])
rounds = [json.loads(r) for r in sys.argv[3:]]
for r in rounds:
    r["ratio"] = r["zero_cpp_s"] / r["deepspeed_s"]
print(json.dumps({
    "bench": "host_adam", "date": datetime.date.today().isoformat(), "params": n, "threads": threads,
    "zero_cpp_params_per_s": n / statistics.median(r["zero_cpp_s"] for r in rounds),
    "deepspeed_params_per_s": n / statistics.median(r["deepspeed_s"] for r in rounds),
    "ratio_median": statistics.median(r["ratio"] for r in rounds),
    "rounds": rounds}, indent=1))
PY
