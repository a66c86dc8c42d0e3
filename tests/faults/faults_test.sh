#!/usr/bin/env bash
# The fault suite: ranks of zero-train killed (SIGKILL), throwing, or
# exiting (std::exit(3)) at random points -- forward, mid-backward, before the
# optimizer step, mid-save, mid-load -- at stages 0-3, on one host (2 ranks)
# and on 2 network-namespace hosts (2 x 2); a checkpoint disk that fills
# mid-save; a host whose link is cut mid-run. After each fault:
#   stopped     the job exits non-zero (and the fault fired)
#   gone        every process of the job is gone within 10 s of the fault
#   named       one clear message names the rank (and its host, when the job has
#               several: on one host zero-run names none)
#   shm         nothing of the job is left in /dev/shm (nor in the NVMe swap dir:
#               stage 3 runs with params and optimizer state on NVMe)
#   checkpoint  latest names the last checkpoint saved before the fault, every file checks out
#   resume      resuming from it gives the uninterrupted run's losses, exactly
# Faults are injected through ZERO_FAULT (src/common/fault_injection.h). The
# cases are drawn from a seed, printed first: FAULT_SEED=N replays a run,
# FAULT_ALL=1 runs every one-host class (plan.sh). Two-host cases and the
# link cut need root (network namespaces), the full disk a tmpfs mount; they
# are skipped, and counted so, without. Last line: the counts as JSON
# (tally.sh). Failures that known_defects.sh explains are reported, not fatal.
# Usage: faults_test.sh ZERO_RUN ZERO_TRAIN ZERO_CKPT
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../scripts/lib.sh"
. "$here/../scripts/netns_hosts.sh"
for f in plan job verdict resume known_defects tally; do . "$here/$f.sh"; done
ZR=$1
ZT=$2
ZC=$3
MODEL=(--layers 2 --d-model 32 --heads 2 --seq 16)
seed=${FAULT_SEED:-$(( $(date +%s%N) / 1000 % 100000 ))}
t_start=$(now)
tmp=$(mktemp -d)
MOUNTS=()
cleanup() {
  local m
  for m in "${MOUNTS[@]}"; do umount -l "$m" 2>/dev/null; done
  netns_hosts_down
  [ "${FAULT_KEEP:-0}" = 1 ] && echo "faults: kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT
echo "faults: seed $seed (FAULT_SEED=$seed replays this run)"

# Stage 3 runs ZeRO-Infinity: params and optimizer state in swap files under
# $tmp/nvme (every shard there: max_in_cpu 0), so each stage-3 fault also
# checks that a rank killed mid-swap leaves nothing a resume could read.
mkdir -p "$tmp/nvme"
for s in 0 1 2 3; do
  nvme=""
  [ $s = 3 ] && nvme="\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"$tmp/nvme\"},
        \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"$tmp/nvme\", \"max_in_cpu\": 0},"
  echo "{\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": $s, $nvme
        \"stage3_param_persistence_threshold\": 100, \"reduce_bucket_size\": 3000}}" > "$tmp/stage$s.json"
done
HOSTFILE=
if HOSTS_WHY=$(netns_hosts_up "$tmp"); then HOSTFILE=$tmp/hostfile; fi
host_of() { if [ "$1" -lt 2 ]; then echo "$HOST_A"; else echo "$HOST_B"; fi; }

# The uninterrupted run per (where, stage): 8 steps, saved at steps 4 and 8
# (load faults resume from its step 4). Made when first needed.
reference() {
  local where=$1 stage=$2 ref=$tmp/ref-$1-$2
  REF=$ref
  [ -f "$ref/ok" ] && return 0
  [ -f "$ref/failed" ] && return 1
  mkdir -p "$ref"
  launcher "$where" 120
  start_job "$ref/out" "${LAUNCH[@]}" "$ZT" --config "$tmp/stage$stage.json" "${MODEL[@]}" --steps 8 \
    --save "$ref/ck" --save-every 4 --log-json "$ref/log.jsonl"
  finish_job
  if [ "$JOB_RC" -eq 0 ] && [ -s "$ref/ck/step4/manifest.json" ]; then
    touch "$ref/ok"
    return 0
  fi
  touch "$ref/failed"
  echo "FAIL the uninterrupted $where run at stage $stage (exit $JOB_RC):"
  grep -v socket.cpp "$ref/out" | tail -5
  T_FAILED=$((T_FAILED + 1))
  return 1
}

# The checks every fault shares, once its job ended: gone (within LIMIT s of
# T_FAULT), shm, checkpoint (latest is GOOD) and resume.
common_checks() {
  local dir=$1 where=$2 stage=$3 t_fault=$4 limit=$5 ck=$6 good=$7 left
  if gone_within "$dir/" "$t_fault" "$limit"; then verdict gone ok; else
    verdict gone fail "processes still running $limit s after the fault (killed now)"; fi
  left=$(shm_left)
  # The swap files have no name from their first moment: none may appear.
  left+=$(ls -A "$tmp/nvme" | sed 's|^| nvme/|' | paste -sd' ')
  if [ -z "$left" ]; then verdict shm ok; else verdict shm fail "left in /dev/shm or the NVMe swap dir: $left"; fi
  if latest_is "$ck" "step$good"; then verdict checkpoint ok; else verdict checkpoint fail "$WHY"; fi
  if resumes_exactly "$dir" "$where" "$tmp/stage$stage.json" "$ck" "$good" "$REF/log.jsonl"; then
    verdict resume ok; else verdict resume fail "$WHY"; fi
}

NCASE=0
# A rank fails as ZERO_FAULT=RANK:POINT:KIND:NTH says.
fault_case() {
  local where=$1 stage=$2 kind=$3 point=$4 rank=$5 nth=$6 nranks=2 host= good args how t_fault ok
  local dir=$tmp/case$((++NCASE))
  if [ "$where" = hosts2 ]; then
    nranks=4
    host=$(host_of "$rank")
  fi
  local desc="$where stage $stage: $kind at $point #$nth on rank $rank${host:+ (host $host)}"
  if [ "$where" = hosts2 ] && [ -z "$HOSTFILE" ]; then case_skipped "$desc" "$HOSTS_WHY"; return; fi
  reference "$where" "$stage" || return
  case_begin "$where stage $stage $kind $point" "$desc"
  mkdir -p "$dir"
  if [ "$point" = load ]; then
    good=4  # resumes from the uninterrupted run's step 4 (its only tag here)
    mkdir -p "$dir/ck"
    cp -r "$REF/ck/step4" "$dir/ck/"
    echo step4 > "$dir/ck/latest"
    args=(--resume "$dir/ck" --steps 6)
  else
    good=$((nth - 1))  # the step before the one that fails (its save, for a save fault)
    args=(--steps 6 --save "$dir/ck" --save-every 1)
  fi
  launcher "$where" 40
  start_job "$dir/fault.out" env ZERO_FAULT="$rank:$point:$kind:$nth" "${LAUNCH[@]}" "$ZT" \
    --config "$tmp/stage$stage.json" "${MODEL[@]}" "${args[@]}"
  finish_job
  t_fault=$(fault_time "$dir/fault.out")
  if [ -z "$t_fault" ]; then
    C_FIRED=0
    t_fault=$JOB_T1
    verdict stopped fail "the fault never fired (exit $JOB_RC)"
  elif [ "$JOB_RC" -eq 0 ]; then
    verdict stopped fail "the job exited 0"
  fi
  case $kind in
    kill) how="was killed by signal Killed" ;;
    exit) how="exited with code 3" ;;
    throw) how="exited with code 1" ;;
  esac
  if [[ $kind = throw && ($point = save || $point = load) ]]; then
    names_agreed "$dir/fault.out" "$rank" "$host" "${point}_checkpoint" "$nranks"
  else
    names_crash "$dir/fault.out" "$rank" "$host" "$how"
  fi
  ok=$?
  if [ $ok -eq 0 ]; then verdict named ok; else verdict named fail "$WHY"; fi
  common_checks "$dir" "$where" "$stage" "$t_fault" 10 "$dir/ck" "$good"
  case_end "gone $GONE_AFTER s after the fault"
}

