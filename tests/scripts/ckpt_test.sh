#!/usr/bin/env bash
# Checkpoints end to end with zero-train and zero-ckpt on 2 ranks: save and
# resume (latest or --tag), consolidation read by an independent reader, --init-from, a rank
# killed mid-save (the previous checkpoint still loads), a full disk (as root), and damaged files.
# Usage: ckpt_test.sh ZERO_RUN ZERO_TRAIN ZERO_CKPT
set -u
. "$(dirname "$0")/lib.sh"
ZR=$1
ZT=$2
ZC=$3
# The reader needs numpy: python3 has it on the GPU machines (a plain
# `python3` with torch), Debian's /usr/bin/python3 here (python3-numpy).
PY=
for p in python3 /usr/bin/python3; do
  if "$p" -c 'import numpy' >/dev/null 2>&1; then PY=$p; break; fi
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=(--layers 2 --d-model 32 --heads 2 --seq 16)
cat > "$tmp/s3.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100}}
JSON
loss_at() { grep '"event":"step"' "$1" | grep "\"step\":$2," | grep -o '"loss":[^,]*'; }

# Save every 2 steps; resume from step 4 up to 6: steps 5 and 6 as in one run.
"$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/s3.json" "${model[@]}" --steps 6 --log-json "$tmp/full.jsonl" >/dev/null 2>&1
"$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/s3.json" "${model[@]}" --steps 4 --save "$tmp/ck" --save-every 2 \
  >/dev/null 2>&1
check "save: latest is step4" [ "$(cat "$tmp/ck/latest")" = step4 ]
check "save: step2 kept" [ -s "$tmp/ck/step2/manifest.json" ]
out=$("$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/s3.json" "${model[@]}" --steps 6 --resume "$tmp/ck" \
  --log-json "$tmp/res.jsonl" 2>&1)
check "resume: says where it resumed" contains "$out" "at step 4"
want5=$(loss_at "$tmp/full.jsonl" 5)
check "resume: step 5 loss as uninterrupted ($want5)" [ -n "$want5" -a "$(loss_at "$tmp/res.jsonl" 5)" = "$want5" ]
check "resume: step 6 loss as uninterrupted" [ "$(loss_at "$tmp/res.jsonl" 6)" = "$(loss_at "$tmp/full.jsonl" 6)" ]

# --tag loads that tag instead of latest (as DeepSpeed's load_checkpoint):
# step2 resumes at step 2, and its step 3 is the uninterrupted run's.
out=$("$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/s3.json" "${model[@]}" --steps 3 --resume "$tmp/ck" \
  --tag step2 --log-json "$tmp/tag.jsonl" 2>&1)
check "--tag step2: resumes at step 2" contains "$out" "tag step2 at step 2"
want3=$(loss_at "$tmp/full.jsonl" 3)
check "--tag step2: step 3 loss as uninterrupted ($want3)" [ -n "$want3" -a "$(loss_at "$tmp/tag.jsonl" 3)" = "$want3" ]
out=$("$ZT" --config "$tmp/s3.json" --tag step2 2>&1)
check "--tag without --resume: named" contains "$out" "--tag needs --resume DIR"

# info and consolidate; the consolidated file read by an independent reader.
out=$("$ZC" info "$tmp/ck" 2>&1)
check "info: describes the checkpoint" contains "$out" "saved by 2 ranks, ZeRO stage 3"
check "info: checks the files" contains "$out" "rank_1.safetensors"
"$ZC" consolidate "$tmp/ck" "$tmp/w.safetensors" >/dev/null 2>&1
check "consolidate: writes the file" [ -s "$tmp/w.safetensors" ]
check "a python3 with numpy for the reader" [ -n "$PY" ]
out=$("${PY:-python3}" "$(dirname "$0")/read_safetensors.py" "$tmp/ck/step4" "$tmp/w.safetensors" 2>&1)
check "consolidate: an independent reader agrees ($out)" contains "$out" "ok:"
"$ZC" consolidate "$tmp/ck" "$tmp/w16.safetensors" --dtype bf16 >/dev/null 2>&1
check "consolidate --dtype bf16: half the bytes" \
  [ "$(stat -c %s "$tmp/w16.safetensors")" -lt "$(( $(stat -c %s "$tmp/w.safetensors") * 6 / 10 ))" ]

# --init-from: training starts from those weights (step 1 loss far below a fresh start's).
"$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/s3.json" "${model[@]}" --steps 1 --init-from "$tmp/w.safetensors" \
  --log-json "$tmp/init.jsonl" >/dev/null 2>&1
a=$(loss_at "$tmp/init.jsonl" 1 | cut -d: -f2); b=$(loss_at "$tmp/full.jsonl" 1 | cut -d: -f2)
check "--init-from: starts from the trained weights ($a < $b)" awk -v a="$a" -v b="$b" 'BEGIN { exit !(a != "" && a < b) }'

