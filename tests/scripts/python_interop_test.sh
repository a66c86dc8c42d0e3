#!/usr/bin/env bash
# Issue 35 item 4: a checkpoint saved from Python loads from C++ and back,
# by the same param names, at another world size and stage, and zero-ckpt
# consolidate reads it. The model is the bundled GPT (zero-train) and its
# Python twin (tests/python/interop_gpt.py).
#   python_interop_test.sh ZERO_RUN ZERO_TRAIN ZERO_CKPT PYTHON BUILD_PYTHON_DIR
set -uo pipefail
zero_run=$1 zero_train=$2 zero_ckpt=$3 python=$4 pkg=$5
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PYTHONPATH=$pkg OMP_NUM_THREADS=1
model=(--layers 2 --d-model 64 --heads 4 --seq 32)
config() {  # STAGE
  printf '{"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0, "steps_per_print": 100,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.01}},
    "zero_optimization": {"stage": %s, "stage3_param_persistence_threshold": 0}}' "$1" > "$tmp/stage$1.json"
  echo "$tmp/stage$1.json"
}
same_weights() {  # A.safetensors B.safetensors: every tensor equal, by name (read here with torch alone)
  "$python" - "$1" "$2" <<'PY'
import json, struct, sys
import torch

def read(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (name, e["dtype"])
        b, end = e["data_offsets"]
        out[name] = torch.frombuffer(bytearray(blob[8 + n + b:8 + n + end]), dtype=torch.float32).reshape(e["shape"])
    return out

a, b = read(sys.argv[1]), read(sys.argv[2])
assert sorted(a) == sorted(b), f"names differ: {sorted(set(a) ^ set(b))}"
assert all(torch.equal(a[k], b[k]) for k in a), "weights differ: " + ", ".join(k for k in a if not torch.equal(a[k], b[k]))
print(f"{len(a)} tensors equal")
PY
}

# C++ -> Python: zero-train saves at stage 3 on 2 ranks; the Python twin
# loads it at stage 1 on 1 rank; its consolidated weights are zero-ckpt's.
out=$("$zero_run" -n 2 --timeout 300 -- "$zero_train" --config "$(config 3)" --steps 3 "${model[@]}" \
  --save "$tmp/from_cpp" 2>&1)
check "zero-train saves a stage-3 checkpoint on 2 ranks" [ $? -eq 0 ]
"$zero_ckpt" consolidate "$tmp/from_cpp" "$tmp/cpp_weights.safetensors" > /dev/null 2>&1
out=$("$zero_run" -n 1 --timeout 300 -- "$python" "$here/python/interop_gpt.py" load "$tmp/from_cpp" 1 \
  "$tmp/py_loaded.safetensors" 2>&1)
rc=$?
check "Python loads it at stage 1 on 1 rank, its client state and step count too" [ $rc -eq 0 ]
[ $rc -eq 0 ] || tail -n 15 <<<"$out"
out=$(same_weights "$tmp/cpp_weights.safetensors" "$tmp/py_loaded.safetensors" 2>&1)
check "the weights Python loaded are zero-ckpt consolidate's, name for name ($out)" [ $? -eq 0 ]

# Python -> C++: the twin saves at stage 3 on 2 ranks; zero-ckpt reads it,
# and zero-train resumes from it at stage 2 on 1 rank.
out=$("$zero_run" -n 2 --timeout 300 -- "$python" "$here/python/interop_gpt.py" save "$tmp/from_py" 3 \
  "$tmp/py_weights.safetensors" 2>&1)
rc=$?
check "Python saves a stage-3 checkpoint on 2 ranks" [ $rc -eq 0 ]
[ $rc -eq 0 ] || tail -n 15 <<<"$out"
check "zero-ckpt info reads its manifest (checked and hashed)" "$zero_ckpt" info "$tmp/from_py"
"$zero_ckpt" consolidate "$tmp/from_py" "$tmp/py_ckpt.safetensors" > /dev/null 2>&1
out=$(same_weights "$tmp/py_weights.safetensors" "$tmp/py_ckpt.safetensors" 2>&1)
check "zero-ckpt consolidate gives the weights Python held ($out)" [ $? -eq 0 ]
out=$("$zero_run" -n 1 --timeout 300 -- "$zero_train" --config "$(config 2)" --steps 5 "${model[@]}" \
  --resume "$tmp/from_py" 2>&1)
rc=$?
check "zero-train resumes from it at stage 2 on 1 rank" [ $rc -eq 0 ]
[ $rc -eq 0 ] || tail -n 15 <<<"$out"
finish