# A tmpfs with room for one and a half checkpoints: the second save fails.
disk_full_case() {
  local stage=$1 dir=$tmp/case$((++NCASE)) size t_fault
  local desc="host1 stage $stage: the checkpoint disk fills mid-save (the 2nd save)"
  reference host1 "$stage" || return
  mkdir -p "$dir/disk"
  size=$(( $(du -sk "$REF/ck/step4" | cut -f1) * 3 / 2 ))
  if [ "$(id -u)" -ne 0 ] || ! mount -t tmpfs -o size=${size}k tmpfs "$dir/disk" 2>/dev/null; then
    case_skipped "$desc" "cannot mount a tmpfs (needs root)"
    return
  fi
  MOUNTS+=("$dir/disk")
  case_begin "diskfull stage $stage" "$desc"
  launcher host1 40
  start_job "$dir/fault.out" "${LAUNCH[@]}" "$ZT" --config "$tmp/stage$stage.json" "${MODEL[@]}" --steps 6 \
    --save "$dir/disk/ck" --save-every 1
  finish_job
  # The failing save began after step1 was published.
  t_fault=$(date -r "$dir/disk/ck/latest" +%s.%N 2>/dev/null || echo "$JOB_T1")
  [ "$JOB_RC" -ne 0 ] || verdict stopped fail "the job exited 0: the disk never filled"
  if names_disk_full "$dir/fault.out" 2; then verdict named ok; else verdict named fail "$WHY"; fi
  common_checks "$dir" host1 "$stage" "$t_fault" 10 "$dir/disk/ck" 1
  umount -l "$dir/disk"
  case_end "gone $GONE_AFTER s after step 1 was saved"
}

