#!/usr/bin/env bash
# bench/report.py as `./run bench` runs it: from the benchmarks' JSON (here
# a small made-up set in their format: the 3.3M GPT at stages 0 and 3, DDP,
# DeepSpeed stage 3, a coalesce pair) to report.md, its ratio tables, and
# PNG charts drawn by gnuplot (skipped, exit 77, where gnuplot is missing).
# Usage: report_test.sh SOURCE_DIR
set -u
. "$(dirname "$0")/lib.sh"
SRC=$1
command -v gnuplot >/dev/null || { echo "gnuplot is not installed (./run demo installs gnuplot-nox)"; exit 77; }
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
python3 - "$R" <<'PY'
import json, sys
R = sys.argv[1]
def summary(ms, rss, state):
    return {"median_step_ms": ms, "peak_rss_bytes": rss, "model_state_bytes": state,
            "last_step_comm": {"reduce_scatter": {"calls": 4}}}
losses = [5.5, 4.0, 3.2, 2.9]
stages = {"ranks": 2, "runs": [
    {"run": "gpt_small", "stage": 0, "dtype": "fp32", "summary": summary(400.0, 500e6, 52e6), "losses": losses},
    {"run": "gpt_small", "stage": 3, "dtype": "fp32", "summary": summary(420.0, 480e6, 26e6), "losses": losses}]}
peers = {"runs": [
    {"run": "gpt_small", "peer": "ddp", "stage": 0, "dtype": "fp32",
     "result": {"median_step_ms": 500.0, "peak_rss_bytes": 800e6, "model_state_bytes": 52e6, "losses": losses}},
    {"run": "gpt_small", "peer": "deepspeed", "stage": 3, "dtype": "fp32",
     "result": {"median_step_ms": 700.0, "peak_rss_bytes": 960e6, "losses": losses}}]}
coalesce = {"runs": [{"stage": 2, "summary": summary(650.0, 480e6, 33e6)},
                     {"stage": 2, "summary": dict(summary(550.0, 470e6, 33e6),
                                                  last_step_comm={"reduce_scatter": {"calls": 1}})}]}
for name, data in (("stages", stages), ("peers", peers), ("coalesce", coalesce)):
    json.dump(data, open(f"{R}/{name}.json", "w"))
PY
out=$(python3 "$SRC/bench/report.py" "$R" 2>&1)
check "report.py runs ($out)" [ $? -eq 0 ]
report=$(cat "$R/report.md" 2>/dev/null)
check "report.md: the table against DDP" contains "$report" "| zero-cpp stage 3 fp32 | 420 | 0.84× |"
check "report.md: the goals as ratios" contains "$report" "| stage 3 ÷ DeepSpeed stage 3, step time, fp32 | 0.60 | ≤ 0.7 |"
check "report.md: issue 34's goal for stage 0" contains "$report" "| stage 0 ÷ DDP, step time, fp32 | 0.80 | ≤ 0.95 |"
check "report.md: coalesce" contains "$report" "| 2 | 650 | 550 | 1.18× | 4 → 1 |"
png() { [ "$(head -c 8 "$1" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ]; }
for chart in time_gpt_small loss_gpt_small; do
  check "$chart.png is a PNG" png "$R/$chart.png"
  check "$chart.png linked from report.md" contains "$report" "($chart.png)"
done
finish
