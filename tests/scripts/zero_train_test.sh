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
             '"model_state_bytes":' '"comm":{"all_reduce":{"bytes":'; do
  check "step has $field" contains "$step" "$field"
done

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
# progress at its multiples, plus zero-train's first and last step.
echo '{"train_micro_batch_size_per_gpu": 2, "steps_per_print": 12}' > "$tmp/print.json"
out=$("$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/print.json" --layers 1 --d-model 32 --heads 2 --seq 16 \
  --steps 25 2>&1)
printed=$(echo "$out" | grep -o 'step *[0-9]*/25' | sed 's/step *//; s|/25||' | tr '\n' ' ')
check "steps_per_print 12: progress at steps 1 12 24 25 (got: $printed)" [ "$printed" = "1 12 24 25 " ]
# The engine's own line at 12 and 24: tokens/s is samples/s times the 16
# tokens of each sample (counted by the trainer, summed over ranks).
engine_lines=$(echo "$out" | grep -c '\[zero-cpp\] step=\(12\|24\), .*samples/s=.*tokens/s=' || true)
check "engine progress lines with tokens/s at steps 12 and 24 (got $engine_lines)" [ "$engine_lines" = 2 ]
check "tokens/s = 16 x samples/s" awk -v line="$(echo "$out" | grep '\[zero-cpp\] step=24,')" 'BEGIN {
  match(line, /samples\/s=[0-9.]+/); s = substr(line, RSTART + 10, RLENGTH - 10)
  match(line, /tokens\/s=[0-9.]+/); t = substr(line, RSTART + 9, RLENGTH - 9)
  r = t / (16 * s); exit !(s > 0 && r > 0.99 && r < 1.01) }'

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
