#!/usr/bin/env bash
# A job on two hosts, simulated: two network namespaces joined by a veth
# pair (each a host with its own address, netns_hosts.sh; `zero-run
# --hostfile` reaches them with `ip netns exec`), 2 ranks each. Checks:
# hierarchical collectives against the flat path and the bytes that crossed
# the link against the formulas; loss parity with one process at every
# stage, hierarchical and flat, and which transport served the step; stage
# 3's bytes between hosts per step, flat, hierarchical and with hpZ, against
# the formula; a wrong hpZ size named; and that one host's ranks or agent
# dying stops every rank on both hosts within 5 s, leaving nothing in
# /dev/shm. Needs root (CAP_NET_ADMIN); exits 77 (ctest: skipped) when
# namespaces cannot be made, saying why.
# Usage: multihost_test.sh ZERO_RUN ZERO_TRAIN MR_COMM_TEST
set -u
. "$(dirname "$0")/lib.sh"
ZR=$1
ZT=$2
COMM_TEST=$3
. "$(dirname "$0")/netns_hosts.sh"
tmp=$(mktemp -d)
trap 'netns_hosts_down; rm -rf "$tmp"' EXIT

if ! why=$(netns_hosts_up "$tmp"); then
  echo "skipped: $why"
  exit 77
fi
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

# Teardown after a rank fails alone: rank 0 shuts its world down with three
# hierarchical collectives issued that its (live) peers never join. It must
# take seconds, not the collective timeout per collective.
out=$(ZERO_COLLECTIVE_TIMEOUT_S=30 on_hosts -- "$COMM_TEST" --gtest_filter='HierarchicalTeardown.*' 2>&1)
rc=$?
check "teardown with collectives in flight between hosts takes seconds" [ $rc -eq 0 ]
[ $rc -eq 0 ] || echo "$out" | tail -30
echo "$out" | grep '^\[rank 0\] teardown' | sed 's/^\[rank 0\] /     /'

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

# Stage 3 per step, flat, hierarchical and with hpZ (zero_hpz_partition_size
# 2: backward gathers inside each host): the bytes that crossed the link
# (both ends' tx counters; a 6-step run minus a 2-step one, over 4 steps)
# against the formula applied to the step's own counters (payload bytes per
# op and transport). hpZ changes no value: its losses are hierarchical's.
mid=(--layers 2 --d-model 128 --heads 4 --seq 32)
for mode in flat hier hpz; do
  hpz=1; [ $mode = hpz ] && hpz=2
  echo "{\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": 3,
        \"stage3_param_persistence_threshold\": 100, \"stage3_max_reuse_distance\": 0,
        \"zero_hpz_partition_size\": $hpz}}" > "$tmp/s3.json"
  hier=on; [ $mode = flat ] && hier=off
  for steps in 2 6; do
    t0=$(netns_link_tx)
    ZERO_HIERARCHICAL=$hier on_hosts -- "$ZT" --config "$tmp/s3.json" "${mid[@]}" --steps $steps \
      --log-json "$tmp/$mode$steps.jsonl" > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt" | tail -5; }
    eval "bytes$steps=$(( $(netns_link_tx) - t0 ))"
  done
  per_step=$(( (bytes6 - bytes2) / 4 ))
  formula=$(python3 - "$tmp/${mode}6.jsonl" <<'PY'
import json, sys
H, L = 2, 2
N = H * L
step = [json.loads(l) for l in open(sys.argv[1]) if '"event":"summary"' in l][0]["last_step_comm"]
# Bytes between hosts, all hosts together, for a payload P (one rank's
# count: the full buffer) per op and transport -- the algorithms' formulas
# (docs/collectives.md, "Groups spanning hosts"); fp32 here, so partial sums cost the same.
per = {"gloo": {"allgather": H * (N - 1) / N, "reduce_scatter": N - L, "all_reduce": 2 * H * (N - 1) / N},
       "hier": {"allgather": H - 1, "reduce_scatter": H - 1, "all_reduce": 2 * (H - 1)},
       "shm": {}}
print(int(sum(per[t].get(op, 0) * b for op, c in step.items() for t, b in c["transport_bytes"].items())))
PY
)
  check "stage 3 $mode: bytes between hosts per step $per_step, formula $formula" \
    awk -v a="$per_step" -v b="$formula" 'BEGIN { exit !(b > 0 && a / b >= 0.99 && a / b <= 1.08) }'
  eval "per_step_$mode=$per_step"
  summary=$(grep '"event":"summary"' "$tmp/${mode}6.jsonl")
  [ $mode = hpz ] && check "stage 3 hpz: backward gathers inside the host (shm), forward's across (hier)" \
    bash -c '[[ "$1" =~ \"allgather\":\{[^}]*\"transport\":\{\"hier\":[0-9]+,\"shm\":[0-9]+ ]]' _ "$summary"
done
check "stage 3 hpz: the losses of the hierarchical run, bit for bit" \
  [ "$(losses "$tmp/hier6.jsonl")" = "$(losses "$tmp/hpz6.jsonl")" ]
check "stage 3: hierarchical < flat bytes between hosts, hpZ < hierarchical ($per_step_flat, $per_step_hier, $per_step_hpz)" \
  [ "$per_step_hier" -lt "$per_step_flat" -a "$per_step_hpz" -lt "$per_step_hier" ]

# An hpZ partition that is not one host's ranks: named on every rank, at once.
echo '{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 4}}' \
  > "$tmp/bad.json"
out=$(on_hosts -- "$ZT" --config "$tmp/bad.json" "${tiny[@]}" 2>&1)
check "hpZ of 4 on 2 hosts x 2 ranks: refused" [ $? -ne 0 ]
check "hpZ of 4 on 2 hosts x 2 ranks: the key and the layout named" \
  contains "$out" "zero_hpz_partition_size = 4, but group 'dp0' (ranks 0,1,2,3) has 2 ranks on each of 2 hosts"

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
    victims=$(ip netns pids "$HOST_B" | while read -r p; do
      [[ "$(tr '\0' '\n' < "/proc/$p/cmdline" 2>/dev/null | head -1)" == *zero-train ]] && echo "$p"; done)
  else
    victims=$(ip netns pids "$HOST_B" | while read -r p; do
      [[ "$(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null)" == *"zero-run --agent " ]] && echo "$p"; done)
  fi
  t0=$(now)
  kill -9 $victims 2>/dev/null
  wait $job
  rc=$?
  check "$victim killed on host B: the job exits non-zero" [ $rc -ne 0 ]
  check "$victim killed on host B: every host stops within 5 s" elapsed_lt "$t0" 5
  check "$victim killed on host B: no rank left on either host" \
    bash -c '! ip netns pids "$1" | grep -q . && ! ip netns pids "$2" | grep -q .' _ "$HOST_A" "$HOST_B"
  check "$victim killed on host B: the message names the host" contains "$(cat "$tmp/kill.out")" "host $HOST_B"
  [ $victim = rank ] && check "rank killed on host B: ... and the rank" \
    grep -qE "host $HOST_B: rank [23] was killed by signal" "$tmp/kill.out"
  check "$victim killed on host B: nothing left in /dev/shm" bash -c 'ls /dev/shm | cmp -s - "$1"' _ "$tmp/shm.before"
done
finish
