#!/usr/bin/env bash
# Issue 36 item 6: the largest GPT one GPU trains, with the optimizer's
# state in RAM (ZeRO-Offload: stage 2, offload_optimizer cpu, bf16). What
# bounds it, per param: the host holds the fp32 master, Adam's two moments
# and the fp32 grads the host update reads (16 bytes, pinned), the GPU the
# bf16 params and grads (4 bytes) plus activations. ZeRO-Infinity's NVMe
# would move the 12 bytes of optimizer state to disk; on a machine whose
# disk is smaller than its RAM (the lent ones: 64 GiB against 128) it
# cannot go further, and this script says so rather than run it.
#
# Tries the largest shape the formula allows, then smaller ones, each one
# bounded in time, until one trains ZERO_LARGEST_STEPS steps; prints one
# JSON object: every attempt, and the largest that trained with its
# tokens/s, TFLOP/s (6N + 12·L·d·T FLOP a token), build time, peak GPU
# memory and RSS.
#   bench/largest.sh BUILD_DIR [SECS]      (SECS: the whole budget [540])
# Environment: ZERO_LARGEST_DEVICE cuda | cpu (the plumbing check) [cuda];
# ZERO_LARGEST_GPU_GIB, _RAM_GIB, _DISK_GIB (override what is measured);
# ZERO_LARGEST_STEPS [4]; ZERO_LARGEST_SEQ [1024]; ZERO_LARGEST_MICRO [4];
# ZERO_LARGEST_WIDTHS, the d_model values tried ["2048 3072 4096 5120 6144 8192"].
# STATUS: plumbing run on the CPU only (tiny sizes); not yet run on a GPU.
set -uo pipefail
B=${1:?usage: bench/largest.sh BUILD_DIR [SECS]}
BUDGET=${2:-540}
DEVICE=${ZERO_LARGEST_DEVICE:-cuda}
STEPS=${ZERO_LARGEST_STEPS:-4}
SEQ=${ZERO_LARGEST_SEQ:-1024}
MICRO=${ZERO_LARGEST_MICRO:-4}
start=$SECONDS
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

gib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 2^30 }'; }
gpu_gib=${ZERO_LARGEST_GPU_GIB:-$( { nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null |
  head -n 1 | awk '{ printf "%.1f", $1 / 1024 }'; } || true)}
[ -n "$gpu_gib" ] || gpu_gib=0
ram_gib=${ZERO_LARGEST_RAM_GIB:-$(gib "$(awk '/MemTotal/ { print $2 * 1024 }' /proc/meminfo)")}
disk_gib=${ZERO_LARGEST_DISK_GIB:-$(gib "$(df -B1 --output=avail "$tmp" | tail -n 1)")}

# The shapes to try, largest first: the width whose deepest stack (at most
# 64 layers, a GPT's usual depth at these sizes) holds the most params
# within what the host (16 bytes a param, 75% of RAM: pinned, beside the
# process's own) and the GPU (4 bytes, 70%: the rest for activations; no
# bound on the CPU) allow, then that width at 3/4, 1/2 and 3/10 of it, in
# case the first does not fit after all; heads of 128.
python3 - "$gpu_gib" "$ram_gib" "$DEVICE" "${ZERO_LARGEST_WIDTHS:-2048 3072 4096 5120 6144 8192}" > "$tmp/shapes" <<'PY'
import sys
gpu, ram, device, widths = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4].split()
limit = 0.75 * ram * 2**30 / 16
if device != "cpu":
    limit = min(limit, 0.70 * gpu * 2**30 / 4)
