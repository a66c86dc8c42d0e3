#!/usr/bin/env bash
# A job on two hosts, simulated: two network namespaces joined by a veth
# pair (each a host with its own address; `zero-run --hostfile` reaches
# them with `ip netns exec`), 2 ranks each. Checks loss parity with one
# process at every stage, which transport served the collectives, and that
# one host's ranks dying stops every rank on both hosts within 5 s and
# leaves nothing behind in /dev/shm. Needs root (CAP_NET_ADMIN); exits 77
# (ctest: skipped) when namespaces cannot be made, saying why.
# Usage: multihost_test.sh ZERO_RUN ZERO_TRAIN MR_COMM_TEST
set -u
. "$(dirname "$0")/lib.sh"
ZR=$1
ZT=$2
COMM_TEST=$3
tmp=$(mktemp -d)
A=zt$$a B=zt$$b
cleanup() {
  ip netns del "$A" 2>/dev/null
  ip netns del "$B" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

# Two hosts: namespaces A (10.231.0.1) and B (.2), each with interface zt0.
if ! ip netns add "$A" 2>"$tmp/err"; then
  echo "skipped: cannot create a network namespace ($(head -1 "$tmp/err")); run as root"
  exit 77
fi
ip netns add "$B"
ip link add "${A}0" type veth peer name "${B}0"
ip link set "${A}0" netns "$A"
ip link set "${B}0" netns "$B"
ip -n "$A" link set "${A}0" name zt0
ip -n "$B" link set "${B}0" name zt0
ip -n "$A" addr add 10.231.0.1/24 dev zt0
ip -n "$B" addr add 10.231.0.2/24 dev zt0
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; ip -n "$ns" link set zt0 up; done
printf '%s slots=2\n%s slots=2\n' "$A" "$B" > "$tmp/hostfile"
export GLOO_SOCKET_IFNAME=zt0  # the same name on both hosts
on_hosts() { "$ZR" --hostfile "$tmp/hostfile" --host-exec "ip netns exec {host}" --master-addr 10.231.0.1 --timeout 120 "$@"; }
tiny=(--layers 2 --d-model 32 --heads 2 --seq 16 --steps 4)
losses() { grep -o '"loss":[^,]*' "$1" | cut -d: -f2 | paste -sd' '; }

# Hierarchical collectives against the flat path, and the bytes that
# crossed the link against the formulas (tests/mr/hierarchical_test.cpp).
out=$(on_hosts -- "$COMM_TEST" --gtest_filter='Hierarchical.*' 2>&1)
rc=$?
check "hierarchical collectives: tests pass on 2 hosts" [ $rc -eq 0 ]
[ $rc -eq 0 ] || echo "$out" | grep -v '^\[rank [1-3]\]' | tail -30
echo "$out" | grep '^\[rank 0\] .*bytes between hosts' | sed 's/^\[rank 0\] /     /'

# Parity: 4 ranks on 2 hosts (micro-batch 2) against one process (8), every
# stage, with the spanning group's collectives hierarchical (the default)
# and flat (ZERO_HIERARCHICAL=off: Gloo across all 4).
for stage in 0 1 2 3; do
  for n in 1 4; do
    echo "{\"train_micro_batch_size_per_gpu\": $((8 / n)), \"zero_optimization\": {\"stage\": $stage,
          \"stage3_param_persistence_threshold\": 100, \"reduce_bucket_size\": 3000}}" > "$tmp/c$n.json"
  done
  env -u GLOO_SOCKET_IFNAME "$ZR" -n 1 -- "$ZT" --config "$tmp/c1.json" "${tiny[@]}" --log-json "$tmp/one.jsonl" >/dev/null 2>&1
  for mode in hier gloo; do
    hier=on; [ $mode = gloo ] && hier=off
    out=$(ZERO_HIERARCHICAL=$hier on_hosts -- "$ZT" --config "$tmp/c4.json" "${tiny[@]}" --log-json "$tmp/hosts.jsonl" 2>&1)
    rc=$?
    check "stage $stage ($mode): 2 hosts x 2 ranks train" [ $rc -eq 0 ]
    [ $rc -eq 0 ] || echo "$out" | tail -5
    check "stage $stage ($mode): 4 ranks on 2 hosts" contains "$(grep '"event":"setup"' "$tmp/hosts.jsonl")" '"world_size":4'
    check "stage $stage ($mode): losses as one process ($(losses "$tmp/hosts.jsonl") vs $(losses "$tmp/one.jsonl"))" \
      awk -v a="$(losses "$tmp/hosts.jsonl")" -v b="$(losses "$tmp/one.jsonl")" 'BEGIN {
        n = split(a, x, " "); if (n != 4 || split(b, y, " ") != n) exit 1
        for (i = 1; i <= n; ++i) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > 1e-5 * y[i]) exit 1 }
        exit 0 }'
    # The data-parallel group spans both hosts: shared memory cannot serve
    # it; every op of the step goes the chosen way.
    summary=$(grep '"event":"summary"' "$tmp/hosts.jsonl")
    check "stage $stage ($mode): the step's collectives served by $mode only" \
      bash -c '[[ "$1" == *"\"$2\":"* && "$1" != *"\"shm\":"* && "$1" != *"\"$3\":"* ]]' _ "$summary" $mode \
      "$([ $mode = hier ] && echo gloo || echo hier)"
  done
done

# One host's ranks killed: every rank on both hosts is gone within 5 s, the
# message names host and rank, and no segment is left in /dev/shm.
echo '{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}' > "$tmp/long.json"
for victim in rank agent; do
  ls /dev/shm > "$tmp/shm.before"
  rm -f "$tmp/long.jsonl"
  on_hosts -- "$ZT" --config "$tmp/long.json" --layers 2 --d-model 32 --heads 2 --seq 16 --steps 100000 \
    --log-json "$tmp/long.jsonl" > "$tmp/kill.out" 2>&1 &
  job=$!
  for _ in $(seq 300); do grep -q '"event":"step"' "$tmp/long.jsonl" 2>/dev/null && break; sleep 0.1; done
  if [ $victim = rank ]; then
    victims=$(ip netns pids "$B" | while read -r p; do
      [[ "$(tr '\0' '\n' < "/proc/$p/cmdline" 2>/dev/null | head -1)" == *zero-train ]] && echo "$p"; done)
  else
    victims=$(ip netns pids "$B" | while read -r p; do grep -qa -- '--node-rank' "/proc/$p/cmdline" 2>/dev/null && echo "$p"; done)
  fi
  t0=$(now)
  kill -9 $victims 2>/dev/null
  wait $job
  rc=$?
  check "$victim killed on host B: the job exits non-zero" [ $rc -ne 0 ]
  check "$victim killed on host B: every host stops within 5 s" elapsed_lt "$t0" 5
  check "$victim killed on host B: no rank left on either host" \
    bash -c '! ip netns pids "$1" | grep -q . && ! ip netns pids "$2" | grep -q .' _ "$A" "$B"
  check "$victim killed on host B: the message names the host" contains "$(cat "$tmp/kill.out")" "host $B"
  [ $victim = rank ] && check "rank killed on host B: ... and the rank" \
    grep -qE "host $B: rank [23] was killed by signal" "$tmp/kill.out"
  check "$victim killed on host B: nothing left in /dev/shm" bash -c 'ls /dev/shm | cmp -s - "$1"' _ "$tmp/shm.before"
done
finish
