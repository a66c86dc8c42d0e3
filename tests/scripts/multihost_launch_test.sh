#!/usr/bin/env bash
# zero-run --hostfile under faults and strangers, on two hosts simulated by
# network namespaces (netns_hosts.sh):
#   - the launcher stopping (SIGTERM, SIGKILL) or losing its link to one
#     host stops every rank on every host within 5 s and frees node 0's
#     ports, through a --host-exec that passes no signal on
#     (netns_detached_exec.sh: setsid, stdin a pipe, as ssh/sshd);
#   - a port scan of both hosts during a run (bare connects, garbage, forged
#     STOP/DONE/HELLO, a silent connection) changes nothing: exit 0;
#   - the job's secret is on no command line, and the ranks do not get it;
#   - node 0's ports are chosen on node 0 (the launcher's host has other
#     ports free), and a port given that node 0 has in use is named;
#   - a --host-exec whose first word is not ssh, going through a remote
#     shell, does not re-split or interpret the program's arguments;
#   - the launcher names the host that failed, not one that followed it, nor
#     a rank on another host that failed on the failing rank's closed
#     connection;
#   - a cut link between the hosts is named by the agents' heartbeat (host B
#     lost) within seconds, with no rank blamed; an agent held up writing its
#     ranks' output still beats.
# Needs root (CAP_NET_ADMIN); exits 77 (ctest: skipped) when namespaces
# cannot be made. Usage: multihost_launch_test.sh ZERO_RUN ZERO_TRAIN
set -u
. "$(dirname "$0")/lib.sh"
ZR=$1
ZT=$2
DETACHED=$(cd "$(dirname "$0")" && pwd)/netns_detached_exec.sh
. "$(dirname "$0")/netns_hosts.sh"
tmp=$(mktemp -d)
# Whatever a failed check left running in the namespaces goes with them.
# (bash's own kill and no sysctl here: a bare machine may have no procps.)
kill_hosts() {
  local ns p
  for ns in "$HOST_A" "$HOST_B"; do for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done; done
}
trap 'kill_hosts; netns_hosts_down; rm -rf "$tmp"' EXIT

if ! why=$(netns_hosts_up "$tmp"); then
  echo "skipped: $why"
  exit 77
fi
export GLOO_SOCKET_IFNAME=zt0
marker="zr_mhl_$$"
not() { ! "$@"; }
listening() { ip netns exec "$1" ss -Htln | awk '{ n = split($4, a, ":"); print a[n] }' | sort -un; }
# True when no process is left on either host and node 0 listens on nothing.
hosts_clear() {
  ! ip netns pids "$HOST_A" | grep -q . && ! ip netns pids "$HOST_B" | grep -q . && [ -z "$(listening "$HOST_A")" ]
}
# Waits up to $1 s for hosts_clear; prints the seconds it took.
wait_clear() {
  local t0; t0=$(now)
  for _ in $(seq $(($1 * 20))); do hosts_clear && break; sleep 0.05; done
  awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'
}