best = max(((min(64, int(limit // (12 * d * d))) * 12 * d * d, d) for d in map(int, widths)), default=(0, 0))
params, d = best
for f in (1.0, 0.75, 0.5, 0.3):
    layers = int(f * params // (12 * d * d))
    if layers >= 1:
        print(layers, d, max(1, d // 128), 12 * layers * d * d)
PY

cat > "$tmp/c.json" <<JSON
{ "train_micro_batch_size_per_gpu": $MICRO, "gradient_clipping": 1.0, "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
  "wall_clock_breakdown": true,
  "zero_optimization": {"stage": 2, "overlap_comm": true, "contiguous_gradients": true,
                        "offload_optimizer": {"device": "cpu", "pin_memory": true}} }
JSON

attempts=$tmp/attempts.jsonl
: > "$attempts"
while read -r layers d heads params; do
  left=$((BUDGET - (SECONDS - start)))
  if ((left < 30)); then
    echo "{\"layers\": $layers, \"d_model\": $d, \"params\": $params, \"skipped\": \"budget spent\"}" >> "$attempts"
    continue
  fi
  log=$tmp/run-$layers-$d
  rc=0
  timeout -k 10 "$left" "$B/zero-run" -n 1 -- "$B/zero-train" --config "$tmp/c.json" --device "$DEVICE" \
    --layers "$layers" --d-model "$d" --heads "$heads" --seq "$SEQ" --steps "$STEPS" --log-json "$log.jsonl" \
    < /dev/null > "$log.log" 2>&1 || rc=$?
  python3 - "$log.jsonl" "$layers" "$d" "$SEQ" "$MICRO" "$params" "$rc" "$(tail -n 1 "$log.log" | cut -c1-300)" \
    >> "$attempts" <<'PY'
import json, statistics, sys
path, layers, d, seq, micro, params, rc, last = sys.argv[1:9]
layers, d, seq, micro, params, rc = int(layers), int(d), int(seq), int(micro), int(params), int(rc)
out = {"layers": layers, "d_model": d, "params": params, "rc": rc}
try:
    records = [json.loads(l) for l in open(path)]
except OSError:
    records = []
setup = next((r for r in records if r.get("event") == "setup"), {})
steps = [r for r in records if r.get("event") == "step"]
summary = next((r for r in records if r.get("event") == "summary"), {})
if rc == 0 and steps:
    timed = steps[2:] or steps
    wall = statistics.median(r.get("wall_ms") or r["step_ms"] for r in timed)
    tokens = micro * seq / (wall / 1000)
    flop = 6 * setup.get("n_params", params) + 12 * layers * d * seq
    out.update({"n_params": setup.get("n_params"), "build_s": round(setup.get("build_ms", 0) / 1000, 1),
                "step_ms": round(wall, 1), "tokens_per_s": round(tokens), "tflops": round(tokens * flop / 1e12, 1),
                "peak_gpu_bytes": summary.get("peak_gpu_bytes"), "peak_rss_bytes": summary.get("peak_rss_bytes"),
                "times_ms": timed[-1].get("times_ms")})
else:
    out["error"] = (("stopped by the budget" if rc in (124, 137) else f"exit {rc}") + f": {last}")
print(json.dumps(out))
PY
  tail -n 1 "$attempts" | grep -q '"tokens_per_s"' && break
done < "$tmp/shapes"

python3 - "$attempts" "$DEVICE" "$gpu_gib" "$ram_gib" "$disk_gib" "$SEQ" "$MICRO" "$((SECONDS - start))" <<'PY'
import json, sys
path, device, gpu, ram, disk, seq, micro, elapsed = sys.argv[1:9]
attempts = [json.loads(l) for l in open(path)]
trained = next((a for a in attempts if "tokens_per_s" in a), None)
print(json.dumps({
    "bench": "largest", "device": device, "gpu_gib": float(gpu), "ram_gib": float(ram), "disk_gib": float(disk),
    "config": "stage 2, offload_optimizer cpu (pinned), bf16", "seq": int(seq), "micro_batch": int(micro),
    "nvme": ("not tried: the disk (%s GiB) is smaller than RAM (%s GiB), so the optimizer state on NVMe bounds "
             "the model lower than RAM does" % (disk, ram)) if float(disk) < float(ram) else
            "not tried yet (RAM-bounded shapes first)",
    "largest": trained, "attempts": attempts, "elapsed_s": int(elapsed)}, indent=1))
PY
