#!/usr/bin/env bash
# Issue 35 item 1: `pip install .` as a Python user runs it, with build
# isolation, against the torch of the Python running pip; the installed
# package (extension, zero-run and zero-ckpt console scripts) then trains on
# 2 ranks from a directory that holds nothing else. The CMake build goes to
# SRC/build-pip, beside ./build, so the compiler cache serves it.
#   python_install_test.sh PYTHON SRC
set -uo pipefail
python=$1 src=$2
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export CCACHE_BASEDIR=$src
install() {
  ZERO_CPP_CMAKE_BUILD_DIR=${ZERO_CPP_CMAKE_BUILD_DIR:-$src/build-pip} \
    "$python" -m pip install --disable-pip-version-check --no-deps --target "$tmp/site" "$@" "$src" > "$tmp/pip.log" 2>&1
}
install
rc=$?
how="with build isolation"
if [ $rc -ne 0 ] && grep -q "No matching distribution found for setuptools" "$tmp/pip.log"; then
  # Offline (a GPU machine, its rehearsal): pip cannot fetch the build's
  # setuptools; this python's own serves, where it has one.
  if ! "$python" -c "import setuptools, wheel" 2>/dev/null; then
    echo "skipped: offline, and $python has no setuptools and wheel to build with"
    exit 77
  fi
  how="offline: --no-build-isolation, this python's setuptools"
  install --no-build-isolation
  rc=$?
fi
check "pip install . builds and installs zero-cpp ($how)" [ $rc -eq 0 ]
[ $rc -eq 0 ] || tail -n 30 "$tmp/pip.log"
check "the extension is installed" ls "$tmp"/site/zero_cpp/_C*.so
check "zero-run and zero-ckpt are console scripts" [ -x "$tmp/site/bin/zero-run" ] && [ -x "$tmp/site/bin/zero-ckpt" ]
# The install's modules are exactly the source tree's: none missing, and none
# a stale copy of a module since removed (setuptools' build directory keeps
# what it copied before; setup.py clears it).
modules() { (cd "$1" && find zero_cpp -name '*.py' ! -name _build_info.py | sort); }
differ=$(diff <(modules "$src/python") <(modules "$tmp/site") | sed -n 's/^[<>] //p')
check "the installed modules are the source tree's ($(modules "$src/python" | wc -l) files)${differ:+; differ: $(echo $differ)}" \
  [ -z "$differ" ]
cat > "$tmp/train.py" <<'PY'
import torch
import zero_cpp as deepspeed
print("from", deepspeed.__file__)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
cfg = {"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
       "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
for step in range(40):
    torch.manual_seed(step * engine.world_size + engine.global_rank)
    x = torch.randn(8, 8)
    loss = (engine(x) - x.sum(1, keepdim=True)).pow(2).mean()
    engine.backward(loss)
    engine.step()
    if step in (0, 39) and engine.global_rank == 0:
        print(f"step {step} loss {loss.item():.4f}")
PY
out=$(cd "$tmp" && PYTHONPATH="$tmp/site" "$tmp/site/bin/zero-run" -n 2 --timeout 120 -- "$python" train.py 2>&1)
rc=$?
check "the installed package trains on 2 ranks through its zero-run" [ $rc -eq 0 ]
check "zero_cpp came from the install" contains "$out" "from $tmp/site/zero_cpp/__init__.py"
first=$(sed -n 's/.*step 0 loss \([0-9.]*\).*/\1/p' <<<"$out" | head -n 1)
last=$(sed -n 's/.*step 39 loss \([0-9.]*\).*/\1/p' <<<"$out" | head -n 1)
check "its loss falls ($first -> $last)" awk -v a="$first" -v b="$last" 'BEGIN { exit !(a != "" && b != "" && b < a / 4) }'
[ $rc -eq 0 ] || tail -n 20 <<<"$out"
finish