# ---- the launcher stopping, or its link to one host dropping ---------------
# Ranks: rank 0 holds MASTER_PORT (as the rendezvous store does), the others
# sleep; none reads stdin or sees a signal the launcher sends.
rank_prog=(bash -c 'if [ "$RANK" = 0 ]; then exec python3 -c "
import os, socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((\"\", int(os.environ[\"MASTER_PORT\"]))); s.listen(); time.sleep(600)"; fi; exec sleep 600' "$marker")
for how in TERM KILL link train; do
  rm -f "$tmp/long.jsonl"
  if [ $how = train ]; then
    echo '{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}' > "$tmp/long.json"
    prog=("$ZT" --config "$tmp/long.json" --layers 2 --d-model 32 --heads 2 --seq 16 --steps 100000
          --log-json "$tmp/long.jsonl")
  else
    prog=("${rank_prog[@]}")
  fi
  "$ZR" --hostfile "$tmp/hostfile" --host-exec "$DETACHED {host}" --master-addr 10.231.0.1 -- "${prog[@]}" \
    > "$tmp/orphan.out" 2>&1 &
  launcher=$!
  # Running: 2 ranks on each host and rank 0 listening (or a first step).
  for _ in $(seq 200); do
    if [ $how = train ]; then grep -q '"event":"step"' "$tmp/long.jsonl" 2>/dev/null && break
    else
      [ "$(ip netns pids "$HOST_B" | wc -l)" -ge 3 ] && [ "$(listening "$HOST_A" | wc -l)" -ge 2 ] && break
    fi
    sleep 0.05
  done
  running=$(( $(ip netns pids "$HOST_A" | wc -l) + $(ip netns pids "$HOST_B" | wc -l) ))
  check "$how: the job runs on both hosts ($running processes) before" [ "$running" -ge 6 ]
  case $how in
    TERM) what="launcher SIGTERMed"; kill -TERM $launcher ;;
    KILL) what="launcher SIGKILLed"; kill -KILL $launcher ;;
    train) what="launcher SIGKILLed during training"; kill -KILL $launcher ;;
    link) what="host B's link dropped"
          # The wrapper (the ssh client, as it were) for host B, alone.
          for p in $(child_pids $launcher); do
            grep -qa -- "$HOST_B" "/proc/$p/cmdline" 2>/dev/null && kill -KILL "$p"
          done ;;
  esac
  took=$(wait_clear 8)
  check "$what: every rank on both hosts gone and node 0's ports free within 5 s (took $took s)" \
    awk -v t="$took" 'BEGIN { exit !(t < 5) }'
  wait $launcher 2>/dev/null
  rc=$?
  [ $how = link ] && check "$what: the launcher exits non-zero" [ $rc -ne 0 ]
  hosts_clear || { echo "     left: $(ip netns pids "$HOST_A" | wc -l) + $(ip netns pids "$HOST_B" | wc -l) processes;" \
                        "node 0 listens on $(listening "$HOST_A" | paste -sd' ')"; tail -5 "$tmp/orphan.out"; kill_hosts; }
done

# ---- strangers on the ports: a scan during a 2-host run --------------------
# Training for a few dozen steps, then every rank waits for $tmp/go: the scan
# (every listening port of both hosts: a bare connect and close, garbage,
# forged STOP, DONE and HELLO lines; a silent connection to node 0's
# zero-run held to the end) runs while the job does, and the job must then
# finish as if nothing had come.
export ZERO_JOB_SECRET="zr-secret-$$-$RANDOM"
echo '{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}' > "$tmp/scan.json"
rm -f "$tmp/go" "$tmp/scan.jsonl"
"$ZR" --hostfile "$tmp/hostfile" --host-exec "ip netns exec {host}" --master-addr 10.231.0.1 --timeout 120 -- \
  bash -c 'echo "secret: ${ZERO_JOB_SECRET:-none}"; "$@" || exit; while [ ! -e "$0" ]; do sleep 0.05; done' "$tmp/go" \
  "$ZT" --config "$tmp/scan.json" --layers 2 --d-model 32 --heads 2 --seq 16 --steps 60 --log-json "$tmp/scan.jsonl" \
  > "$tmp/scan.out" 2>&1 &
job=$!
for _ in $(seq 300); do grep -q '"event":"step"' "$tmp/scan.jsonl" 2>/dev/null && break; sleep 0.1; done
check "the job's secret is on no process's command line" not cmdline_running "$ZERO_JOB_SECRET"
control=$(ip netns exec "$HOST_A" ss -Htlnp | grep '"zero-run"' | awk '{ n = split($4, a, ":"); print a[n] }' | head -1)
ip netns exec "$HOST_B" bash -c "exec 3<>/dev/tcp/10.231.0.1/$control; exec sleep 600" &
silent=$!
probes=0
for ns in "$HOST_A" "$HOST_B"; do
  ip=10.231.0.1; [ "$ns" = "$HOST_B" ] && ip=10.231.0.2
  for port in $(listening "$ns"); do
    for payload in '' 'GET / HTTP/1.0\r\n\r\n\x00\xff\n' 'STOP forged by a scan\n' 'DONE\nDONE\n' \
                   'HELLO 1 forged\nDONE\nSTOP forged\n'; do
      ip netns exec "$HOST_B" bash -c 'exec 3<>"/dev/tcp/$1/$2" && printf "$3" >&3; sleep 0.02' _ "$ip" "$port" "$payload" \
        2>/dev/null && probes=$((probes + 1))
    done
  done