# A full disk (a tmpfs with room for one checkpoint; needs root): the second
# save fails on both ranks naming the cause, within seconds, and is undone
# (no .partial-step2, latest still step1); with the tmpfs grown, resuming
# from step1 takes steps 2 and 3 as the uninterrupted run and saves them.
if [ "$(id -u)" -eq 0 ] && mkdir -p "$tmp/disk" &&
   mount -t tmpfs -o size=$(( $(du -sk "$tmp/ck/step2" | cut -f1) * 3 / 2 ))k tmpfs "$tmp/disk" 2>/dev/null; then
  trap 'umount -l "$tmp/disk"; rm -rf "$tmp"' EXIT
  t0=$(now)
  out=$("$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/s3.json" "${model[@]}" --steps 3 --save "$tmp/disk/ck" \
    --save-every 1 2>&1)
  check "disk full: zero-train fails" [ $? -ne 0 ]
  check "disk full: within seconds" elapsed_lt "$t0" 30
  # Each rank's own error, or (its write fitted) the first failing rank's.
  for r in 0 1; do
    line=$(grep -F "[rank $r] zero-train: save_checkpoint" <<<"$out")
    check "disk full: rank $r names the cause ($line)" \
      contains "$line" "/disk/ck/.partial-step2/rank_"
    check "disk full: rank $r says it was undone" \
      contains "$line" ".safetensors: No space left on device (the save was undone on every rank"
  done
  check "disk full: nothing left of the failed save" [ "$(ls -A "$tmp/disk/ck" | tr '\n' ' ')" = "latest step1 " ]
  check "disk full: latest is still step1" [ "$(cat "$tmp/disk/ck/latest")" = step1 ]
  mount -o remount,size=4m "$tmp/disk"
  "$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/s3.json" "${model[@]}" --steps 3 --resume "$tmp/disk/ck" \
    --save "$tmp/disk/ck" --save-every 1 --log-json "$tmp/disk.jsonl" >/dev/null 2>&1
  check "disk full, space freed: resumes and saves" [ "$(cat "$tmp/disk/ck/latest")" = step3 ]
  check "disk full, space freed: step 2 and 3 losses as uninterrupted" \
    [ -n "$want3" -a "$(loss_at "$tmp/disk.jsonl" 2)" = "$(loss_at "$tmp/full.jsonl" 2)" -a "$(loss_at "$tmp/disk.jsonl" 3)" = "$want3" ]
  umount -l "$tmp/disk"
  trap 'rm -rf "$tmp"' EXIT
else
  echo "skip disk full: needs root and a tmpfs mount"
fi

# A planted partial save is skipped with a warning.
mkdir -p "$tmp/ck/.partial-step9"
out=$("$ZC" info "$tmp/ck" 2>&1)
check "partial save: ignored with a warning" contains "$out" "ignoring $tmp/ck/.partial-step9"

# Kill a rank mid-save, several times at different moments: latest always loads.
big=(--layers 4 --d-model 256 --heads 4 --seq 32)
for delay in 2.5 3.1 3.7; do
  rm -rf "$tmp/kill"
  "$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/s3.json" "${big[@]}" --steps 100000 --save "$tmp/kill" \
    --save-every 1 >/dev/null 2>&1 &
  zr=$!
  sleep "$delay"
  kill -9 "$(child_pids $zr | tail -1)" 2>/dev/null
  wait $zr
  if [ -s "$tmp/kill/latest" ]; then
    out=$("$ZC" info "$tmp/kill" 2>&1)
    check "killed mid-save (after ${delay}s): latest ($(cat "$tmp/kill/latest")) loads" contains "$out" "hash ok"
  else
    check "killed mid-save (after ${delay}s): no latest before the first save" [ ! -e "$tmp/kill/latest" ]
  fi
done

# Damaged files are named.
cp -r "$tmp/ck/step4" "$tmp/bad" && mkdir -p "$tmp/badck" && mv "$tmp/bad" "$tmp/badck/t" && echo t > "$tmp/badck/latest"
truncate -s -100 "$tmp/badck/t/rank_1.safetensors"
out=$("$ZC" info "$tmp/badck" 2>&1)
check "truncated shard: named" contains "$out" "rank_1.safetensors is truncated or corrupt"
out=$("$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/s3.json" "${model[@]}" --steps 6 --resume "$tmp/badck" 2>&1)
check "truncated shard: resume fails naming it" contains "$out" "rank_1.safetensors"
f="$tmp/ck/step2/rank_0.safetensors"
printf 'x' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 50 )) conv=notrunc 2>/dev/null  # a data byte
out=$("$ZC" info "$tmp/ck" --tag step2 2>&1)
check "corrupt byte: detected by the hash" contains "$out" "rank_0.safetensors is corrupt"

# A hand-edited manifest: its own hash catches the edit; without a hash (as
# format version 1 wrote them) the edit is still validated, so a numel that
# disagrees with the shape stops consolidate (it used to copy heap memory
# into the output and exit 0).
mkdir -p "$tmp/edck" && cp -r "$tmp/ck/step4" "$tmp/edck/t" && echo t > "$tmp/edck/latest"
edit() { "$PY" - "$tmp/edck/t/manifest.json" "$1" <<'PY'
import json, sys
path, legacy = sys.argv[1], sys.argv[2] == "legacy"
m = json.load(open(path))
p = m["params"][0]
p["numel"] += 1
if legacy:
    del m["manifest_hash"]
    m["format_version"] = 1
json.dump(m, open(path, "w"))
print(f"param '{p['name']}': numel {p['numel']} differs from the product of shape")
PY
}
edit keep-hash >/dev/null
out=$("$ZC" consolidate "$tmp/edck" "$tmp/ed.safetensors" 2>&1)
check "edited manifest: consolidate fails" [ $? -ne 0 ]
check "edited manifest: named as corrupt by its hash" contains "$out" "t/manifest.json is corrupt: its hash differs"
cp "$tmp/ck/step4/manifest.json" "$tmp/edck/t/manifest.json"
want=$(edit legacy)
out=$("$ZC" consolidate "$tmp/edck" "$tmp/ed.safetensors" 2>&1)
check "numel != shape (no hash): consolidate fails" [ $? -ne 0 ]
check "numel != shape (no hash): names the param and the manifest" contains "$out" "t/manifest.json is invalid: $want"
check "numel != shape (no hash): no output written" [ ! -e "$tmp/ed.safetensors" ]
out=$("$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/s3.json" --layers 3 --d-model 32 --heads 2 --seq 16 \
  --steps 6 --resume "$tmp/ck" 2>&1)
check "another model: names the param" contains "$out" "saved from a different model"
finish
