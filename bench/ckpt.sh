#!/usr/bin/env bash
# Checkpoint save and load time of the ~100M-param GPT (8 x 1024) at 2 local
# ranks, stages 1 and 3, against a plain sequential write (dd, fsync) and read
# of the same number of bytes on the same disk, in the same invocation.
# Prints one JSON object.   bench/ckpt.sh BUILD_DIR [DIR_ON_THE_DISK]
set -euo pipefail
B=${1:-build}
base=${2:-$(mktemp -d -p "${TMPDIR:-/tmp}")}
. "$(dirname "$0")/lib.sh"
trap 'rm -rf "$tmp" "$base/zero-ckpt-bench"; rmdir "$base" 2>/dev/null || true' EXIT
bench_model big
field() { grep "\"event\":\"$1\"" "$tmp/log.jsonl" | grep -o "\"$2\":[0-9.e+]*" | head -1 | cut -d: -f2; }

echo '{"bench": "checkpoint", "ranks": 2, "date": "'"$(date -u +%F)"'", "runs": ['
first=1
for stage in 1 3; do
  dir="$base/zero-ckpt-bench"
  rm -rf "$dir"
  bench_config "$stage" fp32
  zero_train_summary --steps 1 "${model_args[@]}" --save "$dir" > /dev/null
  save_ms=$(field checkpoint save_ms); bytes=$(field checkpoint bytes)
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true  # cold reads where allowed
  zero_train_summary --steps 1 "${model_args[@]}" --resume "$dir" > /dev/null
  load_ms=$(field resume load_ms)
  # The same bytes, written sequentially with one fsync, then read back.
  mib=$(( bytes / 1048576 + 1 ))
  t0=$(date +%s.%N); dd if=/dev/zero of="$base/zero-ckpt-bench/plain" bs=1M count=$mib conv=fsync status=none
  write_ms=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print (b - a) * 1000 }')
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  t0=$(date +%s.%N); dd if="$base/zero-ckpt-bench/plain" of=/dev/null bs=1M status=none
  read_ms=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print (b - a) * 1000 }')
  [ $first = 1 ] || echo ','
  first=0
  printf '    {"stage": %s, "bytes": %s, "save_ms": %s, "plain_write_ms": %s, "save_over_plain": %s,\n' \
    "$stage" "$bytes" "$save_ms" "$write_ms" "$(awk -v a="$save_ms" -v b="$write_ms" 'BEGIN { print a / b }')"
  printf '     "load_ms": %s, "plain_read_ms": %s, "load_over_plain": %s}' \
    "$load_ms" "$read_ms" "$(awk -v a="$load_ms" -v b="$read_ms" 'BEGIN { print a / b }')"
done
echo
echo ']}'
