# The last good checkpoint after a fault: it is the one saved last before
# the fault, every file checks out, and training resumed from it takes the
# steps an uninterrupted run took, loss for loss (printed to the last digit).
# Needs ZC (zero-ckpt), ZT (zero-train), MODEL, job.sh. Sets WHY on failure.
#   loss_at LOG STEP                 the loss zero-train's JSON log has for STEP
#   latest_is CK TAG                 CK's latest names TAG and `zero-ckpt info` checks every file
#   resumes_exactly DIR WHERE CFG CK STEP REF
#       resumes from CK (saved at STEP) up to STEP+2 on WHERE's ranks: steps
#       STEP+1 and STEP+2 have REF's losses (REF: the uninterrupted run's log)

loss_at() { grep '"event":"step"' "$1" 2>/dev/null | grep "\"step\":$2," | grep -o '"loss":[^,]*' | cut -d: -f2; }

latest_is() {
  local ck=$1 tag=$2 got info
  got=$(cat "$ck/latest" 2>/dev/null)
  WHY=
  if [ "$got" != "$tag" ]; then
    WHY="latest is '${got:-missing}', not $tag: $(ls -A "$ck" 2>/dev/null | paste -sd' ')"
  elif ! info=$("$ZC" info "$ck" 2>&1); then
    WHY="zero-ckpt info fails: $(tail -1 <<<"$info")"
  elif ! grep -q "^checkpoint $ck/$tag\$" <<<"$info"; then
    WHY="zero-ckpt info reads another checkpoint: $(head -1 <<<"$info")"
  fi
  [ -z "$WHY" ]
}

resumes_exactly() {
  local dir=$1 where=$2 cfg=$3 ck=$4 step=$5 ref=$6 s got want
  launcher "$where" 120
  start_job "$dir/resume.out" "${LAUNCH[@]}" "$ZT" --config "$cfg" "${MODEL[@]}" --resume "$ck" \
    --steps $((step + 2)) --log-json "$dir/resume.jsonl"
  finish_job
  WHY=
  if [ "$JOB_RC" -ne 0 ]; then
    WHY="resuming failed (exit $JOB_RC): $(grep -v socket.cpp "$dir/resume.out" | tail -2 | paste -sd'|')"
    return 1
  fi
  for s in $((step + 1)) $((step + 2)); do
    got=$(loss_at "$dir/resume.jsonl" $s)
    want=$(loss_at "$ref" $s)
    [ -n "$want" ] && [ "$got" = "$want" ] || WHY="${WHY:+$WHY; }step $s: loss ${got:-missing}, uninterrupted ${want:-missing}"
  done
  [ -z "$WHY" ]
}
