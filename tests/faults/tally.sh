# Results, case by case, and the run's counts. Needs known_defects.sh.
#   case_begin CLASS DESCRIPTION     a new case (CLASS: see known_defects.sh)
#   verdict CHECK ok|fail [WHY]      one check's result (a failure explained by
#                                    a known defect counts as known)
#   case_end [NOTE]                  prints the case's line; counts it
#   case_skipped DESCRIPTION WHY     a case that could not run here
#   summary SEED SECONDS             the JSON line; exit status 1 if anything failed unexplained
# Counts: injected (faults that fired), survived (every check passed), lost
# (the last good checkpoint missing, damaged or not resuming exactly), failed
# (some check failed for no known reason), known (failed only on known defects).
T_INJECTED=0 T_SURVIVED=0 T_LOST=0 T_FAILED=0 T_KNOWN=0 T_SKIPPED=0
declare -A T_BY_CHECK=() T_BY_DEFECT=()

case_begin() {
  C_CLASS=$1
  C_DESC=$2
  C_FAILS=()
  C_KNOWN=()
  C_LOST=0
  C_FIRED=1  # the driver sets 0 when the fault never fired
}

verdict() {
  local check=$1 result=$2 why=${3:-} id
  [ "$result" = ok ] && return
  [ "$check" = checkpoint ] || [ "$check" = resume ] && C_LOST=1
  id=$(known_defect "$C_CLASS" "$check" "$why")
  if [ -n "$id" ]; then
    C_KNOWN+=("$check: known defect $id: $why")
    T_BY_DEFECT[$id]=$(( ${T_BY_DEFECT[$id]:-0} + 1 ))
  else
    C_FAILS+=("$check: $why")
    T_BY_CHECK[$check]=$(( ${T_BY_CHECK[$check]:-0} + 1 ))
  fi
}

case_end() {
  local f
  T_INJECTED=$((T_INJECTED + C_FIRED))
  T_LOST=$((T_LOST + C_LOST))
  if [ ${#C_FAILS[@]} -gt 0 ]; then
    T_FAILED=$((T_FAILED + 1))
    echo "FAIL $C_DESC"
  elif [ ${#C_KNOWN[@]} -gt 0 ]; then
    T_KNOWN=$((T_KNOWN + 1))
    echo "KNOWN $C_DESC"
  else
    T_SURVIVED=$((T_SURVIVED + 1))
    echo "ok   $C_DESC${1:+ ($1)}"
  fi
  for f in "${C_FAILS[@]}" "${C_KNOWN[@]}"; do echo "       $f"; done
}

case_skipped() {
  T_SKIPPED=$((T_SKIPPED + 1))
  echo "skip $1: $2"
}

json_counts() {
  local -n m=$1
  local k out=""
  for k in "${!m[@]}"; do out+="${out:+,}\"$k\":${m[$k]}"; done
  echo "{$out}"
}

summary() {
  local d id what
  for d in "${KNOWN_DEFECTS[@]}"; do
    IFS='|' read -r id _ _ _ what <<<"$d"
    [ -n "${T_BY_DEFECT[$id]:-}" ] && [ -n "$what" ] && echo "known defect $id (${T_BY_DEFECT[$id]} case(s)): $what"
  done
  echo "{\"event\":\"faults\",\"seed\":$1,\"injected\":$T_INJECTED,\"survived\":$T_SURVIVED,\"lost\":$T_LOST,"\
"\"failed\":$T_FAILED,\"known\":$T_KNOWN,\"skipped\":$T_SKIPPED,\"failed_checks\":$(json_counts T_BY_CHECK),"\
"\"known_defects\":$(json_counts T_BY_DEFECT),\"seconds\":$2}"
  [ "$T_FAILED" -eq 0 ]
}
