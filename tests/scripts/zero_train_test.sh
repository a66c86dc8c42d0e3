#!/usr/bin/env bash
# zero-train end to end on 2 ranks: DeepSpeed's own stage-1/2/3 doc configs run
# unchanged, the JSON log has its stable fields, and bad input is a clear
# error. Usage: zero_train_test.sh ZERO_RUN ZERO_TRAIN DATA_DIR
set -u
. "$(dirname "$0")/lib.sh"
ZR=$1
ZT=$2
DATA=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tiny=(--layers 1 --d-model 32 --heads 2 --seq 16 --steps 3)

for cfg in zero_tutorial_stage1.json zero_tutorial_stage2.json moe_deprecated_cpu_offload.json \
           zero_tutorial_infinity_cpu.json zero3_fp16_adamw.json zero3_offload_optimizer.json cifar10_stage0.json; do
  out=$("$ZR" -n 2 --timeout 120 -- "$ZT" --config "$DATA/ds_configs/ok/$cfg" "${tiny[@]}" --log-json "$tmp/log.jsonl" 2>&1)
  rc=$?
  check "DeepSpeed doc config $cfg trains" [ $rc -eq 0 ]
  [ $rc -eq 0 ] || echo "$out" | tail -5
done

# The log: a setup record, then one step record per optimizer step, with the stable field names.
log=$(cat "$tmp/log.jsonl")
check "log has one setup record" [ "$(grep -c '"event":"setup"' <<<"$log")" -eq 1 ]
check "log has 3 step records" [ "$(grep -c '"event":"step"' <<<"$log")" -eq 3 ]
for field in '"n_params"' '"world_size":2' '"dp_size":2' '"stage":0' '"dtype":"fp32"' '"config":{'; do
  check "setup has $field" contains "$(grep '"event":"setup"' <<<"$log")" "$field"
done
step=$(grep '"event":"step"' <<<"$log" | tail -1)
for field in '"step":3' '"loss":' '"lr":' '"loss_scale":' '"step_ms":' '"tokens_per_s":' '"peak_rss_bytes":' \
             '"model_state_bytes":' '"comm":{"all_reduce":{"bytes":' '"minor_faults":' '"cpu_ms":'; do
  check "step has $field" contains "$step" "$field"
done
# cpu_ms is the rank's so far: it grows from step to step.
cpu_grows() {
  python3 -c 'import json, sys
v = [json.loads(l)["cpu_ms"] for l in sys.stdin if "\"event\":\"step\"" in l]
sys.exit(0 if v[0] > 0 and all(b > a for a, b in zip(v, v[1:])) else 1)' <<<"$log"
}
check "step records' cpu_ms grows" cpu_grows

# --log-json-all writes one file per rank.
"$ZR" -n 2 --timeout 120 -- "$ZT" --config "$DATA/ds_configs/ok/zero_tutorial_stage2.json" "${tiny[@]}" \
  --log-json-all "$tmp/all" >/dev/null 2>&1
check "--log-json-all: rank 0 file" [ -s "$tmp/all.rank0" ]
check "--log-json-all: rank 1 file" [ -s "$tmp/all.rank1" ]

# --backward-chunks 4: four backward passes per micro-batch; --coalesce makes
# them one reduce-scatter per group instead of four, with the same losses.
cat > "$tmp/s2.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2, "reduce_bucket_size": 20000}}
JSON
rs_calls() { grep '"event":"summary"' "$1" | grep -o '"reduce_scatter":{"bytes":[0-9]*,"calls":[0-9]*' | sed 's/.*://'; }
final_loss() { grep '"event":"summary"' "$1" | grep -o '"final_loss":[-0-9.e]*' | sed 's/.*://'; }
for mode in separate coalesce; do
  flag=(); [ $mode = coalesce ] && flag=(--coalesce)
  "$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/s2.json" "${tiny[@]}" --backward-chunks 4 "${flag[@]}" \
    --log-json "$tmp/$mode.jsonl" >/dev/null 2>&1
  check "--backward-chunks 4 ($mode) trains" [ -s "$tmp/$mode.jsonl" ]
done
sep=$(rs_calls "$tmp/separate.jsonl"); coal=$(rs_calls "$tmp/coalesce.jsonl")
check "--coalesce: one reduce-scatter per group, not four ($coal vs $sep)" [ "${coal:-0}" -gt 0 -a "$((${coal:-0} * 4))" -eq "${sep:-0}" ]
check "--coalesce: same loss to round-off" awk -v a="$(final_loss "$tmp/separate.jsonl")" \
  -v b="$(final_loss "$tmp/coalesce.jsonl")" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d < 1e-4 * a) }'
out=$("$ZR" -n 2 --timeout 60 -- "$ZT" --config "$tmp/s2.json" "${tiny[@]}" --backward-chunks 3 2>&1)
check "chunks that do not divide the micro-batch: named" contains "$out" "the micro-batch (4) must divide into 3 equal chunks"

# steps_per_print is honoured as DeepSpeed honours it (it was capped at 10):
# progress at its multiples, plus zero-train's first and last step. One line
# per report: the engine's own line (a mean over the steps since the last
# one) was printed beside zero-train's (that step's loss), two lines with two
# losses for one step; zero-train now prints the engine's report as its line.
echo '{"train_micro_batch_size_per_gpu": 2, "steps_per_print": 12}' > "$tmp/print.json"
out=$("$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/print.json" --layers 1 --d-model 32 --heads 2 --seq 16 \
  --steps 25 --log-json "$tmp/print.jsonl" 2>&1)