# Host B's end of the link goes down mid-run. The agents' heartbeat notices
# (node 0 hears nothing from host B's zero-run for 5 s) and names host B,
# long before the collective timeout (60 s here, ZERO_COLLECTIVE_TIMEOUT_S:
# a rank timing out first would be named instead): gone within 15 s of the cut.
link_cut_case() {
  local stage=$1 dir=$tmp/case$((++NCASE)) t_cut good logged
  local desc="hosts2 stage $stage: host ${HOST_B}'s link cut mid-run"
  [ -n "$HOSTFILE" ] || { case_skipped "$desc" "$HOSTS_WHY"; return; }
  reference hosts2 "$stage" || return
  case_begin "linkcut stage $stage" "$desc"
  mkdir -p "$dir"
  launcher hosts2 90
  start_job "$dir/fault.out" env ZERO_COLLECTIVE_TIMEOUT_S=60 "${LAUNCH[@]}" "$ZT" --config "$tmp/stage$stage.json" \
    "${MODEL[@]}" --steps 100000 --save "$dir/ck" --save-every 2 --log-json "$dir/fault.jsonl"
  for _ in $(seq 600); do grep -q '"step":5,' "$dir/fault.jsonl" 2>/dev/null && break; sleep 0.1; done
  t_cut=$(now)
  ip -n "$HOST_B" link set zt0 down
  finish_job
  ip -n "$HOST_B" link set zt0 up
  [ "$JOB_RC" -ne 0 ] || verdict stopped fail "the job exited 0"
  if names_cut "$dir/fault.out" "$HOST_B"; then verdict named ok; else verdict named fail "$WHY"; fi
  # The last save rank 0 logged as done; one published after it, whose
  # agreement the cut interrupted, would be as good.
  logged=$(grep '"event":"checkpoint"' "$dir/fault.jsonl" | tail -1 | grep -o '"step":[0-9]*' | cut -d: -f2)
  good=${logged:-0}
  [ "$(cat "$dir/ck/latest" 2>/dev/null)" = "step$((good + 2))" ] && good=$((good + 2))
  # The uninterrupted run, as far as the resumed one goes.
  if [ $((good + 2)) -gt 8 ]; then
    REF=$dir/ref
    mkdir -p "$REF"
    launcher hosts2 120
    start_job "$REF/out" "${LAUNCH[@]}" "$ZT" --config "$tmp/stage$stage.json" "${MODEL[@]}" --steps $((good + 2)) \
      --log-json "$REF/log.jsonl"
    finish_job
  fi
  common_checks "$dir" hosts2 "$stage" "$t_cut" 15 "$dir/ck" "$good"
  case_end "gone $GONE_AFTER s after the cut, the collective timeout 60 s"
}

# A malformed ZERO_FAULT is refused, naming it (a typo must not pass for a run without faults).
out=$(ZERO_FAULT=1:nowhere:kill "$ZT" --config "$tmp/stage0.json" "${MODEL[@]}" --steps 1 2>&1)
rc=$?
check "ZERO_FAULT=1:nowhere:kill is refused" [ $rc -ne 0 ]
check "... naming it" contains "$out" "ZERO_FAULT='1:nowhere:kill' is not <rank>:<point>:<kind>[:<nth>]"
T_FAILED=$((T_FAILED + failures))

plan_cases "$seed"
for c in "${CASES[@]}"; do
  set -- $c
  case $1 in
    host1 | hosts2) fault_case "$@" ;;
    diskfull) disk_full_case "$2" ;;
    linkcut) link_cut_case "$2" ;;
  esac
done
summary "$seed" "$(awk -v a="$t_start" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }')"
