#!/usr/bin/env bash
# The shared-memory lane's protocol model (src/comm/shm/lane.pml) checked
# by SPIN, exhaustively, in every variant: each variant of the protocol as
# the code runs it must verify with no error (no deadlock, one collective
# per round on every rank, no read of the wrong round's data, every job
# finished), and each planted bug must be caught, by the property named.
# Needs spin and a C compiler; exits 77 (ctest: skipped) without them.
# Usage: lane_model_test.sh [MODEL]    (LANE_MODEL_JOBS: checks at once, 2)
set -u
. "$(dirname "$0")/lib.sh"
model=${1:-$(dirname "$0")/../../src/comm/shm/lane.pml}
cc=${CC:-cc}
command -v spin >/dev/null || { echo "skipped: spin is not installed (Debian: apt-get install spin)"; exit 77; }
command -v "$cc" >/dev/null || { echo "skipped: no C compiler ($cc) for SPIN's verifiers"; exit 77; }
[ -f "$model" ] || { echo "FAIL no model at $model"; exit 1; }
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# name | -D flags | expected: "ok", or what pan reports for the bug. The
# largest first (they run 2 at a time). K=3: all_reduce, a two-round staged
# collective, all_gather; K=2: all_reduce, reduce_scatter (lane.pml, init).
variants=(
  # The protocol as lane.cpp runs it (2 ranks unless -DN), each verified:
  "3 ranks|-DN=3 -DK=2 -DSHARE_CHOOSERS=0 -DWAIT_CHOOSERS=0|ok"
  "teardown|-DSTOP -DK=2 -DWAIT_CHOOSERS=1|ok"
  "concurrent waiters|-DWAITER -DK=2 -DSHARE_CHOOSERS=0 -DWAIT_CHOOSERS=1|ok"
  "timeouts|-DTIMEOUT -DK=2 -DTIMERS=1|ok"
  "zero-copy or staged|-DK=3|ok"
  "free wait never blocks|-DFREE_WAIT_NEVER_BLOCKS|ok"
  "peer crash|-DCRASH -DK=2|ok"
  "mismatch, staged|-DMISMATCH -DWAIT_CHOOSERS=1|ok"
  "mismatch, zero-copy|-DMISMATCH -DK=2|ok"
  "reduce_scatter|-DK=2|ok"
  "counters wrap|-DWRAP -DK=2|ok"
  "no zero-copy lane|-DNO_ZERO_COPY|ok"
  # Planted bugs, each caught:
  "one buffer|-DBUG_ONE_BUFFER|assertion violated (sigtag"
  "no written wait|-DBUG_NO_WRITTEN_WAIT|assertion violated (sigtag"
  "own shareable only|-DBUG_LOCAL_SHAREABLE|invalid end state"
  "all_reduce in one round|-DBUG_AR_ONE_ROUND|assertion violated (buf"
  "no reader wait|-DBUG_NO_READER_WAIT|assertion violated (buf"
  "lost wake-up|-DBUG_LOST_WAKEUP|invalid end state"
  "submit without notify|-DBUG_SUBMIT_NO_NOTIFY|invalid end state"
  "two runners|-DBUG_TWO_RUNNERS|assertion violated (runners"
  "two runners, unchecked|-DBUG_TWO_RUNNERS -DNO_RUNNER_CHECK|assertion violated"
  "notify_one|-DBUG_NOTIFY_ONE -DWAITER -DK=2 -DSHARE_CHOOSERS=0|invalid end state"
  "teardown frees a read buffer|-DBUG_FREE_RETAINED -DSTOP -DK=2|assertion violated (buf"
)

# check INDEX FLAGS: spin -a, build the verifier, run it; the report in $tmp/INDEX/pan.out.
check_variant() {
  local dir=$tmp/$1
  mkdir -p "$dir" && cd "$dir" || return
  # shellcheck disable=SC2086
  if ! spin -a $2 "$model" > spin.out 2>&1; then echo "spin -a failed" > pan.out; cat spin.out >> pan.out; return; fi
  if ! "$cc" -O0 -w -DSAFETY -DCOLLAPSE -o pan pan.c > cc.out 2>&1; then echo "cc failed" > pan.out; cat cc.out >> pan.out; return; fi
  ./pan -n > pan.out 2>&1
}

start=$(now)
jobs_max=${LANE_MODEL_JOBS:-2}
for i in "${!variants[@]}"; do
  IFS='|' read -r _ flags _ <<<"${variants[$i]}"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
  ( TIMEFORMAT=%U+%S; { time check_variant "$i" "$flags"; } 2> "$tmp/$i.cpu" ) &
done
wait

for i in "${!variants[@]}"; do
  IFS='|' read -r name flags expect <<<"${variants[$i]}"
  out=$tmp/$i/pan.out
  errors=$(grep -o 'errors: [0-9]*' "$out" 2>/dev/null | grep -o '[0-9]*$')
  states=$(grep -o '^ *[0-9.e+]* states, stored' "$out" 2>/dev/null | awk '{print $1}')
  cpu_s=$(awk -F+ '{ printf "%.1f", $1 + $2 }' "$tmp/$i.cpu" 2>/dev/null)
  what="$name ($flags): ${states:-?} states, ${cpu_s:-?} s CPU"
  if [ -z "$errors" ]; then
    fail "$what: no verdict"; sed 's/^/     /' "$out" | head -20
  elif [ "$expect" = ok ]; then
    # Exhaustive or nothing: a search cut short proves nothing.
    if [ "$errors" -eq 0 ] && ! grep -q 'max search depth too small\|Search not completed' "$out"; then
      pass "$what: verified"
    else
      fail "$what: $(grep -m1 'pan:1:\|max search depth\|Search not completed' "$out")"
    fi
  else
    if [ "$errors" -gt 0 ] && grep -q "pan:1: $expect" "$out"; then
      pass "$what: caught ($(grep -m1 -o 'pan:1: [^(]*' "$out" | sed 's/pan:1: //;s/ *$//'))"
    else
      fail "$what: not caught as \"$expect\" ($(grep -m1 'pan:1:' "$out" || echo "errors: $errors"))"
    fi
  fi
done
echo "${#variants[@]} checks, $jobs_max at once: $(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }') s," \
  "$(cat "$tmp"/*.cpu | awk -F+ '{ s += $1 + $2 } END { printf "%.1f", s }') s CPU"
finish
