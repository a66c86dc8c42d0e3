#!/usr/bin/env bash
# Where the CPU time of a training step goes (issue 34: "where a goal is not
# met, a profile says where the time goes"): `perf record` (sampling every
# process of the job, after its first steps) of zero-cpp at stages 0 and 3
# and of PyTorch DDP on one GPT, each run's samples sorted into a few
# buckets by the symbol and library they fell in. Prints one JSON object:
# per case, each bucket's share of the samples.
#   bench/profile.sh BUILD_DIR PYTHON [small|big] [STEPS] [SKIP_MS]
# ZERO_BENCH_RANKS ranks (2) of one thread; recording starts SKIP_MS after
# launch (default: 20000 for big, 6000 for small: past start-up and the
# first steps), so the samples are the steady steps.
set -euo pipefail
B=${1:-build}
PY=${2:?the python of the torch environment}
MODEL=${3:-big}
STEPS=${4:-12}
RANKS=${ZERO_BENCH_RANKS:-2}
SKIP=${5:-$([ "$MODEL" = big ] && echo 20000 || echo 6000)}
command -v perf >/dev/null || { echo "profile.sh: perf is not installed (Debian: linux-perf)" >&2; exit 1; }
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
bench_model "$MODEL"
L=${model_args[1]} D=${model_args[3]} H=${model_args[5]} S=${model_args[7]}
"$B/bench/bench_export_gpt" "$tmp" "$L" "$D" "$H" "$S" $((4 * RANKS)) "$STEPS" > /dev/null

record() {  # NAME STAGE COMMAND...: perf data in $tmp/NAME.data
  local name=$1 stage=$2
  shift 2
  bench_config "$stage" fp32
  perf record -q -F 199 -D "$SKIP" -o "$tmp/$name.data" -- "$@" > "$tmp/$name.out" 2>&1 ||
    { cat "$tmp/$name.out" >&2; exit 1; }
}
record zero_stage0 0 "$B/zero-run" -n "$RANKS" -- "$B/zero-train" --config "$tmp/c.json" --steps "$STEPS" "${model_args[@]}"
record zero_stage3 3 "$B/zero-run" -n "$RANKS" -- "$B/zero-train" --config "$tmp/c.json" --steps "$STEPS" "${model_args[@]}"
record ddp 0 env DS_ACCELERATOR=cpu "$B/zero-run" -n "$RANKS" -- "$PY" "$here/peer_gpt.py" ddp "$tmp" \
  "$L" "$D" "$H" "$S" "$STEPS" "$tmp/c.json" "$tmp/peer.json"

for name in zero_stage0 zero_stage3 ddp; do
  perf report -i "$tmp/$name.data" --no-children --sort dso,sym --stdio -q -g none 2>/dev/null > "$tmp/$name.txt"
done
python3 - "$tmp" "$MODEL" "$RANKS" "$STEPS" <<'PY'
import json, re, sys
tmp, model, ranks, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
# First match wins; each pattern is tried against "library symbol".
BUCKETS = [
    ("gemm (MKL/oneDNN)", r"libmkl|mkl_blas|sgemm|gemm|dnnl|brgemm|jit_avx"),
    ("optimizer kernels", r"zero::optim|adamw|Adam|fused_adam|_foreach_|lerp"),
    ("copies (memcpy, memset)", r"memmove|memcpy|memset|copy_kernel|copy_impl"),
    ("shared-memory collectives", r"zero::comm|reduce_kernels|lane"),
    ("Gloo", r"gloo"),
    ("page faults, page clearing", r"clear_page|page_fault|do_anonymous_page|handle_mm_fault|_raw_spin|zap_|free_pages|"
                                   r"release_pages|lru|folio|memcg|__alloc_pages|get_page_from_freelist|rmqueue"),
    ("waiting (scheduler, futex, yield)", r"sched|futex|yield|schedule|finish_task_switch|pick_next|do_idle|"
                                         r"cpuidle|poll_idle|native_safe_halt|switch_to|hrtimer|tick_"),
    ("Python interpreter", r"libpython|python3"),
    ("autograd and dispatch", r"torch::autograd|c10::Dispatcher|c10::impl|at::_ops|OperatorHandle|boxed|intrusive_ptr|"
                              r"TensorImpl|c10::detail|VariableType|ADInplaceOrView"),
    ("other torch ops (elementwise, softmax, layer norm)", r"libtorch_cpu|at::native|at::vec|vectorized|cpu_kernel"),
    ("other kernel", r"\[kernel|\[k\]"),
]
def share(path):
    totals, other = {}, 0.0
    for line in open(path):
        m = re.match(r"\s*([0-9.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)", line)
        if not m:
            continue
        pct, dso, kind, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4)
        text = f"{dso} {sym}" + (" [k]" if kind == "k" else "")
        for name, pattern in BUCKETS:
            if re.search(pattern, text, re.I):
                totals[name] = totals.get(name, 0.0) + pct
                break
        else:
            other += pct
    totals["other"] = other
    return {k: round(v, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}
def top(path, n=8):
    rows = []
    for line in open(path):
        m = re.match(r"\s*([0-9.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)", line)
        if m and len(rows) < n:
            rows.append(f"{m.group(1)}% {m.group(2)} {m.group(4)[:90]}")
    return rows
cases = {name: {"buckets_percent": share(f"{tmp}/{name}.txt"), "top_symbols": top(f"{tmp}/{name}.txt")}
         for name in ("zero_stage0", "zero_stage3", "ddp")}
print(json.dumps({"bench": "profile", "model": model, "ranks": ranks, "steps": steps, "cases": cases}, indent=1))
PY
