#!/usr/bin/env bash
# Issue 34: which allocation policy. The ~101M GPT (8 x 1024, seq 128,
# micro-batch 4, fp32, 2 ranks) at stages 0 and 3 under each policy, side by
# side in one invocation: step time (median of steps 3 and later) and peak
# RSS per rank.
#   caching      the default: torch's CPU tensors of 1 MiB and more from the
#                engine's caching allocator (zero_cpp.cpu_allocator "caching",
#                src/memory/large_block_cache.h), the rest from glibc with its
#                mmap threshold fixed at 1 MiB
#   caching-noslack   the same with no slack (ZERO_LARGE_BLOCK_SLACK_MB=0):
#                the cache never holds more than the peak in use
#   The others give torch's CPU tensors torch's own allocator
#   (zero_cpp.cpu_allocator "torch"), so malloc decides:
#   fixed-1MiB   glibc with its mmap threshold fixed at 1 MiB (the default
#                before the caching allocator; zero_cpp.malloc_mmap_threshold 1048576)
#   glibc        glibc left alone (malloc_mmap_threshold 0)
#   fixed-8MiB, fixed-32MiB   the threshold fixed higher: activations and
#                scratch of a few MiB stay in the heap, gathered units
#                (tens of MiB) are still mapped and unmapped
#   jemalloc     LD_PRELOAD libjemalloc (Debian's libjemalloc2), its default decay
#   jemalloc-bg  jemalloc with a background purging thread and 1 s dirty decay
#   tcmalloc     LD_PRELOAD libtcmalloc_minimal (libtcmalloc-minimal4)
#   mimalloc     LD_PRELOAD libmimalloc (libmimalloc2.0)
# The order turns every round (ZERO_BENCH_ROUNDS, default 1), so drift on
# this shared machine does not favour one policy. A policy whose library is
# missing is skipped, and said so. ZERO_ALLOCATOR_POLICIES="a b ..." runs
# only those. Prints one JSON object.
#   bench/allocators.sh BUILD_DIR [STEPS]
set -euo pipefail
B=${1:-build}
STEPS=${2:-6}
ROUNDS=${ZERO_BENCH_ROUNDS:-1}

. "$(dirname "$0")/lib.sh"
bench_model big
lib=/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)

read -r -a policies <<<"${ZERO_ALLOCATOR_POLICIES:-caching caching-noslack fixed-1MiB glibc fixed-8MiB fixed-32MiB jemalloc jemalloc-bg tcmalloc mimalloc}"

# $1 policy -> sets `preload`, `malloc_conf`, `threshold`, `allocator`,
# `slack`; false if unavailable.
policy() {
  preload="" malloc_conf="" threshold=0 allocator=torch slack=""
  case $1 in
    caching) threshold=1048576 allocator=caching ;;
    caching-noslack) threshold=1048576 allocator=caching slack=0 ;;
    fixed-1MiB) threshold=1048576 ;;
    fixed-8MiB) threshold=8388608 ;;
    fixed-32MiB) threshold=33554432 ;;
    glibc) ;;
    jemalloc) preload=$lib/libjemalloc.so.2 ;;
    jemalloc-bg) preload=$lib/libjemalloc.so.2 malloc_conf="background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0" ;;
    tcmalloc) preload=$lib/libtcmalloc_minimal.so.4 ;;
    mimalloc) preload=$lib/libmimalloc.so.2 ;;
    *) echo "allocators: unknown policy '$1'" >&2; exit 2 ;;
  esac
  [ -z "$preload" ] || [ -f "$preload" ]
}

echo '{"bench": "allocators", "ranks": 2, "dtype": "fp32", "model": "'"${model_args[*]}"'", "date": "'"$(date -u +%F)"'",'
echo ' "runs": ['
first=1
for ((round = 0; round < ROUNDS; round++)); do
  order=("${policies[@]}")
  if [ $((round % 2)) = 1 ]; then for ((i = 0; i < ${#policies[@]}; i++)); do order[i]=${policies[-1 - i]}; done; fi
  for stage in 0 3; do
    for p in "${order[@]}"; do
      if ! policy "$p"; then echo "allocators: $p skipped ($preload missing)" >&2; continue; fi
      bench_config "$stage" fp32
      sed -i "s|^{ |{ \"zero_cpp\": {\"malloc_mmap_threshold\": $threshold, \"cpu_allocator\": \"$allocator\"}, |" "$tmp/c.json"
      summary=$(
        [ -z "$preload" ] || export LD_PRELOAD=$preload
        [ -z "$malloc_conf" ] || export MALLOC_CONF=$malloc_conf
        [ -z "$slack" ] || export ZERO_LARGE_BLOCK_SLACK_MB=$slack
        zero_train_summary --steps "$STEPS" "${model_args[@]}")
      [ $first = 1 ] || echo ','
      first=0
      printf '  {"round": %d, "stage": %d, "policy": "%s", "summary": %s}' "$round" "$stage" "$p" "$summary"
    done
  done
done
echo
echo ']}'
