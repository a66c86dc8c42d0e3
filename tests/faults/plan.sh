# Which faults one run injects, from its seed (FAULT_SEED=N replays run N).
#   plan_cases SEED    fills CASES, one line per case:
#     host1  STAGE KIND POINT RANK NTH   one host, 2 ranks
#     hosts2 STAGE KIND POINT RANK NTH   2 namespace hosts x 2 ranks
#     diskfull STAGE                     the checkpoint disk fills mid-save (one host)
#     linkcut STAGE                      host B's link cut mid-run (2 hosts)
# One host: each of the 15 (kind, point) pairs once, at stage (SEED + the
# pair's index) mod 4, so any 4 consecutive seeds cover all 60 (stage,
# kind, point) classes (FAULT_ALL=1: all 60 in one run). Two hosts, at stage
# SEED mod 4: 3 pairs drawn from the seed, each on a rank drawn among the 4.
# The victim rank and the pass that fails (the step, the save, the range
# read) are drawn from the seed too. FAULT_CASES="LINE;LINE..." runs those
# case lines instead (e.g. "hosts2 1 exit step 3 2;linkcut 2"); FAULT_ONLY=GLOB
# (an extended glob) keeps only the cases that match it, e.g.
# FAULT_ONLY='@(hosts2|linkcut)*' for the two-host cases of a seed.
FAULT_KINDS=(kill throw exit)
FAULT_POINTS=(forward backward step save load)

# The pass at which POINT fails: a step or save from the 2nd to the 4th (so a
# checkpoint exists before it); the 1st to the 6th range read of a load.
fault_nth() { if [ "$1" = load ]; then echo $((1 + RANDOM % 6)); else echo $((2 + RANDOM % 3)); fi; }

plan_cases() {
  local seed=$1 i=0 k p s pairs=() stages
  RANDOM=$seed
  CASES=()
  for k in "${FAULT_KINDS[@]}"; do
    for p in "${FAULT_POINTS[@]}"; do
      pairs+=("$k $p")
      stages=$(( (seed + i) % 4 ))
      [ "${FAULT_ALL:-0}" = 1 ] && stages="0 1 2 3"
      for s in $stages; do CASES+=("host1 $s $k $p $((RANDOM % 2)) $(fault_nth "$p")"); done
      i=$((i + 1))
    done
  done
  local ms=$((seed % 4)) picked=" " j
  for _ in 1 2 3; do
    j=$((RANDOM % ${#pairs[@]}))
    while [[ "$picked" == *" $j "* ]]; do j=$(( (j + 1) % ${#pairs[@]} )); done
    picked+="$j "
    set -- ${pairs[$j]}
    CASES+=("hosts2 $ms $1 $2 $((RANDOM % 4)) $(fault_nth "$2")")
  done
  CASES+=("diskfull $(( (seed + 1) % 4 ))" "linkcut $ms")
  if [ -n "${FAULT_CASES:-}" ]; then IFS=';' read -r -a CASES <<<"$FAULT_CASES"; fi
  if [ -n "${FAULT_ONLY:-}" ]; then
    local c kept=()
    shopt -s extglob
    # shellcheck disable=SC2053
    for c in "${CASES[@]}"; do [[ "$c" == $FAULT_ONLY ]] && kept+=("$c"); done
    CASES=("${kept[@]}")
  fi
}
