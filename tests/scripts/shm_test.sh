#!/usr/bin/env bash
# The shared-memory fast path end to end: it serves training by default; it
# falls back to Gloo with one warning when it cannot start, and stays off when
# told to; a rank killed mid-collective is an error on its peers within about
# a second (no zero-run to stop them); nothing is left in /dev/shm.
# Usage: shm_test.sh ZERO_RUN ZERO_TRAIN MR_COMM_TEST
set -u
. "$(dirname "$0")/lib.sh"
ZR=$1
ZT=$2
COMM_TEST=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tiny=(--layers 2 --d-model 32 --heads 2 --seq 16 --steps 3)
cat > "$tmp/s3.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100}}
JSON
step_comm() { grep '"event":"step"' "$1" | tail -1; }

# Default: every collective of a stage-3 step on the fast path (the
# seed's second review bug was a coalesced path that bypassed it).
"$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/s3.json" "${tiny[@]}" --log-json "$tmp/on.jsonl" > "$tmp/on.txt" 2>&1
check "default: trains" [ $? -eq 0 ]
step=$(step_comm "$tmp/on.jsonl")
check "default: allgather on shm" [ -n "$(grep -o '"allgather":{[^}]*"transport":{"shm"' <<<"$step")" ]
check "default: reduce_scatter on shm" [ -n "$(grep -o '"reduce_scatter":{[^}]*"transport":{"shm"' <<<"$step")" ]
check "default: no collective on gloo" [ -z "$(grep -o '"gloo"' <<<"$step")" ]
check "default: no warning" [ -z "$(grep 'shared-memory transport unavailable' "$tmp/on.txt")" ]

# Cannot start (no such directory): one warning, then Gloo.
ZERO_SHM_DIR=/nonexistent/zero-shm "$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/s3.json" "${tiny[@]}" \
  --log-json "$tmp/fail.jsonl" > "$tmp/fail.txt" 2>&1
check "init failure: still trains" [ $? -eq 0 ]
check "init failure: exactly one warning" [ "$(grep -c 'shared-memory transport unavailable' "$tmp/fail.txt")" -eq 1 ]
check "init failure: the warning names the cause" contains "$(cat "$tmp/fail.txt")" "/nonexistent/zero-shm"
check "init failure: everything on gloo" [ -z "$(grep -o '"shm"' <<<"$(step_comm "$tmp/fail.jsonl")")" ]
check "init failure: same losses as shm" [ "$(grep -o '"final_loss":[^,]*' "$tmp/fail.jsonl")" = \
                                           "$(grep -o '"final_loss":[^,]*' "$tmp/on.jsonl")" ]

# Off by the environment, or by the ds_config: no warning, Gloo.
ZERO_COMM_FASTPATH=off "$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/s3.json" "${tiny[@]}" \
  --log-json "$tmp/off.jsonl" > "$tmp/off.txt" 2>&1
check "ZERO_COMM_FASTPATH=off: trains on gloo" [ -z "$(grep -o '"shm"' <<<"$(step_comm "$tmp/off.jsonl")")" ]
check "ZERO_COMM_FASTPATH=off: no warning" [ -z "$(grep 'unavailable' "$tmp/off.txt")" ]
cat > "$tmp/s3off.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100},
 "zero_cpp": {"comm_fast_path": false}}
JSON
"$ZR" -n 2 --timeout 120 -- "$ZT" --config "$tmp/s3off.json" "${tiny[@]}" --log-json "$tmp/cfg.jsonl" >/dev/null 2>&1
check "zero_cpp.comm_fast_path false: trains on gloo" [ -z "$(grep -o '"shm"' <<<"$(step_comm "$tmp/cfg.jsonl")")" ]

# A rank SIGKILLed mid-collective, ranks started by hand: every survivor
# fails naming it, long before the 300 s collective timeout -- on the staged
# path and on the zero-copy one (the tensor in a shared flat buffer), at 2,
# 3 and 4 ranks (the last one is killed).
port=""
for _ in $(seq 50); do
  p=$((20000 + RANDOM % 40000))
  if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then port=$p; break; fi
done
for n in 2 3 4; do
  for shared in 0 1; do
    what="kill at $n ranks (shared buffer: $shared)"
    job="shmkill$$n${n}s$shared"
    t0=$(now)
    for r in $(seq 0 $((n - 1))); do
      env RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
        MASTER_PORT=$((port + 10 * n + shared)) ZERO_JOB_ID=$job ZERO_TEST_SHARED_BUFFER=$shared \
        timeout 60 "$COMM_TEST" --gtest_filter='ShmKill.*' > "$tmp/kill$r.txt" 2>&1 &
      pids[$r]=$!
    done
    for r in $(seq 0 $((n - 1))); do wait "${pids[$r]}"; rcs[$r]=$?; done
    check "$what: the killed rank died of SIGKILL" [ ${rcs[$((n - 1))]} -eq 137 ]
    for r in $(seq 0 $((n - 2))); do
      check "$what: survivor $r's test passed" [ ${rcs[$r]} -eq 0 ]
      check "$what: survivor $r named the dead rank" contains "$(cat "$tmp/kill$r.txt")" "exited while this rank waited for it"
      [ ${rcs[$r]} -eq 0 ] || tail -20 "$tmp/kill$r.txt"
    done
    check "$what: well within the collective timeout" elapsed_lt "$t0" 30
    check "$what: no segment left in /dev/shm" [ -z "$(ls /dev/shm | grep "^zero-$job")" ]
  done
done

# zero-run: a rank killed during training; the job ends and zero-run removes
# whatever its job left in /dev/shm (here a planted segment name).
port2=$((port + 5))
"$ZR" -n 2 --master-port $port2 --timeout 120 -- "$ZT" --config "$tmp/s3.json" --layers 2 --d-model 32 --heads 2 \
  --seq 16 --steps 100000 > "$tmp/zr.txt" 2>&1 &
zr=$!
planted="/dev/shm/zero-zr${zr}_${port2}-g7-p1"
sleep 3
touch "$planted"
victim=$(child_pids $zr | tail -1)
kill -9 "$victim"
t0=$(now)
wait $zr; rc=$?
check "zero-run: fails when a rank is killed" [ $rc -ne 0 ]
check "zero-run: ends promptly" elapsed_lt "$t0" 15
check "zero-run: removes its job's segments" [ ! -e "$planted" ]
check "zero-run: nothing of the job left" [ -z "$(ls /dev/shm | grep "^zero-zr${zr}_")" ]
finish
