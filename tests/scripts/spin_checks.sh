# What the SPIN model tests share (lane_model_test.sh, direct_path_model_test.sh):
# run_spin_checks MODEL checks MODEL in every variant of the caller's
# `variants` array ("name|-D flags|expected", expected "ok" or what pan
# reports for a planted bug), SPIN_CHECK_JOBS (2) at once: each "ok" must
# verify exhaustively with no error, each bug must be caught by the
# property named. Exits through lib.sh's finish; 77 (ctest: skipped)
# without spin or a C compiler.
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cc=${CC:-cc}

run_spin_checks() {
  model=$1
  command -v spin >/dev/null || { echo "skipped: spin is not installed (Debian: apt-get install spin)"; exit 77; }
  command -v "$cc" >/dev/null || { echo "skipped: no C compiler ($cc) for SPIN's verifiers"; exit 77; }
  [ -f "$model" ] || { echo "FAIL no model at $model"; exit 1; }
  model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
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
  jobs_max=${SPIN_CHECK_JOBS:-${LANE_MODEL_JOBS:-2}}
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
}
