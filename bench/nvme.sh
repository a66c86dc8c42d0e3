#!/usr/bin/env bash
# ZeRO-Infinity's optimizer offload (offload_optimizer.device "nvme") against
# the same run with the state in memory: step time, peak RSS and the state
# in memory / on disk per rank, for a GPT at stage 3 (bf16, AdamW) on 2
# local ranks; and the disk's direct-I/O bandwidth measured in the same run
# (fio, io_uring, 1 MiB blocks, queue depth 8: the aio block's defaults), so
# the NVMe step can be set against its I/O bound:
#   bytes moved per step = 2 ranks x (read + write) x 12 bytes x params / 2.
# Prints one JSON object.
#   bench/nvme.sh BUILD_DIR [STEPS] [NVME_DIR]
# ZERO_BENCH_MODEL="--layers L --d-model D --heads H --seq S" picks the model
# (default: the ~101M GPT of bench/stages.sh).
set -euo pipefail
B=${1:-build}
STEPS=${2:-6}
DIR=${3:-/tmp}

. "$(dirname "$0")/lib.sh"
swap="$DIR/zero-bench-nvme.$$"
mkdir -p "$swap"
trap 'rm -rf "$tmp" "$swap"' EXIT

read -r -a model_args <<<"${ZERO_BENCH_MODEL:---layers 8 --d-model 1024 --heads 16 --seq 128}"

config() {  # offload: none | nvme | nvme-pipelined
  bench_config 3 bf16
  local off=""
  case $1 in
    nvme) off='"offload_optimizer": {"device": "nvme", "nvme_path": "'"$swap"'"},' ;;
    nvme-pipelined) off='"offload_optimizer": {"device": "nvme", "nvme_path": "'"$swap"'", "pipeline_read": true, "pipeline_write": true},' ;;
  esac
  sed -i "s|\"zero_optimization\": {|\"zero_optimization\": {$off |" "$tmp/c.json"
}

echo '{"bench": "nvme", "ranks": 2, "stage": 3, "dtype": "bf16", "date": "'"$(date -u +%F)"'",'
echo ' "model": "'"${model_args[*]}"'", "nvme_path_fs": "'"$(stat -f -c %T "$swap")"'",'
echo ' "disk_read_gbps": '"$(disk_gbps "$swap" read 1G)"', "disk_write_gbps": '"$(disk_gbps "$swap" write 1G)"','
echo ' "runs": ['
first=1
for run in none nvme nvme-pipelined none; do  # in memory first and last: the machine's drift shows
  config $run
  [ $first = 1 ] || echo ','
  first=0
  printf '  {"offload": "%s", "summary": %s, "losses": %s}' "$run" \
    "$(zero_train_summary --steps "$STEPS" "${model_args[@]}")" "$(last_losses)"
done
echo
echo ']}'
