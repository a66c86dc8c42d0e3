#!/usr/bin/env bash
# One GPU lease, used whole: a lease is 15 minutes of device time, and one
# command at most 10, so the GPU suites and the GPU bench run in one command
# on binaries built here and carried (a bare build there alone takes most of
# the lease). The bare machine's own build (`./run gpu-build`, what
# `./run gpu-test` builds) is tried beside the suites for a bounded time,
# so that path is exercised too; CI rehearses it in full
# (tests/scripts/gpu_offline_test.sh).
#   bench/gpu_lease.sh pack             here: build the binaries, copy them to .gpubin/
#                                       (and ./run gpu-pack for .carry/)
#   bench/gpu_lease.sh run OUT [SECS]   there (device run, carry [".carry", ".gpubin"]):
#                                       everything within SECS [540]; results in OUT
#   bench/gpu_lease.sh largest OUT [SECS]  there, a second call: the largest GPT one GPU
#                                       trains (bench/largest.sh, issue 36 item 6)
# Environment: ZERO_LEASE_BUILD_SECS, how long the bare build (and its own
# ctest -L gpu) may take [170]; ZERO_LEASE_SANITIZE_SECS, each sanitizer
# tool's bound [90]; ZERO_LEASE_BENCH=0 stops after the suites and the build.
# What comes back (at most 8 files): OUT/summary.txt (one line per step),
# machine.txt, gpu.json and gpu.md (bench/gpu_report.py), logs.tgz (every
# suite's, the sanitizer's, the build's and the bench's logs).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.gpubin
TARGETS=(zero-run zero-train mr_device_test bench_export_gpt bench_cuda_comm)

pack() {
  local build=${ZERO_BUILD_DIR:-build}
  cmake --build "$build" -j "$(nproc)" --target "${TARGETS[@]}" || exit 1
  rm -rf "$BIN" && mkdir -p "$BIN/tests" "$BIN/bench"
  cp "$build/zero-run" "$build/zero-train" "$BIN/"
  cp "$build/tests/mr_device_test" "$BIN/tests/"
  cp "$build/bench/bench_export_gpt" "$build/bench/bench_cuda_comm" "$BIN/bench/"
  grep -qx '/.gpubin/' .git/info/exclude 2>/dev/null || echo '/.gpubin/' >> .git/info/exclude
  echo "gpu_lease: $BIN ($(du -sh "$BIN" | cut -f1)) from $build at $(git rev-parse --short HEAD)"
}

