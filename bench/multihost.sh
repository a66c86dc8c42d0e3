#!/usr/bin/env bash
# Stage 3 on two hosts simulated by network namespaces (2 ranks each) joined
# by a rate-limited link (tc tbf, RATE each way, default 1gbit): the ~101M
# GPT (bf16), flat Gloo across the 4 ranks, hierarchical collectives, and
# hierarchical + ZeRO++ hpZ, side by side in one run. Per mode: the median
# step time and the bytes that crossed the link per step (a STEPS-step run
# minus a 1-step run, both link ends' tx counters). Needs root; prints one
# JSON object.
#   bench/multihost.sh BUILD_DIR [STEPS] [RATE]
set -euo pipefail
B=${1:-build}
STEPS=${2:-4}
RATE=${3:-1gbit}
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../tests/scripts/netns_hosts.sh"
trap 'netns_hosts_down; rm -rf "$tmp"' EXIT
netns_hosts_up "$tmp" >&2 || exit 1
netns_rate_limit "$RATE"
export GLOO_SOCKET_IFNAME=zt0
bench_model big
read -r -a model_args <<< "${ZERO_MULTIHOST_MODEL:-${model_args[*]}}"

run() {  # mode steps -> $tmp/log.jsonl; echoes the bytes that crossed the link
  local mode=$1 steps=$2 hier=on hpz=1
  [ "$mode" = flat ] && hier=off
  [ "$mode" = hpz ] && hpz=2
  bench_config 3 bf16 "${ZERO_MULTIHOST_MICRO:-2}"
  sed -i 's/"stage": 3,/"stage": 3, "zero_hpz_partition_size": '"$hpz"',/' "$tmp/c.json"
  local t0
  t0=$(netns_link_tx)
  ZERO_HIERARCHICAL=$hier "$B/zero-run" --hostfile "$tmp/hostfile" --host-exec "ip netns exec {host}" \
    --master-addr 10.231.0.1 -- "$B/zero-train" --config "$tmp/c.json" --steps "$steps" "${model_args[@]}" \
    --log-json "$tmp/log.jsonl" > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt" >&2; exit 1; }
  echo $(( $(netns_link_tx) - t0 ))
}

echo '{"bench": "multihost", "hosts": 2, "ranks_per_host": 2, "link": "'"$RATE"'", "date": "'"$(date -u +%F)"'",'
echo ' "model": "'"${model_args[*]}"'", "stage": 3, "dtype": "bf16", "runs": ['
first=1
for mode in flat hier hpz; do
  one=$(run $mode 1)
  many=$(run $mode "$STEPS")
  [ $first = 1 ] || echo ','
  first=0
  printf '  {"mode": "%s", "link_bytes_per_step": %s, "summary": %s, "losses": %s}' "$mode" \
    "$(( (many - one) / (STEPS - 1) ))" "$(grep '"event":"summary"' "$tmp/log.jsonl")" "$(last_losses)"
done
echo
echo ']}'
