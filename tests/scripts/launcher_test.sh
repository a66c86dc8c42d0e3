#!/usr/bin/env bash
# zero-run: environment, output prefixes, and no hang or leftover process
# when a rank fails or is killed. Usage: launcher_test.sh ZERO_RUN
set -u
. "$(dirname "$0")/lib.sh"
ZR=$1
marker="zr_launcher_test_$$"
tmp_out=$(mktemp)
trap 'rm -f "$tmp_out" "$tmp_out.1" "$tmp_out.hf"' EXIT
# True when no process's command line holds the marker.
none_left() { sleep 0.2; ! cmdline_running "$marker"; }

# Every rank gets the torchrun variables; output lines carry the rank prefix.
out=$("$ZR" -n 3 -- bash -c 'echo "env $RANK/$WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE $MASTER_ADDR:$MASTER_PORT"; echo err >&2' 2>&1)
rc=$?
check "3 ranks exit 0" [ $rc -eq 0 ]
for r in 0 1 2; do
  check "rank $r sees its variables" contains "$out" "[rank $r] env $r/3 local $r/3 127.0.0.1:"
  check "rank $r stderr prefixed" contains "$out" "[rank $r] err"
done

# A rank that exits 1 while the others would run for a minute.
t0=$(now)
out=$("$ZR" -n 3 -- bash -c "if [ \$RANK = 1 ]; then sleep 0.5; exit 3; fi; exec sleep 60 # $marker" 2>&1)
rc=$?
check "failing rank: zero-run exits non-zero" [ $rc -ne 0 ]
check "failing rank: exit code is the rank's" [ $rc -eq 3 ]
check "failing rank: stops within 5 s" elapsed_lt "$t0" 5
check "failing rank: says which rank" contains "$out" "rank 1 exited with code 3"
check "failing rank: no rank process left" none_left

# A rank that is SIGKILLed.
t0=$(now)
out=$("$ZR" -n 2 -- bash -c "if [ \$RANK = 0 ]; then sleep 0.5; kill -9 \$\$; fi; exec sleep 60 # $marker" 2>&1)
rc=$?
check "killed rank: zero-run exits non-zero" [ $rc -ne 0 ]
check "killed rank: stops within 5 s" elapsed_lt "$t0" 5
check "killed rank: reported" contains "$out" "rank 0 was killed by signal"
check "killed rank: no rank process left" none_left

# A rank that ignores SIGTERM is SIGKILLed after the grace period.
t0=$(now)
"$ZR" -n 2 -- bash -c "trap '' TERM; if [ \$RANK = 0 ]; then exit 1; fi; while true; do sleep 0.1; done # $marker" >/dev/null 2>&1
check "stubborn rank: killed within 5 s" elapsed_lt "$t0" 5
check "stubborn rank: no rank process left" none_left

# SIGTERM to zero-run is forwarded.
"$ZR" -n 2 -- bash -c "exec sleep 60 # $marker" >/dev/null 2>&1 &
zr=$!
sleep 0.5
t0=$(now)
kill -TERM $zr
wait $zr
rc=$?
check "SIGTERM: zero-run exits non-zero" [ $rc -ne 0 ]
check "SIGTERM: stops within 5 s" elapsed_lt "$t0" 5
check "SIGTERM: no rank process left" none_left

# --timeout bounds a whole job.
t0=$(now)
"$ZR" -n 2 --timeout 1 -- sleep 60 >/dev/null 2>&1
check "--timeout: exit code 124" [ $? -eq 124 ]
check "--timeout: within 5 s" elapsed_lt "$t0" 5

