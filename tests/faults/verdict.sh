# What a failed job said: one clear message naming the rank (and its host,
# when the job has several) that failed. Sets WHY to what was wrong, on failure.
#   verdicts OUT                 the launchers' stop messages ("zero-run: X; stopping the other ranks": X)
#   names_crash OUT RANK HOST HOW
#       a fault the other ranks learn of only by its death (kill, exit, or an
#       exception outside a checkpoint): every stop message that blames a rank
#       blames RANK (on HOST), at least one says HOW ("was killed by signal
#       Killed", "exited with code 3"), and messages about a host name HOST.
#       On one host zero-run names no host (HOST empty).
#   names_agreed OUT RANK HOST WHAT
#       a failure the ranks agree on (an exception inside save_checkpoint or
#       load_checkpoint): RANK says its error, every other rank says
#       "WHAT failed on rank RANK"; on several hosts that message names HOST.
#   names_disk_full OUT NRANKS   every rank says the save ran out of space and was undone

verdicts() { sed -n 's/^zero-run: \(.*\); stopping the other ranks$/\1/p' "$1" | sort -u; }

names_crash() {
  local out=$1 rank=$2 host=$3 how=$4 v blamed=() hosts=() said=0 line
  local want="rank $rank"
  [ -n "$host" ] && want="host $host: rank $rank"
  while IFS= read -r v; do
    if [[ "$v" =~ ^(host\ [^:]+:\ )?rank\ [0-9]+\  ]]; then
      line=${v%% was *}
      line=${line%% exited *}
      [[ " ${blamed[*]} " == *" [$line] "* ]] || blamed+=("[$line]")
      [ "$v" = "$want $how" ] && said=1
    elif [[ "$v" =~ ^host\ ([^ ]+)\ \(node\ [0-9]+\) ]]; then
      hosts+=("${BASH_REMATCH[1]}")
    fi
  done < <(verdicts "$out")
  WHY=
  if [ ${#blamed[@]} -ne 1 ] || [ "${blamed[0]}" != "[$want]" ]; then
    WHY="the stop messages blame ${blamed[*]:-no rank}, not [$want] alone"
  elif [ $said = 0 ]; then
    WHY="no stop message says '$want $how'"
  fi
  for v in "${hosts[@]}"; do [ "$v" = "$host" ] || WHY="${WHY:+$WHY; }a message blames host $v, not $host"; done
  [ -z "$WHY" ] || WHY="$WHY: $(verdicts "$out" | paste -sd'|')"
  [ -z "$WHY" ]
}

# The lines ranks print as zero-train's error (after the launcher's prefix).
rank_error() { grep -F "[rank $2] zero-train: " "$1" | head -1; }

names_agreed() {
  local out=$1 rank=$2 host=$3 what=$4 nranks=$5 q line
  WHY=
  line=$(rank_error "$out" "$rank")
  [[ "$line" == *"zero-train: $what: injected fault"* ]] || WHY="rank $rank says '${line:-nothing}'"
  for ((q = 0; q < nranks; ++q)); do
    [ $q = "$rank" ] && continue
    line=$(rank_error "$out" $q)
    if [[ "$line" != *"zero-train: $what failed on rank $rank (host "*"): injected fault"* ]]; then
      WHY="${WHY:+$WHY; }rank $q says '${line:-nothing}'"
    elif [ -n "$host" ] && [[ "$line" != *"$host"* ]]; then
      WHY="${WHY:+$WHY; }rank $q names rank $rank but not its host $host: '$line'"
    fi
  done
  [ -n "$(verdicts "$out")" ] || WHY="${WHY:+$WHY; }no stop message from zero-run"
  [ -z "$WHY" ]
}

names_disk_full() {
  local out=$1 nranks=$2 q line
  WHY=
  for ((q = 0; q < nranks; ++q)); do
    line=$(rank_error "$out" $q)
    [[ "$line" == *"No space left on device (the save was undone on every rank"* ]] ||
      WHY="${WHY:+$WHY; }rank $q says '${line:-nothing}'"
  done
  [ -z "$WHY" ]
}

# names_cut OUT HOST: a cut link, seen by the agents' heartbeat: a stop
# message says "lost contact with host HOST", and every stop message that
# blames a rank or a host blames HOST's.
names_cut() {
  local out=$1 host=$2 v blamed=()
  while IFS= read -r v; do
    [[ "$v" =~ lost\ contact\ with\ host\ ([^ :]+) ]] && blamed+=("${BASH_REMATCH[1]}")
    [[ "$v" =~ ^host\ ([^ :]+)(:\ rank|\ \(node) ]] && blamed+=("${BASH_REMATCH[1]}")
    [[ "$v" =~ ^rank\ [0-9]+ ]] && blamed+=("?")
  done < <(verdicts "$out")
  WHY=
  [ ${#blamed[@]} -gt 0 ] || WHY="no stop message blames a host"
  verdicts "$out" | grep -q "lost contact with host $host " || WHY="${WHY:+$WHY; }no stop message says 'lost contact with host $host'"
  for v in "${blamed[@]}"; do [ "$v" = "$host" ] || WHY="${WHY:+$WHY; }a stop message blames host $v, not $host"; done
  [ -z "$WHY" ] || WHY="$WHY: $(verdicts "$out" | paste -sd'|')"
  [ -z "$WHY" ]
}