done
training=$(grep -c '"event":"summary"' "$tmp/scan.jsonl")
touch "$tmp/go"
wait $job
rc=$?
kill $silent 2>/dev/null
wait $silent 2>/dev/null
check "scan: $probes probes of both hosts' ports (node 0's zero-run at $control) during training; the job exits 0" \
  [ $rc -eq 0 -a $probes -ge 10 ]
[ $rc -eq 0 ] || tail -5 "$tmp/scan.out"
[ "$training" = 0 ] || echo "     (note: training had finished before the scan ended)"
ignored=$(grep -c 'ignored a connection' "$tmp/scan.out")
check "scan: the strangers on node 0's zero-run are logged, once a connection at most ($ignored lines)" \
  [ "$ignored" -ge 1 -a "$ignored" -le 6 ]
check "scan: nothing was taken for a node or a stop" bash -c '! grep -qE "lost|stopping" "$1"' _ "$tmp/scan.out"
check "the ranks do not get the job's secret" bash -c '[ "$(grep -c "secret: none" "$1")" = 4 ]' _ "$tmp/scan.out"
unset ZERO_JOB_SECRET

# ---- node 0's ports are chosen on node 0, and checked ---------------------
# The launcher runs on host B, whose ephemeral ports are 41000-41001 only;
# host A has 41000-41002 in use: ports chosen where the launcher runs would
# be busy on node 0. Then ports given: 41010 (rendezvous) in use on node 0,
# or 41021 (41020's agent port, + 1).
hold_ports() {  # ns ports...: listeners held until killed (exec: $! is the listener)
  exec ip netns exec "$1" python3 -c '
import socket, sys, time
socks = []
for p in sys.argv[1:]:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", int(p))); s.listen(); socks.append(s)
print("ready", flush=True); time.sleep(600)' "${@:2}"
}
port_range() { ip netns exec "$HOST_B" sh -c 'echo "$1" > /proc/sys/net/ipv4/ip_local_port_range' _ "$1"; }
range=$(ip netns exec "$HOST_B" cat /proc/sys/net/ipv4/ip_local_port_range)
port_range "41000 41001"
check "host B's ephemeral ports narrowed to 41000-41001" \
  bash -c '[ "$(ip netns exec "$1" cat /proc/sys/net/ipv4/ip_local_port_range | tr -s " \t" " ")" = "41000 41001" ]' _ "$HOST_B"
hold_ports "$HOST_A" 41000 41001 41002 41010 41021 > "$tmp/hold.out" &
holder=$!
for _ in $(seq 100); do grep -q ready "$tmp/hold.out" && break; sleep 0.05; done
out=$(ip netns exec "$HOST_B" "$ZR" --hostfile "$tmp/hostfile" --host-exec "ip netns exec {host}" \
  --master-addr 10.231.0.1 --timeout 30 -- bash -c 'echo "port $MASTER_PORT"' 2>&1)
rc=$?
check "ports chosen on node 0: a launcher elsewhere, with other ports free, runs the job" [ $rc -eq 0 ]
[ $rc -eq 0 ] || echo "$out" | tail -3
check "ports chosen on node 0: not the launcher host's" not grep -qE "port 4100[0-2]" <<<"$out"
port_range "$range"
for port in 41010 41020; do  # the rendezvous port in use, then the agents' (port + 1)
  t0=$(now)
  out=$("$ZR" --hostfile "$tmp/hostfile" --host-exec "ip netns exec {host}" --master-addr 10.231.0.1 \
    --master-port $port --timeout 30 -- sleep 5 2>&1)
  rc=$?
  busy=$port; [ $port = 41020 ] && busy=41021
  check "--master-port $port, port $busy in use on node 0: refused within 5 s" \
    bash -c '[ $1 -ne 0 ] && awk -v a="$2" -v b="$(date +%s.%N)" "BEGIN { exit !(b - a < 5) }"' _ $rc "$t0"
  check "--master-port $port, port $busy in use on node 0: the port and host named" \
    grep -q "port $busy .*in use on host $HOST_A" <<<"$out"
  [ $rc -ne 0 ] || echo "$out" | tail -3