# torchrun's several-host form, both "hosts" here: global ranks per node,
# and a rank failing on node 1 stops node 0's ranks too, naming host and rank.
port=$((20000 + $$ % 20000))
agent() {  # node host cmd
  "$ZR" --nnodes 2 --node-rank "$1" -n 2 --master-addr 127.0.0.1 --master-port $port --host-name "$2" -- bash -c "$3"
}
agent 1 hb 'echo "env $RANK/$WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE node $GROUP_RANK"' > "$tmp_out.1" 2>&1 &
out=$(agent 0 ha 'echo "env $RANK/$WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE node $GROUP_RANK"' 2>&1)
rc=$?
wait $!
out="$out $(cat "$tmp_out.1")"
check "--nnodes 2: node 0 exits 0 once both nodes are done" [ $rc -eq 0 ]
for r in 0 1 2 3; do
  check "--nnodes 2: rank $r sees its variables" contains "$out" "[rank $r] env $r/4 local $((r % 2))/2 node $((r / 2))"
done
port=$((port + 2))
agent 1 hb "if [ \$RANK = 3 ]; then sleep 0.5; exit 5; fi; exec sleep 60 # $marker" > "$tmp_out.1" 2>&1 &
node1=$!
t0=$(now)
out=$(agent 0 ha "exec sleep 60 # $marker" 2>&1)
rc=$?
wait $node1
rc1=$?
check "--nnodes 2: a rank failing on node 1 stops node 0 (exit non-zero)" [ $rc -ne 0 ]
check "--nnodes 2: node 1 exits with its rank's code" [ $rc1 -eq 5 ]
check "--nnodes 2: both nodes stop within 5 s" elapsed_lt "$t0" 5
check "--nnodes 2: node 0 says which host and rank" contains "$out" "host hb: rank 3 exited with code 5"
check "--nnodes 2: no rank process left" none_left
# The agents prove the job's secret (ZERO_JOB_SECRET, the same on every
# host) to each other: a node with another one is refused and says why, and
# node 0 logs it and keeps waiting for its own (here until --timeout).
port=$((port + 2))
ZERO_JOB_SECRET=another-job agent 1 hb 'exit 0' > "$tmp_out.1" 2>&1 &
node1=$!
t0=$(now)
out=$(ZERO_JOB_SECRET=this-job "$ZR" --nnodes 2 --node-rank 0 -n 1 --master-addr 127.0.0.1 --master-port $port \
  --host-name ha --timeout 2 -- sleep 30 2>&1)
rc=$?
wait $node1
rc1=$?
check "another job's secret: node 1 is refused (exits non-zero)" [ $rc1 -ne 0 ]
check "another job's secret: node 1 says why" grep -q "ZERO_JOB_SECRET" "$tmp_out.1"
check "another job's secret: node 0 ignores it, logged, and runs on to --timeout" \
  bash -c '[ $1 -eq 124 ] && grep -q "ignored a connection from 127.0.0.1" <<<"$2"' _ $rc "$out"
check "another job's secret: within 5 s" elapsed_lt "$t0" 5
# Host names that would be options to the --host-exec command are refused.
printf '# hosts\n-oProxyCommand=touch%s slots=1\n' "$tmp_out.pwned" > "$tmp_out.hf"
out=$("$ZR" --hostfile "$tmp_out.hf" --host-exec "env {host}" -- true 2>&1)
rc=$?
check "a host name starting with '-': refused, naming the line" \
  bash -c '[ $1 -eq 2 ] && grep -qF "$3:2: host name '"'"'-oProxyCommand" <<<"$2"' _ $rc "$out" "$tmp_out.hf"
out=$("$ZR" --nnodes 2 --node-rank 0 -n 1 -- true 2>&1)
check "--nnodes without --master-addr/--master-port rejected" contains "$out" "needs --master-addr and --master-port"
out=$("$ZR" --hostfile /nonexistent -- true 2>&1)
check "a missing hostfile is named" contains "$out" "cannot read hostfile /nonexistent"

# Bad usage is a clear error.
out=$("$ZR" -n 0 -- true 2>&1); check "bad -n rejected" contains "$out" "-n must be an integer"
out=$("$ZR" -n 2 2>&1); check "missing program rejected" contains "$out" "no program given"
out=$("$ZR" -n 1 -- /nonexistent/prog 2>&1); check "unknown program reported" contains "$out" "cannot execute /nonexistent/prog"
finish
