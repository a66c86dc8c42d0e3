#!/usr/bin/env bash
# The library as users consume it: install to a temporary prefix, build
# examples/minimal as a separate CMake project against the installed package
# (find_package(zero), zero::zero), and run it on 2 ranks with the installed
# zero-run. Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -u
. "$(dirname "$0")/lib.sh"
B=$1
SRC=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$B" --prefix "$tmp/prefix" > "$tmp/install.txt" 2>&1
check "cmake --install succeeds" [ $? -eq 0 ]
for f in bin/zero-run bin/zero-train bin/zero-ckpt include/zero/engine.h lib/cmake/zero/zeroConfig.cmake; do
  check "installed $f" [ -e "$tmp/prefix/$f" ]
done
check "private headers stay private" [ ! -e "$tmp/prefix/include/zero/grad_reducer.h" ]

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$SRC/examples/minimal" -B "$tmp/ex" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release \
  "${launcher[@]}" > "$tmp/configure.txt" 2>&1
rc=$?
check "the example configures with find_package(zero)" [ $rc -eq 0 ]
[ $rc -eq 0 ] || tail -20 "$tmp/configure.txt"
cmake --build "$tmp/ex" > "$tmp/build.txt" 2>&1
rc=$?
check "the example builds against zero::zero" [ $rc -eq 0 ]
[ $rc -eq 0 ] || tail -20 "$tmp/build.txt"
out=$("$tmp/prefix/bin/zero-run" -n 2 --timeout 120 -- "$tmp/ex/minimal" "$SRC/examples/minimal/ds_config.json" 2>&1)
rc=$?
check "the example trains on 2 ranks (stage 3) and its loss falls" [ $rc -eq 0 ]
check "the example ran stage 3 with its units" contains "$out" "ZeRO stage 3"
echo "$out" | grep "loss" | tail -2
finish
