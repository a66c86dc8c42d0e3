# Two hosts simulated on this machine, for the multi-host test and
# benchmark: network namespaces A (10.231.0.1) and B (10.231.0.2) joined by
# a veth pair whose ends are both named zt0 (so GLOO_SOCKET_IFNAME=zt0 on
# both). Source it, then:
#   netns_hosts_up TMPDIR     makes them (or returns 1, saying why: needs root)
#                             and writes TMPDIR/hostfile ("A slots=2", "B slots=2")
#   netns_rate_limit RATE     caps each direction of the link (tc tbf, e.g. 1gbit)
#   netns_link_tx             bytes sent on the link so far, both ends together
#   netns_hosts_down          removes them (deleting a namespace removes its veth end)
# Sets HOST_A and HOST_B (the namespaces' names, unique per process).
HOST_A=zt$$a
HOST_B=zt$$b

netns_hosts_up() {
  local dir=$1
  if ! ip netns add "$HOST_A" 2>"$dir/netns.err"; then
    echo "cannot create a network namespace ($(head -1 "$dir/netns.err")); run as root"
    return 1
  fi
  ip netns add "$HOST_B"
  ip link add "${HOST_A}0" type veth peer name "${HOST_B}0"
  ip link set "${HOST_A}0" netns "$HOST_A"
  ip link set "${HOST_B}0" netns "$HOST_B"
  ip -n "$HOST_A" link set "${HOST_A}0" name zt0
  ip -n "$HOST_B" link set "${HOST_B}0" name zt0
  ip -n "$HOST_A" addr add 10.231.0.1/24 dev zt0
  ip -n "$HOST_B" addr add 10.231.0.2/24 dev zt0
  for ns in "$HOST_A" "$HOST_B"; do ip -n "$ns" link set lo up; ip -n "$ns" link set zt0 up; done
  printf '%s slots=2\n%s slots=2\n' "$HOST_A" "$HOST_B" > "$dir/hostfile"
}

netns_rate_limit() {
  for ns in "$HOST_A" "$HOST_B"; do
    ip netns exec "$ns" tc qdisc replace dev zt0 root tbf rate "$1" burst 1mb latency 100ms
  done
}

netns_link_tx() {
  echo $(( $(ip netns exec "$HOST_A" cat /sys/class/net/zt0/statistics/tx_bytes) + \
           $(ip netns exec "$HOST_B" cat /sys/class/net/zt0/statistics/tx_bytes) ))
}

netns_hosts_down() {
  ip netns del "$HOST_A" 2>/dev/null
  ip netns del "$HOST_B" 2>/dev/null
}