printed=$(echo "$out" | grep -o 'step *[0-9]*/25' | sed 's/step *//; s|/25||' | tr '\n' ' ')
check "steps_per_print 12: progress at steps 1 12 24 25 (got: $printed)" [ "$printed" = "1 12 24 25 " ]
for s in 12 24; do
  lines=$(echo "$out" | grep -c "step[= ] *$s\b" || true)
  check "one progress line for step $s (got $lines)" [ "$lines" = 1 ]
done
# The line's loss is the global mean over the 12 steps since the last one:
# the mean of the JSON log's per-step losses (each the global batch mean).
check "step 24's loss is the mean of steps 13-24" awk -v line="$(echo "$out" | grep 'step *24/25')" '
  /"event": *"step"/ { match($0, /"step": *[0-9]+/); s = substr($0, RSTART, RLENGTH); sub(/.*: */, "", s)
    if (s + 0 >= 13 && s + 0 <= 24) { match($0, /"loss": *[-0-9.e+]+/); l = substr($0, RSTART, RLENGTH)
      sub(/.*: */, "", l); sum += l; n++ } }
  END { match(line, /loss [0-9.]+/); shown = substr(line, RSTART + 5, RLENGTH - 5)
    d = shown - sum / n; if (d < 0) d = -d; exit !(n == 12 && line ~ /mean of 12 steps/ && d < 1e-3) }' "$tmp/print.jsonl"
check "tokens/s in the line" grep -q 'step *24/25 .* [1-9][0-9]* tok/s' <<<"$out"
# The closing summary: wall time, tokens/s, final loss, peak RSS, and the
# model state per rank against stage 0's (stage 0 itself: the same).
check "summary line" grep -q 'summary: 25 steps in [0-9.]* s, [0-9]* tokens/s (all ranks), final loss [0-9.]*$' <<<"$out"
check "summary: peak RSS and model state against stage 0" \
  grep -q 'peak RSS [0-9]* MB (rank 0); model state per rank [0-9.]* MB at stage 0, [0-9.]* MB at stage 0 (1.0x)' <<<"$out"
# Without steps_per_print (DeepSpeed's default prints nothing): the first
# and the last step only, and no line of the engine's.
echo '{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}' > "$tmp/quiet.json"
out=$("$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/quiet.json" --layers 1 --d-model 32 --heads 2 --seq 16 \
  --steps 12 2>&1)
printed=$(echo "$out" | grep -o 'step *[0-9]*/12' | sed 's/step *//; s|/12||' | tr '\n' ' ')
check "no steps_per_print: progress at steps 1 and 12 only (got: $printed)" [ "$printed" = "1 12 " ]
check "no steps_per_print: no engine progress line" lacks "$out" "[zero-cpp] step="
# The last line's time per step is the wall time since the first line over
# the 11 steps since it: the arithmetic is checked on given times
# (unit ProgressTimer.*), here only that the line says it.
check "no steps_per_print: the last line gives a time per step" grep -qE 'step +12/12 .* [0-9]+ ms/step' <<<"$out"
check "stage 3 summary: state per rank below stage 0's" awk -v line="$(echo "$out" | grep 'model state per rank')" 'BEGIN {
  match(line, /[0-9.]+ MB at stage 3/); a = substr(line, RSTART, RLENGTH) + 0
  match(line, /[0-9.]+ MB at stage 0/); b = substr(line, RSTART, RLENGTH) + 0; exit !(a > 0 && b > 1.5 * a) }'
# The loss curve the demo draws (bench/loss_chart.py; gnuplot): a PNG, or
# where gnuplot is missing, a message saying how to get it (status 3).
python3 "$(dirname "$0")/../../bench/loss_chart.py" "$tmp/print.jsonl" "$tmp/loss.png" > "$tmp/chart.txt" 2>&1
rc=$?
if command -v gnuplot >/dev/null; then
  check "loss chart: a PNG" [ $rc -eq 0 -a "$(head -c 4 "$tmp/loss.png" 2>/dev/null | tail -c 3)" = PNG ]
else
  check "loss chart without gnuplot: says how to get it" [ $rc -eq 3 ] && grep -q "apt-get install gnuplot-nox" "$tmp/chart.txt"
fi

# Bad input names what is wrong, and no rank is left behind.
out=$("$ZR" -n 2 --timeout 60 -- "$ZT" --config "$tmp/s2.json" "${tiny[@]}" --device tpu 2>&1)
check "--device other than cpu or cuda: named" contains "$out" "--device must be cpu or cuda, not 'tpu'"
if ! nvidia-smi -L >/dev/null 2>&1; then
  out=$("$ZR" -n 2 --timeout 60 -- "$ZT" --config "$tmp/s2.json" "${tiny[@]}" --device cuda 2>&1)
  check "--device cuda without a GPU: named" contains "$out" "--device cuda: no CUDA device is visible"
fi
echo '{"train_batch_size": 8, "zero_optimization": {"stage": 2, "overlap_com": true}}' > "$tmp/bad.json"
out=$("$ZR" -n 2 --timeout 60 -- "$ZT" --config "$tmp/bad.json" "${tiny[@]}" 2>&1)
check "misspelled key: fails" [ $? -ne 0 ]
check "misspelled key: named with a suggestion" contains "$out" "zero_optimization.overlap_com is not a key zero-cpp knows (did you mean zero_optimization.overlap_comm?)"
echo '{"train_batch_size": 3}' > "$tmp/odd.json"
out=$("$ZR" -n 2 --timeout 60 -- "$ZT" --config "$tmp/odd.json" "${tiny[@]}" 2>&1)
check "batch that does not split over 2 ranks: named" contains "$out" "train_batch_size 3 is not divisible by the data-parallel size 2"
out=$("$ZT" --config "$tmp/odd.json" --heads 3 2>&1)
check "bad model shape: named" contains "$out" "--d-model must be divisible by --heads"
finish
