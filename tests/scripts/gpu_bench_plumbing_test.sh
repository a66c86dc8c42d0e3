#!/usr/bin/env bash
# The GPU bench's plumbing on the CPU (issue 36 item 7: what a lease runs is
# checked before a lease): bench/gpu.sh with ZERO_GPU_BENCH_DEVICE=cpu on a
# tiny GPT -- zero-cpp's stages, every peer, the Python front end,
# ZeRO-Offload against DeepSpeed's (DeepSpeedCPUAdam, JIT-built), the seeds
# -- then bench/gpu_report.py over its JSON. Every run must end ok (seed
# 001, CUDA collectives, is skipped on the CPU by design) and every row
# must reach the table. Times mean nothing here.
# Usage: gpu_bench_plumbing_test.sh SOURCE_DIR BUILD_DIR PYTHON
set -u
. "$(dirname "$0")/lib.sh"
SRC=$1 B=$2 PY=$3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
if ! "$PY" -c "import deepspeed" 2>/dev/null; then
  echo "FAIL DeepSpeed is not importable by $PY (./run test installs deepspeed==0.19.8 into the torch environment)"
  exit 1
fi
ZERO_GPU_BENCH_DEVICE=cpu ZERO_GPU_BENCH_MODEL="--layers 2 --d-model 64 --heads 4 --seq 32" ZERO_GPU_BENCH_MICRO=4 \
  ZERO_GPU_BENCH_INIT_LARGE="--layers 3 --d-model 128 --heads 4" \
  ZERO_GPU_BENCH_BUDGET=1200 ZERO_GPU_BENCH_RUN_TIMEOUT=600 ZERO_GPU_BENCH_LOGS="$T/logs" \
  ZERO_GPU_BENCH_PYTHONPATH="$B/python" OMP_NUM_THREADS=1 \
  "$SRC/bench/gpu.sh" "$B" "$PY" 4 > "$T/gpu.json" 2> "$T/bench.log"
check "gpu.sh exits 0 (its log: $(tail -n 3 "$T/bench.log" | tr '\n' ' '))" [ $? -eq 0 ]
failed=$(grep 'FAILED\|skipped (budget' "$T/bench.log")
check "every run ends ok ($failed)" [ -z "$failed" ]
summary=$(python3 - "$T/gpu.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["runs"]:
    state = "error" if "error" in r else "skipped" if "skipped" in r else "ok"
    print(r["run"], r.get("stage", ""), r.get("offload", ""), state, r.get("result", {}).get("optimizer", ""))
PY
)
check "the JSON parses and lists the runs" [ -n "$summary" ]
for want in "zero-cpp 0  ok" "zero-cpp 3  ok" "ddp 0  ok" "fsdp2 3  ok" "deepspeed 3  ok" "zero_cpp 3  ok" \
    "zero-cpp 2 optimizer ok" "zero-cpp 3 param+optimizer ok" "zero-cpp seed 003 3  ok" "zero-cpp seed 002 2  ok" \
    "zero-cpp seed 001   skipped"; do
  check "run recorded: $want" contains "$summary" "$want"
done
# The runs each goal of issue 36 needs come before the rest of the table,
# so that a lease whose budget runs out skips only the rest.
order=$(python3 - "$T/gpu.json" <<'PY' 2>&1
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
def first(pred):
    return next(i for i, r in enumerate(runs) if pred(r))
rest = first(lambda r: r["run"] == "zero-cpp" and r.get("stage") == 1 and not r.get("offload"))
goals = [first(lambda r: r["run"] == "deepspeed" and r.get("stage") == 3 and not r.get("offload")),
         first(lambda r: r.get("offload") == "param+optimizer" and r["run"] == "deepspeed"),
         first(lambda r: r.get("ipc_path") == "direct"), first(lambda r: r.get("init_flatten") == "host")]
print(all(g < rest for g in goals))
PY
)
check "the runs each goal needs come first ($order)" [ "$order" = True ]
large=$(python3 -c 'import json, sys
runs = [r for r in json.load(open(sys.argv[1]))["runs"] if r.get("init_flatten") in ("device", "device-large")]
s = {r["init_flatten"]: r.get("setup", {}) for r in runs}
print(s["device-large"]["n_params"] > s["device"]["n_params"], s["device-large"]["peak_rss_bytes"] > 0)' \
  "$T/gpu.json" 2>&1)
check "seed 003's larger build records its size and the host's peak RSS ($large)" [ "$large" = "True True" ]
breakdown=$(python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
for r in d["runs"]:
    if r.get("offload") and r["run"] == "zero-cpp":
        print(sorted(r.get("times_ms", {})))' "$T/gpu.json")
check "zero-cpp's offload runs say where the step's time goes ($breakdown)" \
  [ "$(grep -c "'backward', 'backward_allreduce', 'forward', 'step', 'step_allgather'" <<<"$breakdown")" -eq 2 ]
check "DeepSpeed's offload runs use its DeepSpeedCPUAdam" \
  [ "$(grep -cE '^deepspeed [23] (optimizer|param\+optimizer) ok deepspeed\.ops\.adam\.cpu_adam\.DeepSpeedCPUAdam$' <<<"$summary")" -eq 2 ]
python3 "$SRC/bench/gpu_report.py" "$T/gpu.json" "$T/gpu.md" > /dev/null 2> "$T/report.err"
check "gpu_report.py runs ($(tail -n 1 "$T/report.err"))" [ $? -eq 0 ]
report=$(cat "$T/gpu.md" 2>/dev/null)
for row in "| zero-cpp stage 0 |" "| zero-cpp stage 3 |" "| FSDP2 |" "| DeepSpeed stage 3 |" \
    "| zero_cpp (Python front end) stage 3 |" "| zero-cpp stage 2, optimizer offloaded |" \
    "| DeepSpeed stage 2, optimizer offloaded |" "| zero-cpp stage 3, param+optimizer offloaded |" \
    "| DeepSpeed stage 3, param+optimizer offloaded |" "| 000 |" "| 002 |" "| 003 |" "GPT drawn on the GPU in"; do
  check "gpu.md has the row $row" contains "$report" "$row"
done
# bench/largest.sh (issue 36 item 6) at a size this machine trains in seconds.
ZERO_LARGEST_DEVICE=cpu ZERO_LARGEST_RAM_GIB=0.05 ZERO_LARGEST_WIDTHS="64 128" ZERO_LARGEST_SEQ=32 \
  ZERO_LARGEST_MICRO=2 ZERO_LARGEST_STEPS=3 OMP_NUM_THREADS=1 "$SRC/bench/largest.sh" "$B" 300 \
  > "$T/largest.json" 2> "$T/largest.log"
check "largest.sh exits 0 ($(tail -n 2 "$T/largest.log" | tr '\n' ' '))" [ $? -eq 0 ]
largest=$(python3 -c 'import json, sys
l = json.load(open(sys.argv[1]))["largest"] or {}
print(l.get("tokens_per_s", 0) > 0, l.get("params", 0) <= 0.75 * 0.05 * 2**30 / 16, sorted(l.get("times_ms") or {}))' \
  "$T/largest.json" 2>&1)
check "largest.sh trains the largest shape within the host's bound, timed by phase ($largest)" \
  [ "$largest" = "True True ['backward', 'backward_allreduce', 'forward', 'step', 'step_allgather']" ]
finish
