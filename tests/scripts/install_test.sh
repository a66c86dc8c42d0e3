#!/usr/bin/env bash
# The library as users consume it: install to a temporary prefix, build
# examples/minimal as a separate CMake project against the installed package
# (find_package(zero), zero::zero), and run it on 2 ranks with the installed
# zero-run; the same for the README's first code example and for
# examples/finetune and examples/stage3. Usage:
# install_test.sh BUILD_DIR SOURCE_DIR
set -u
. "$(dirname "$0")/lib.sh"
B=$1
SRC=$2
# A fixed place in the build directory, not mktemp's: ccache makes paths
# under its base directory relative, so the examples' compiles (torch
# files, ~20 s each) hit the cache on the next run and in the GPU
# rehearsal's copy of the tree.
tmp=$B/install-test
rm -rf "$tmp" && mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

cmake --install "$B" --prefix "$tmp/prefix" > "$tmp/install.txt" 2>&1
check "cmake --install succeeds" [ $? -eq 0 ]
for f in bin/zero-run bin/zero-train bin/zero-ckpt bin/zero-selfcheck include/zero/engine.h lib/cmake/zero/zeroConfig.cmake; do
  check "installed $f" [ -e "$tmp/prefix/$f" ]
done
check "private headers stay private" [ ! -e "$tmp/prefix/include/zero/grad_reducer.h" ]

cmake_args=()
command -v ccache >/dev/null && cmake_args=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# The build's own generator (Ninja; the GPU machines have no make).
generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$B/CMakeCache.txt")
cmake_args+=(-G "${generator:-Unix Makefiles}")
cmake -S "$SRC/examples/minimal" -B "$tmp/ex" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release \
  "${cmake_args[@]}" > "$tmp/configure.txt" 2>&1
rc=$?
check "the example configures with find_package(zero)" [ $rc -eq 0 ]
[ $rc -eq 0 ] || tail -n 20 "$tmp/configure.txt"
check "with a CUDA toolkit or a CPU libtorch, torch's own package is used" \
  lacks "$(cat "$tmp/configure.txt")" "zero: no CUDA toolkit here"
cmake --build "$tmp/ex" > "$tmp/build.txt" 2>&1
rc=$?
check "the example builds against zero::zero" [ $rc -eq 0 ]
[ $rc -eq 0 ] || tail -n 20 "$tmp/build.txt"
# A user's program linked through find_package(zero) binds its std:: calls
# to libstdc++, not to the torch wheel's copies (issue 36 item 1).
check "a program linked through zero::zero binds no std:: call to torch" \
  "$SRC/tests/scripts/std_bindings.sh" "$tmp/ex/minimal"
out=$("$tmp/prefix/bin/zero-run" -n 2 --timeout 120 -- "$tmp/ex/minimal" "$SRC/examples/minimal/ds_config.json" 2>&1)
rc=$?
check "the example trains on 2 ranks (stage 3) and its loss falls" [ $rc -eq 0 ]
check "the example ran stage 3 with its units" contains "$out" "ZeRO stage 3"
echo "$out" | grep "loss" | tail -2

# A project on a machine with a CUDA libtorch (the default wheel) but no CUDA
# toolkit: torch's own CMake package stops there, so zeroConfig.cmake stands
# in for it (the `torch` target from the libraries alone). Rehearsed by
# hiding this machine's toolkit under an empty tmpfs in a mount namespace of
# its own; the example then configures, builds and trains on 2 ranks.
nvcc=$(sed -n 's/^CMAKE_CUDA_COMPILER:FILEPATH=//p' "$B/CMakeCache.txt")
toolkit=""
[ -n "$nvcc" ] && [ -x "$nvcc" ] && toolkit=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
if [ -z "$toolkit" ] || [ ! -e "$tmp/prefix/lib/libzero_cuda.a" ]; then
  echo "skip a project without the CUDA toolkit: zero-cpp was built without CUDA"
