#!/usr/bin/env bash
# Issue 35 item 6: the same Python training script under DeepSpeed 0.19.8
# and under zero_cpp, the import the only difference, compared step by step
# at stages 0-3 on 2 ranks (tests/python/parity_train.py: accumulation,
# clipping, WarmupLR, a frozen layer, a tied embedding and head, a buffer,
# save -> a fresh engine -> load -> continue, bf16, several backward calls
# per step under coalesce_grad_reduction with its reduce-scatters counted,
# the wandb and comet monitors' client calls through recording stand-ins).
#   python_parity_test.sh ZERO_RUN PYTHON BUILD_PYTHON_DIR
set -uo pipefail
zero_run=$1 python=$2 pkg=$3
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "$python" -c "import deepspeed" 2>/dev/null; then
  echo "FAIL DeepSpeed is not importable by $python (./run test installs deepspeed==0.19.8 into the torch environment)"
  exit 1
fi
run() {  # FRONTEND OUT
  # PYTHONFAULTHANDLER: a rank that dies by a signal prints its Python stack.
  ZERO_FRONTEND=$1 PYTHONPATH=$pkg OMP_NUM_THREADS=1 PYTHONFAULTHANDLER=1 "$zero_run" -n 2 --timeout 600 -- \
    "$python" "$here/python/parity_train.py" "$tmp/$1.json" "$tmp/ckpt-$1" > "$tmp/$1.log" 2>&1
  local rc=$?
  # DeepSpeed is the oracle here: its run died, under CI's load, by
  # "terminate called without an active exception" (SIGABRT) at exit, in a
  # process that runs no zero-cpp code -- torch's teardown of a Gloo group
  # left up (pytorch/pytorch#190489), which parity_train.py now destroys.
  # Should the oracle still die by a signal, that is shown and it runs once
  # more; any failure of zero_cpp's run fails the test.
  if [ "$1" = deepspeed ] && [ $rc -gt 128 ] && [ -z "${retried:-}" ]; then
    retried=1
    echo "note: the deepspeed run died by signal $((rc - 128)); its last lines, then a second run:"
    grep -v -e '^\[rank [0-9]*\] \[zero-cpp\]' -e 'get_lr\]' "$tmp/$1.log" | tail -n 30
    rm -rf "$tmp/ckpt-$1"
    run "$@"
    return
  fi
  if [ $rc -ne 0 ]; then
    echo "FAIL the $1 run exited with $rc; its last lines:"
    grep -v '^\[rank [0-9]*\] \[zero-cpp\]' "$tmp/$1.log" | tail -n 25
    exit 1
  fi
}
run deepspeed
run zero_cpp
"$python" "$here/python/compare_parity.py" "$tmp/zero_cpp.json" "$tmp/deepspeed.json"
