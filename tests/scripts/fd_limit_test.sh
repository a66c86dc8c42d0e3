#!/usr/bin/env bash
# Stage 3 under a small descriptor limit: `ulimit -n 256` (soft and hard,
# so raising the soft limit gains nothing), 4 ranks, 200 small units, bf16,
# hpZ at the group's size (one host), then on 2 namespace hosts with hpZ
# over each host's 2 ranks. Each unit has several shared flat buffers; they
# must not cost a descriptor each, nor must the peers' mappings of them,
# and a shortage must never read as a dead peer.
# Usage: fd_limit_test.sh ZERO_RUN ZERO_TRAIN
set -u
. "$(dirname "$0")/lib.sh"
ZR=$1
ZT=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# hpZ's secondary partition is one host's ranks: on one host, the group's size.
cat > "$tmp/s3.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "zero_hpz_partition_size": 4}}
JSON

out=$(bash -c 'ulimit -n 256 && exec "$@"' _ "$ZR" -n 4 --timeout 120 -- "$ZT" --config "$tmp/s3.json" \
  --layers 200 --d-model 16 --heads 2 --seq 8 --steps 3 --log-json "$tmp/log.jsonl" 2>&1)
rc=$?
check "ulimit -n 256, 4 ranks, 200 units: trains" [ $rc -eq 0 ]
[ $rc -eq 0 ] || echo "$out" | tail -5
check "ulimit -n 256: 200 units" contains "$out" "200 units"
check "ulimit -n 256: 3 steps logged" [ "$(grep -c '"event":"step"' "$tmp/log.jsonl" 2>/dev/null)" = 3 ]
step=$(grep '"event":"step"' "$tmp/log.jsonl" 2>/dev/null | tail -1)
check "ulimit -n 256: allgathers on shared memory" [ -n "$(grep -o '"allgather":{[^}]*"transport":{"shm"' <<<"$step")" ]
check "ulimit -n 256: no rank taken for dead" [ -z "$(grep 'exited while this rank waited' <<<"$out")" ]

# The same on two hosts (network namespaces, 2 ranks each) with hpZ's
# secondary partition one host's 2 ranks: its secondary shards are more
# shared buffers, and Gloo's sockets between hosts more descriptors.
. "$(dirname "$0")/netns_hosts.sh"
trap 'netns_hosts_down; rm -rf "$tmp"' EXIT
if why=$(netns_hosts_up "$tmp"); then
  sed 's/"zero_hpz_partition_size": 4/"zero_hpz_partition_size": 2/' "$tmp/s3.json" > "$tmp/hpz.json"
  out=$(GLOO_SOCKET_IFNAME=zt0 bash -c 'ulimit -n 256 && exec "$@"' _ "$ZR" --hostfile "$tmp/hostfile" \
    --host-exec "ip netns exec {host}" --master-addr 10.231.0.1 --timeout 180 -- "$ZT" --config "$tmp/hpz.json" \
    --layers 200 --d-model 16 --heads 2 --seq 8 --steps 3 --log-json "$tmp/hosts.jsonl" 2>&1)
  rc=$?
  check "ulimit -n 256, 2 hosts x 2 ranks, hpZ 2, 200 units: trains" [ $rc -eq 0 ]
  [ $rc -eq 0 ] || echo "$out" | tail -5
  check "2 hosts: 3 steps logged" [ "$(grep -c '"event":"step"' "$tmp/hosts.jsonl" 2>/dev/null)" = 3 ]
  check "2 hosts: no rank taken for dead" [ -z "$(grep 'exited while this rank waited' <<<"$out")" ]
else
  echo "two hosts: skipped: $why"
fi
finish