elif [ "$(id -u)" -ne 0 ] || ! unshare -m --propagation private true 2>/dev/null; then
  echo "skip a project without the CUDA toolkit: hiding it needs root and unshare -m"
else
  out=$(unshare -m --propagation private bash -c '
    mount -t tmpfs no-cuda-toolkit "$1" || exit 90
    unset CUDA_HOME CUDA_PATH CUDACXX
    cmake -S "$2/examples/minimal" -B "$3/no-toolkit" -DCMAKE_PREFIX_PATH="$3/prefix" "${@:5}" 2>&1 || exit 91
    cmake --build "$3/no-toolkit" 2>&1 || exit 92
    "$3/prefix/bin/zero-run" -n 2 --timeout 120 -- "$3/no-toolkit/minimal" "$4" 2>&1 || exit 93
    # find_package(zero) twice in one project (a subdirectory, a package
    # depending on zero): the second finds the first one`s targets.
    mkdir -p "$3/twice" && printf "%s\n" "cmake_minimum_required(VERSION 3.18)" "project(twice CXX)" \
      "find_package(zero REQUIRED)" "find_package(zero REQUIRED)" > "$3/twice/CMakeLists.txt"
    cmake -S "$3/twice" -B "$3/twice/build" -DCMAKE_PREFIX_PATH="$3/prefix" "${@:5}" 2>&1 || exit 94
  ' hide "$toolkit" "$SRC" "$tmp" "$SRC/examples/minimal/ds_config.json" "${cmake_args[@]}")
  rc=$?
  check "no CUDA toolkit ($toolkit hidden): find_package(zero) makes torch's target itself" \
    contains "$out" "zero: no CUDA toolkit here"
  check "no CUDA toolkit: the example configures, builds and trains on 2 ranks, and a project finds zero twice (rc $rc)" \
    [ $rc -eq 0 ]
  check "no CUDA toolkit: the example ran stage 3 with its units" contains "$out" "ZeRO stage 3"
  [ $rc -eq 0 ] || tail -n 20 <<<"$out"
fi

# The README's first example ("Training your model") as written: the first
# ```cpp block of that section must be examples/stock/main.cpp, which is
# built against the installed package and run on 2 ranks at stage 2 in fp32
# and at stage 3 in bf16 (stock modules, no code change), so the example
# cannot drift from the API.
mkdir -p "$tmp/readme"
awk '/^## Training your model/ { in_section = 1 } in_section && /^```cpp$/ { copying = 1; next }
     copying && /^```$/ { exit } copying' "$SRC/README.md" > "$tmp/readme/train.cpp"
check "README example extracted" grep -q "zero::Engine engine" "$tmp/readme/train.cpp"
check "README example is examples/stock/main.cpp" diff -q "$tmp/readme/train.cpp" "$SRC/examples/stock/main.cpp"
cmake -S "$SRC/examples/stock" -B "$tmp/readme/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release \
  "${cmake_args[@]}" > "$tmp/readme/configure.txt" 2>&1 && cmake --build "$tmp/readme/build" > "$tmp/readme/build.txt" 2>&1
rc=$?
check "README example compiles against the installed package" [ $rc -eq 0 ]
[ $rc -eq 0 ] || tail -n 20 "$tmp/readme/configure.txt" "$tmp/readme/build.txt"
loss() { grep -o "\[rank 0\] step $1 loss [0-9.]*" <<<"$out" | awk '{ print $NF }'; }
for cfg in ds_config.json ds_config_bf16_stage3.json; do
  out=$("$tmp/prefix/bin/zero-run" -n 2 --timeout 120 -- "$tmp/readme/build/train" "$SRC/examples/stock/$cfg" 2>&1)
  rc=$?
  check "README example runs on 2 ranks ($cfg)" [ $rc -eq 0 ]
  [ $rc -eq 0 ] || echo "$out" | tail -5
  first=$(loss 0); last=$(loss 19)
  check "README example trains ($cfg): loss $first -> $last falls" awk -v a="$first" -v b="$last" 'BEGIN { exit !(a != "" && b != "" && b < a) }'
done

# examples/finetune and examples/stage3, configured with no build type: their
# CMakeLists make it Release (a copied project compiles optimised).
build_example() {  # name
  cmake -S "$SRC/examples/$1" -B "$tmp/$1" -DCMAKE_PREFIX_PATH="$tmp/prefix" "${cmake_args[@]}" \
    > "$tmp/$1-configure.txt" 2>&1 && cmake --build "$tmp/$1" > "$tmp/$1-build.txt" 2>&1
  local rc=$?
  check "examples/$1 builds against the installed package" [ $rc -eq 0 ]
  [ $rc -eq 0 ] || tail -n 20 "$tmp/$1-configure.txt" "$tmp/$1-build.txt"
  check "examples/$1: Release when no build type is given" grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$tmp/$1/CMakeCache.txt"
}
build_example finetune
# Frozen backbone and param groups, 10 steps, then resumed from the
# checkpoint to 20; consolidated; the plain model loads the weights
# (zero::load_weights) and gets training's held-out loss to the last digit.
ckpt=$tmp/finetune-ckpt
out=$("$tmp/prefix/bin/zero-run" -n 2 --timeout 120 -- "$tmp/finetune/finetune" train "$SRC/examples/finetune/ds_config.json" \
  "$ckpt" --steps 10 2>&1)
check "finetune: 10 steps on 2 ranks" [ $? -eq 0 ]
out=$("$tmp/prefix/bin/zero-run" -n 2 --timeout 120 -- "$tmp/finetune/finetune" train "$SRC/examples/finetune/ds_config.json" \
  "$ckpt" --steps 20 2>&1)
check "finetune: resumed to 20 steps" [ $? -eq 0 ]
check "finetune: resumed at step 10" contains "$out" "resumed from $ckpt at step 10"
echo "$out" | grep "loss" | tail -3
trained=$(grep -o 'held-out loss [0-9.]*' <<<"$out" | awk '{ print $NF }')
"$tmp/prefix/bin/zero-ckpt" consolidate "$ckpt" "$tmp/finetune.safetensors" > "$tmp/consolidate.txt" 2>&1
check "finetune: zero-ckpt consolidate" [ $? -eq 0 ]
out=$("$tmp/finetune/finetune" infer "$tmp/finetune.safetensors" 2>&1)
check "finetune: inference from the consolidated weights ($out)" [ $? -eq 0 ]
inferred=$(grep -o 'held-out loss [0-9.]*' <<<"$out" | awk '{ print $NF }')
check "finetune: inference's held-out loss is training's ($inferred vs $trained)" [ -n "$trained" -a "$inferred" = "$trained" ]

build_example stage3
out=$("$tmp/prefix/bin/zero-run" -n 2 --timeout 120 -- "$tmp/stage3/stage3" "$SRC/examples/stage3/ds_config.json" \
  "$tmp/stage3.safetensors" 2>&1)
check "stage3: trains on 2 ranks, held-out loss falls" [ $? -eq 0 ]
echo "$out" | grep "loss" | tail -2
check "stage3: ran ZeRO stage 3 with its units" contains "$out" "ZeRO stage 3"
check "stage3: a gathered weight is whole" contains "$out" "h0.up.weight: [256, 64]"
after=$(grep -o 'held-out loss [0-9.]* -> [0-9.]*' <<<"$out" | awk '{ print $NF }')
plain=$(grep -o 'plain model from .*: held-out loss [0-9.]*' <<<"$out" | awk '{ print $NF }')
check "stage3: the saved weights give the plain model the same loss ($plain vs $after)" [ -n "$after" -a "$plain" = "$after" ]
finish