run() {
  local out=$1 total=${2:-540} start=$SECONDS
  local logs=$out/logs
  mkdir -p "$logs"
  say() { echo "[$((SECONDS - start)) s] $*" | tee -a "$out/summary.txt"; }
  # The binaries were linked here against the same torch wheel (2.11.0+cu130);
  # there its libraries live in the machine's python3, the CUDA runtime in
  # the toolkit or the wheel's nvidia packages.
  local torchlib cudart
  torchlib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  cudart=$(dirname "$( { ls /usr/local/cuda/lib64/libcudart.so.13 /usr/local/cuda/lib/libcudart.so.13 \
    "$torchlib"/../../nvidia/cu13/lib/libcudart.so.13 "$torchlib"/../../nvidia/cuda_runtime/lib/libcudart.so.13 \
    2>/dev/null || true; } | head -n 1)")
  export LD_LIBRARY_PATH=$torchlib:$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
    nproc; uname -r
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    ldd "$BIN/zero-train" | grep -E 'not found|torch|cudart'
  } > "$out/machine.txt" 2>&1
  say "machine: $(head -n 1 "$out/machine.txt"); unresolved libraries: $(grep -c 'not found' "$out/machine.txt")"

  # The bare machine's own build, beside the suites (they are GPU-bound),
  # for at most ZERO_LEASE_BUILD_SECS: `./run gpu-build`; when it fails, the
  # same build again with ninja's -k 0, so one lease lists every error; when
  # it succeeds and time is left, its own GPU suites (ctest -L gpu).
  local build_secs=${ZERO_LEASE_BUILD_SECS:-170}
  left() { local l=$((build_secs - (SECONDS - start))); echo $((l > 5 ? l : 5)); }  # timeout 0 would mean none
  (
    export ZERO_JOBS=14 ZERO_GPU_TEST=1
    if timeout "$build_secs" nice ./run gpu-build > "$logs/bare-build.log" 2>&1; then
      echo "built" >> "$logs/bare-build.log"
      # Issue 36 item 1: where the bare build's std:: calls bind, and the
      # toolchain facts that decide it (its link line, the NEEDED order).
      {
        tests/scripts/std_bindings.sh build-gpu/tests/mr_device_test build-gpu/zero-train \
          build-gpu/tests/std_binding_probe_zero; echo "std_bindings rc=$?"
        readelf -d build-gpu/tests/mr_device_test | grep NEEDED | head -n 6
        (cd build-gpu && ninja -t commands tests/mr_device_test | tail -n 1)
        c++ --version | head -n 1; ld --version | head -n 1; cmake --version | head -n 1
        echo "LDFLAGS=${LDFLAGS:-} LIBRARY_PATH=${LIBRARY_PATH:-}"
      } > "$logs/bare-link.log" 2>&1
      (cd build-gpu && timeout "$(left)" ctest -L gpu --output-on-failure) > "$logs/bare-ctest.log" 2>&1
      echo "ctest rc=$?" >> "$logs/bare-ctest.log"
      cp build-gpu/Testing/Temporary/LastTest.log "$logs/bare-ctest-last.log" 2>/dev/null
      # A case that crashed: run it again alone under cuda-gdb (it debugs host
      # code too; the machines have no gdb) for the stack of the crash.
      local crashed
      crashed=$(grep -B 200 'killed by signal' "$logs/bare-ctest-last.log" 2>/dev/null |
        grep -o '\[ RUN      \] [A-Za-z0-9_./]*' | tail -n 1 | awk '{print $NF}')
      if [ -n "$crashed" ] && command -v cuda-gdb > /dev/null; then
        ZERO_OFFLOAD_CHUNK_ELEMENTS=4096 timeout 120 build-gpu/zero-run -n 1 -- cuda-gdb -q -batch -ex run \
          -ex bt -ex 'info registers rip' --args build-gpu/tests/mr_device_test --gtest_filter="$crashed" \
          > "$logs/bare-crash-$crashed.log" 2>&1
      fi
    else
      echo "rc=$?" >> "$logs/bare-build.log"
      timeout "$(left)" cmake --build build-gpu -j 14 -- -k 0 > "$logs/bare-build-all.log" 2>&1
      echo "rc=$?" >> "$logs/bare-build-all.log"
    fi
  ) &
  local build_pid=$!

  # The GPU suites, as tests/CMakeLists.txt runs them (label gpu).
  local env_common=(ZERO_OFFLOAD_CHUNK_ELEMENTS=4096)
  suite() {
    local name=$1 ranks=$2; shift 2
    local rc=0 t0=$SECONDS
    env "$@" timeout -k 5 150 "$BIN/zero-run" -n "$ranks" --timeout 140 -- "$BIN/tests/mr_device_test" \
      ${ZERO_LEASE_FILTER:+--gtest_filter=$ZERO_LEASE_FILTER} > "$logs/$name.log" 2>&1 || rc=$?
    say "$name: rc=$rc in $((SECONDS - t0)) s; OK $(grep -c '\[       OK \]' "$logs/$name.log")," \
      "FAILED $(grep -c '\[  FAILED  \].*ms)' "$logs/$name.log"), SKIPPED $(grep -c '\[  SKIPPED \].*ms)' "$logs/$name.log")" \
      "$(grep -m 3 -E '\[  FAILED  \].*ms\)' "$logs/$name.log" | tr '\n' ' ')"
  }
  suite gpu_1rank 1 "${env_common[@]}" ZERO_CUDA_IPC_STAGING_BYTES=65536
  suite gpu_2ranks 2 "${env_common[@]}" ZERO_CUDA_IPC_STAGING_BYTES=65536
  suite gpu_2ranks_nccl 2 "${env_common[@]}" ZERO_CUDA_IPC=off
  # Issue 36 item 2: CUDA IPC's direct path, not yet run on a GPU before this.
  ZERO_LEASE_FILTER='DeviceComm.*:DeviceEngine.StagesZeroToThree*:DeviceEngine.GptStage3*:DeviceEngine.ManyUnits*' \
    suite gpu_2ranks_direct 2 "${env_common[@]}" ZERO_CUDA_IPC_DIRECT=on ZERO_TEST_CUDA_IPC_SUM_DELAY=5000000
  ZERO_LEASE_FILTER='DeviceComm.*' suite gpu_2ranks_direct_cached 2 "${env_common[@]}" ZERO_CUDA_IPC_DIRECT=on \
    ZERO_CUDA_IPC_DIRECT_CACHE=on ZERO_TEST_CUDA_IPC_SUM_DELAY=5000000
  ZERO_LEASE_FILTER='DeviceComm.*:DeviceEngine.StagesZeroToThree*' \
    suite gpu_2ranks_forgotten_shutdown 2 "${env_common[@]}" ZERO_TEST_SHUTDOWN=leak TORCH_DISTRIBUTED_DEBUG=DETAIL
  # compute-sanitizer as ./run gpu-test runs it, on the carried binaries.
  local t0=$SECONDS
  ZERO_BUILD_DIR=$BIN ZERO_GPU_SANITIZE_TIMEOUT=${ZERO_LEASE_SANITIZE_SECS:-90} ./run gpu-sanitize > "$logs/sanitize.log" 2>&1
  say "sanitize: rc=$? in $((SECONDS - t0)) s; $(grep -h 'ERROR SUMMARY' "$BIN"/sanitize-*.log 2>/dev/null | tr '\n' ' ')"
  cp "$BIN"/sanitize-*.log "$logs/" 2>/dev/null
  wait "$build_pid"
  say "bare build: $(tail -n 1 "$logs/bare-build.log"); last progress: $(grep -o '\[[0-9]*/[0-9]*\]' "$logs/bare-build.log" | tail -n 1)"
  [ -f "$logs/bare-link.log" ] && say "bare build's std:: bindings: $(grep -h 'std_bindings' "$logs/bare-link.log" | tr '\n' ' ')"
  [ -f "$logs/bare-ctest.log" ] && say "bare build's ctest -L gpu: $(grep -E 'tests passed|ctest rc' "$logs/bare-ctest.log" | tr '\n' ' ')"
  [ -f "$logs/bare-build-all.log" ] && say "bare build with -k 0: $(tail -n 1 "$logs/bare-build-all.log"); $(grep -c '^FAILED:' "$logs/bare-build-all.log") failed: $(grep '^FAILED:' "$logs/bare-build-all.log" | awk '{print $NF}' | tr '\n' ' ')"

  if [ "${ZERO_LEASE_BENCH:-1}" = 0 ]; then
    tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
    return
  fi
  # The bench, with what is left (bench/gpu.sh records runs past its budget as skipped).
  local site budget
  if site=$(bench/peer_wheels.sh install .carry/wheels 2> "$logs/wheels.log"); then
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
  fi
  budget=$((total - (SECONDS - start) - 25))
  say "bench: budget $budget s"
  # The Python front end runs from the bare build (its extension is built
  # for this machine's python; the carried binaries' is not).
  local zc=""
  ls build-gpu/python/zero_cpp/_C*.so > /dev/null 2>&1 && zc=$PWD/build-gpu/python
  say "bench: zero_cpp from ${zc:-nowhere (the bare build made no extension: its Python front end runs are skipped)}"
  ZERO_GPU_BENCH_PYTHONPATH=${zc:-/nonexistent} \
  ZERO_GPU_BENCH_LOGS=$logs/bench ZERO_GPU_BENCH_BUDGET=$budget bench/gpu.sh "$BIN" python3 \
    > "$out/gpu.json" 2> "$logs/bench.log"
  python3 bench/gpu_report.py "$out/gpu.json" "$out/gpu.md" > /dev/null 2>> "$logs/bench.log"
  say "bench: $(grep -c ' ok ' "$logs/bench.log") runs ok, $(grep -c 'FAILED' "$logs/bench.log") failed, $(grep -c 'skipped' "$logs/bench.log") skipped"
  tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"

  [ -f "$out/gpu.md" ] && cat "$out/gpu.md"
}

# Issue 36 item 6 in a call of its own (a multi-billion-param build and a
# few steps take most of one command): bench/largest.sh on the carried
# binaries; OUT/largest.json.
largest() {
  local out=$1 total=${2:-540}
  mkdir -p "$out"
  local torchlib
  torchlib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  export LD_LIBRARY_PATH=$torchlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  bench/largest.sh "$BIN" "$((total - 10))" > "$out/largest.json" 2> "$out/largest.log"
  echo "largest: rc=$?"; python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(json.dumps(d["largest"]))' \
    "$out/largest.json" 2>&1 | tail -n 1
}

case "${1:-}" in
  pack) pack ;;
  run) shift; run "$@" ;;
  largest) shift; largest "$@" ;;
  *) echo "usage: bench/gpu_lease.sh pack | run OUT [SECS] | largest OUT [SECS]" >&2; exit 2 ;;
esac