done
kill $holder; wait $holder 2>/dev/null
kill_hosts

# ---- a --host-exec that is not ssh, through a remote shell -----------------
# It hands its arguments to a shell on the host joined by spaces, as ssh
# does: the program's words must arrive as they were given, none run.
printf '#!/bin/sh\nhost=$1; shift; exec ip netns exec "$host" sh -c "$*"\n' > "$tmp/shell_exec"
chmod +x "$tmp/shell_exec"
out=$("$ZR" --hostfile "$tmp/hostfile" --host-exec "$tmp/shell_exec {host}" --master-addr 10.231.0.1 --timeout 30 -- \
  printf '<%s>' "a b" "it's" '$(touch '"$tmp"'/ran)' ';touch '"$tmp"'/ran' 2>&1)
check "a host-exec through a remote shell: the arguments arrive as given" \
  contains "$out" "[rank 3] <a b><it's><\$(touch $tmp/ran)><;touch $tmp/ran>"
check "a host-exec through a remote shell: nothing in them runs" [ ! -e "$tmp/ran" ]
# ---- the launcher names the host that failed, not one that followed it ----
# Rank 0 (host A) exits 3; rank 1 (host A) ignores SIGTERM, so host A's agent
# waits out its grace and exits last; host B's agent stops at once on node
# 0's word. The launcher's stop messages must blame host A's rank 0 alone,
# never host B's agent, and the job exit with rank 0's code.
follow_prog=(bash -c 'case $RANK in 0) sleep 1; exit 3;; 1) trap "" TERM; sleep 30;; *) exec sleep 30;; esac')
out=$("$ZR" --hostfile "$tmp/hostfile" --host-exec "ip netns exec {host}" --master-addr 10.231.0.1 --timeout 60 -- \
  "${follow_prog[@]}" 2>&1)
rc=$?
stops=$(sed -n 's/^zero-run: \(.*\); stopping the other ranks$/\1/p' <<<"$out" | sort -u)
check "a follower host: the job exits with the failing rank's code" [ $rc -eq 3 ]
[ $rc -eq 3 ] || echo "  (exit code $rc)"
check "a follower host: the stop messages blame rank 0 on host $HOST_A alone" \
  [ "$stops" = "host $HOST_A: rank 0 exited with code 3" ]
[ "$stops" = "host $HOST_A: rank 0 exited with code 3" ] || echo "$out" | grep '^zero-run' | head -5
check "a follower host: not named as failing" not contains "$out" "host $HOST_B (node 1) exited"

# ---- a rank that exits or throws is blamed, not the peer that lost it -------
# zero-train at stage 2, a rank failing at its 2nd step (ZERO_FAULT): its
# Gloo connections close as it goes, a peer on the other host fails on one at
# once ('Connection closed by peer') and notes it; its agent must wait for the
# failing rank to be named, not name its own. Rank 3 (host B) exits, then rank
# 0 (host A, node 0) throws in forward.
echo '{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}' > "$tmp/peer.json"
for fault in 3:step:exit:2 0:forward:throw:2; do
  IFS=: read -r frank _ fkind _ <<<"$fault"
  fhost=$HOST_A; [ "$frank" -ge 2 ] && fhost=$HOST_B
  fnode=0; [ "$frank" -ge 2 ] && fnode=1
  fcode=3; [ "$fkind" = throw ] && fcode=1
  out=$(ZERO_FAULT=$fault "$ZR" --hostfile "$tmp/hostfile" --host-exec "ip netns exec {host}" \
    --master-addr 10.231.0.1 --timeout 60 -- "$ZT" --config "$tmp/peer.json" --layers 2 --d-model 32 --heads 2 \
    --seq 16 --steps 6 2>&1)
  rc=$?
  # The launcher's own line ("host H (node k) exited ...") comes when that
  # host's agent exits first; it may follow another's instead, and say nothing.
  stops=$(sed -n 's/^zero-run: \(.*\); stopping the other ranks$/\1/p' <<<"$out" | sort -u |
          grep -vxF "host $fhost (node $fnode) exited with code $fcode" | paste -sd'|')
  want="host $fhost: rank $frank exited with code $fcode"
  check "rank $frank (host $fhost) ${fkind}s: the job exits with its code $fcode" [ $rc -eq $fcode ]
  check "rank $frank (host $fhost) ${fkind}s: the stop messages blame it alone" [ "$stops" = "$want" ]
  [ "$stops" = "$want" ] || echo "     stop messages: $stops"
  grep -q "after losing a peer" <<<"$out" && echo "     (a peer's agent waited: $(grep -o 'rank [0-9]* exited with code [0-9]* after losing a peer' <<<"$out" | head -1))"
