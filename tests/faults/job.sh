# One job of the fault suite: started, waited for, and checked for what it
# leaves behind. Needs tests/scripts/lib.sh (now, cmdline_running), ZR
# (zero-run) and, for two hosts, netns_hosts.sh's hosts set up with their
# hostfile in $HOSTFILE.
#   launcher WHERE TIMEOUT      the zero-run command for host1 (2 local ranks)
#                               or hosts2 (2 namespace hosts x 2 ranks), as LAUNCH
#   start_job OUT CMD...        starts CMD in the background, output in OUT (JOB_PID)
#   finish_job                  waits for it: JOB_RC, and JOB_T1 when it ended
#   fault_time OUT              when the injected fault fired (its "zero-fault:" line), unix seconds
#   gone_within MARKER T LIMIT  true when every process whose command line holds
#                               MARKER (the case's directory) was gone by T+LIMIT;
#                               GONE_AFTER: seconds from T. Stragglers are killed.
#   shm_left                    /dev/shm entries named for the last job (zero-run's pid)

launcher() {
  if [ "$1" = host1 ]; then
    LAUNCH=("$ZR" -n 2 --timeout "$2" --)
  else
    LAUNCH=(env GLOO_SOCKET_IFNAME=zt0 "$ZR" --hostfile "$HOSTFILE" --host-exec "ip netns exec {host}"
            --master-addr 10.231.0.1 --timeout "$2" --)
  fi
}

start_job() {
  local out=$1
  shift
  "$@" > "$out" 2>&1 &
  JOB_PID=$!
}

finish_job() {
  wait "$JOB_PID"
  JOB_RC=$?
  JOB_T1=$(now)
}

fault_time() { sed -n 's/.*zero-fault: rank [0-9]*: .* (unix time \([0-9.]*\))$/\1/p' "$1" | head -1; }

# The ids of the processes whose command line holds $1.
pids_with() {
  local f args
  for f in /proc/[0-9]*/cmdline; do
    [ "$f" = "/proc/$BASHPID/cmdline" ] && continue
    mapfile -d '' args 2>/dev/null < "$f" || continue
    [[ "${args[*]}" == *"$1"* ]] && { f=${f#/proc/}; echo "${f%/cmdline}"; }
  done
}

gone_within() {
  local marker=$1 t=$2 limit=$3 t_gone=$JOB_T1
  while cmdline_running "$marker"; do
    if ! elapsed_lt "$t" "$limit"; then
      GONE_AFTER=never
      kill -9 $(pids_with "$marker") 2>/dev/null  # this case's own stragglers
      return 1
    fi
    sleep 0.2
    t_gone=$(now)
  done
  GONE_AFTER=$(awk -v a="$t" -v b="$t_gone" 'BEGIN { printf "%.1f", b - a }')
  awk -v e="$GONE_AFTER" -v l="$limit" 'BEGIN { exit !(e < l) }'
}

# Segments are named zero-<job id>..., the job id zr<zero-run's pid>_<port>
# (on several hosts, with n<node> after it).
shm_left() { ls /dev/shm | grep "^zero-zr${JOB_PID}_" | paste -sd' '; }