done
kill_hosts

# ---- a cut link is named by the agents' heartbeat --------------------------
# Every rank sleeps (no collective could time out); host B's link goes down
# once all 4 run. Node 0's agent hears nothing from host B's for 5 s
# (ZERO_HEARTBEAT_TIMEOUT_S) and must name host B, and every process go.
"$ZR" --hostfile "$tmp/hostfile" --host-exec "ip netns exec {host}" --master-addr 10.231.0.1 --timeout 120 -- \
  sleep 100 > "$tmp/cut.out" 2>&1 &
job=$!
for _ in $(seq 200); do [ "$(ip netns pids "$HOST_B" | wc -l)" -ge 3 ] && break; sleep 0.05; done
sleep 1.5  # a heartbeat or two over the link first
t0=$(now)
ip -n "$HOST_B" link set zt0 down
wait $job
rc=$?
took=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
ip -n "$HOST_B" link set zt0 up
stops=$(sed -n 's/^zero-run: \(.*\); stopping the other ranks$/\1/p' "$tmp/cut.out")
check "a cut link: the job stops, exit non-zero, within 15 s of the cut (took $took s)" \
  bash -c '[ $1 -ne 0 ] && awk -v t="$2" "BEGIN { exit !(t < 15) }"' _ $rc "$took"
check "a cut link: node 0's agent names host $HOST_B as the host it lost contact with" \
  grep -q "^host $HOST_A: lost contact with host $HOST_B (node 1): nothing from its zero-run for 5.0 s" <<<"$stops"
check "a cut link: no rank is blamed" not grep -qE "rank [0-9]+ (exited|was killed)" <<<"$stops"
hosts_clear || { echo "     left: $(ip netns pids "$HOST_A" | wc -l) + $(ip netns pids "$HOST_B" | wc -l) processes"; kill_hosts; }
grep '^zero-run' "$tmp/cut.out" | head -4 | sed 's/^/     /'

# ---- ... but an agent held up writing output is not silent ----------------
# Host B's ranks print 2 MB each, 3 s in (its agent has joined node 0's by
# then); the launcher's output goes to a pipe nobody reads for 12 s (a
# paused terminal, `| less`), so host B's agent blocks writing it for about
# 9 s. It must still beat: the job ends as it would, exit 0.
"$ZR" --hostfile "$tmp/hostfile" --host-exec "ip netns exec {host}" --master-addr 10.231.0.1 --timeout 60 -- \
  bash -c 'if [ "$RANK" -ge 2 ]; then sleep 3; head -c 2000000 /dev/zero | tr "\\0" x | fold -w 100; fi; sleep 3' \
  2>&1 | { sleep 12; cat > "$tmp/paused.out"; }
rc=${PIPESTATUS[0]}
check "output paused 12 s: the job is not stopped as silent (exit $rc)" [ "$rc" -eq 0 ]
[ "$rc" -eq 0 ] || grep "^zero-run" "$tmp/paused.out" | head -3 | sed "s/^/     /"
kill_hosts

finish
