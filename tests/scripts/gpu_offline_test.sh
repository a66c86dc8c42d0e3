#!/usr/bin/env bash
# A rehearsal of `./run gpu-test` on a bare GPU machine (../shared/DEVICE.md,
# docs/gpu.md): no network, torch only as python3's package, none of the
# Debian development packages CI has, and only what `./run gpu-pack` carries.
#
#  1. `./run gpu-pack` in the source tree under test makes .carry/;
#  2. the tree is copied as the device tool copies it (tracked files,
#     untracked files git does not ignore, and .carry) into a fresh directory;
#  3. in new network and mount namespaces (`unshare -n -m`; only loopback, as
#     there) an overlay on /usr whites out every file of the packages the GPU
#     machine lacks (nlohmann-json, Gloo's headers, GoogleTest/GoogleMock with
#     /usr/src/googletest, Google Benchmark, OpenSSL's development files
#     (libssl-dev; its runtime, libssl3, stays), liburing (liburing-dev and its
#     runtime liburing2: the build links liburing.a); make and procps, which it need
#     not have: the paths come from `dpkg -L`), ccache (the machine has none;
#     the build keeps its cache through CMAKE_<LANG>_COMPILER_LAUNCHER, so
#     find_program and `command -v` see no ccache but compiles still hit)
#     and the system python's numpy; python3 is the torch wheel's virtual
#     environment, first on PATH, as there (with numpy, which that machine's
#     python3 has);
#  4. `./run gpu-test` runs there: it must exit 0, every case of the
#     GPU-labelled tests must skip (no GPU here) and every other test pass,
#     but those labelled breadth, which `run` leaves to CI's own run of the
#     suite under ZERO_GPU_REHEARSAL (tests/CMakeLists.txt says why).
#
# The full log goes to BUILD_DIR/gpu-rehearsal/gpu-test.log; its tail is
# printed on failure. Skips (exit 77) when not root, when unshare is missing
# or refused, outside a git checkout or Debian, inside the rehearsal's own
# ctest run (ZERO_GPU_REHEARSAL set) and under any ./run gpu-test (ZERO_GPU_TEST
# set: on a GPU machine there is nothing to rehearse, nor network to pack with). A mount that fails inside fails
# the test (the log says which).
# Usage: gpu_offline_test.sh SOURCE_DIR BUILD_DIR TORCH_INSTALL_PREFIX
set -u

# The packages a GPU machine does not have (Debian 12 names): the development
# files it is known or presumed to lack (libssl-dev: its python3 has ssl, so
# the runtime libssl3 is there, but nothing says the headers are), liburing (dev files
# and runtime: none there), and make and procps (pgrep, ps), which its image
# need not have (it has CMake and ninja).
HIDDEN_PACKAGES=(nlohmann-json3-dev libgloo-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
  libbenchmark1debian libssl-dev liburing-dev liburing2 make procps)

skip() { echo "skipped: $*"; exit 77; }

# ---- inside the namespaces: hide, then run ./run gpu-test ---------------------
if [ "${1:-}" = --inside ]; then
  ws=$2 venv=$3
  set -e
  ip link set lo up
  # The system python's numpy stays reachable for the wheel's python alone
  # (python3 below): a bind mount made before the overlay hides it.
  mkdir -p "$ws/pylib/numpy"
  mount --bind /usr/lib/python3/dist-packages/numpy "$ws/pylib/numpy"
  mkdir -p "$ws/ovl" && mount -t tmpfs zero-rehearsal "$ws/ovl"
  mkdir -p "$ws/ovl/upper" "$ws/ovl/work"
  n=0
  while IFS= read -r f; do
    [ -n "$f" ] || continue
    mkdir -p "$ws/ovl/upper$(dirname "${f#/usr}")"
    mknod "$ws/ovl/upper${f#/usr}" c 0 0  # an overlay whiteout: the path is absent
    n=$((n + 1))
  done < "$ws/hidden.txt"
  mount -t overlay zero-rehearsal -o "lowerdir=/usr,upperdir=$ws/ovl/upper,workdir=$ws/ovl/work" /usr
  set +e
  for f in /usr/include/nlohmann/json.hpp /usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake \
    /usr/include/gloo/config.h /usr/include/gtest/gtest.h /usr/src/googletest/CMakeLists.txt \
    /usr/lib/x86_64-linux-gnu/libgtest.a /usr/include/benchmark/benchmark.h /usr/include/openssl/hmac.h \
    /usr/lib/x86_64-linux-gnu/libcrypto.so /usr/include/liburing.h /usr/lib/x86_64-linux-gnu/liburing.a \
    /usr/lib/x86_64-linux-gnu/liburing.so.2 /usr/bin/ccache /usr/bin/make /usr/bin/pgrep; do
    [ ! -e "$f" ] || { echo "rehearsal: $f still visible"; exit 1; }
  done
  ! /usr/bin/python3 -c 'import numpy.core' 2>/dev/null || { echo "rehearsal: the system python still has numpy"; exit 1; }
  echo "rehearsal: $n paths hidden; network: $(ip -o link | awk -F': ' '{ print $2 }' | paste -sd' ')"

  # python3: the wheel's environment (its bin first on PATH, as there), with numpy.
  mkdir -p "$ws/bin"
  printf '#!/bin/sh\nPYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH} exec %s "$@"\n' "$ws/pylib" "$venv/bin/python3" \
    > "$ws/bin/python3"
  chmod +x "$ws/bin/python3"
  export PATH="$ws/bin:$venv/bin:$PATH" ZERO_GPU_REHEARSAL=1
  if [ -x "$ws/tools/ccache" ]; then
    export CMAKE_CXX_COMPILER_LAUNCHER="$ws/tools/ccache" CMAKE_CUDA_COMPILER_LAUNCHER="$ws/tools/ccache"
    export CCACHE_STATSLOG="$ws/ccache-stats.log"  # this build's hits and misses alone
  fi
  unset ZERO_BUILD_DIR
  cd "$ws/tree"
  echo "rehearsal: ./run gpu-test in $PWD (python3: $(command -v python3))"
  # Its own progress lines get the seconds since it started.
  t0=$(date +%s)
  set -o pipefail
  ./run gpu-test 2>&1 | while IFS= read -r line; do
    case $line in gpu-test:*) echo "$line [$(($(date +%s) - t0)) s]" ;; *) printf '%s\n' "$line" ;; esac
  done
  exit $?
fi

# ---- outside --------------------------------------------------------------------
[ -z "${ZERO_GPU_REHEARSAL:-}" ] || skip "inside the GPU rehearsal's own test run (no recursion)"
[ -z "${ZERO_GPU_TEST:-}" ] || skip "inside ./run gpu-test (on a GPU machine, or rehearsed): nothing to rehearse"
[ $# -eq 3 ] || { echo "usage: $0 SOURCE_DIR BUILD_DIR TORCH_INSTALL_PREFIX"; exit 2; }
. "$(dirname "$0")/lib.sh"
SRC=$(cd "$1" && pwd)
B=$(cd "$2" && pwd)
venv=$(cd "$3/../../../.." 2>/dev/null && pwd)
[ "$(id -u)" -eq 0 ] || skip "needs root (network and mount namespaces, an overlay on /usr)"
command -v unshare >/dev/null || skip "unshare (util-linux) is not installed"
command -v ip >/dev/null || skip "ip (iproute2) is not installed"
unshare -n -m --propagation private true 2>/dev/null || skip "unshare -n -m is refused here"
git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1 || skip "$SRC is not a git checkout (the tree is copied as git lists it)"
[ -x "$venv/bin/python3" ] && [ -f "$venv/pyvenv.cfg" ] || skip "torch ($3) is not inside a virtual environment"
command -v dpkg >/dev/null || skip "not a Debian system (dpkg lists what to hide)"
[ -d /usr/lib/python3/dist-packages/numpy ] || skip "python3-numpy is not installed (./run deps installs it)"

ws=$B/gpu-rehearsal
log=$ws/gpu-test.log
rm -rf "$ws" && mkdir -p "$ws/tree" "$ws/tools"
t0=$(now)
stamp() { awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.0f s", b - a }'; }

# 1. The carry, made by the tree under test.
if ! (cd "$SRC" && ./run gpu-pack) > "$ws/gpu-pack.log" 2>&1; then
  fail "./run gpu-pack"; tail -n 20 "$ws/gpu-pack.log"; finish
fi
pass "./run gpu-pack ($(tail -1 "$ws/gpu-pack.log" | grep -o '([^)]*)' | head -1))"

# 2. The tree as the device tool sends it.
(cd "$SRC" && git ls-files -z --cached --others --exclude-standard | xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' _ \
  | tar cf - --null -T - .carry) | tar xf - -C "$ws/tree"
check "tree copied ($(cd "$ws/tree" && find . -type f | wc -l) files)" [ -x "$ws/tree/run" -a -f "$ws/tree/.carry/deps.tar" ]

# 3. What to hide: every file and link of the packages, the system ccache,
# and the system python's numpy.
usr_merged=; [ -L /bin ] && usr_merged=1  # /bin/ps is /usr/bin/ps
for p in "${HIDDEN_PACKAGES[@]}"; do  # (one not installed is absent already)
  dpkg -L "$p" 2>/dev/null | while IFS= read -r f; do [ -L "$f" ] || [ ! -d "$f" ] && echo "$f"; done
done | sed "${usr_merged:+s#^/\(bin\|sbin\|lib\)/#/usr/\1/#}" | grep '^/usr/' | sort -u > "$ws/hidden.txt"
if command -v ccache >/dev/null; then
  cp "$(command -v ccache)" "$ws/tools/ccache"
  command -v ccache | grep '^/usr/' >> "$ws/hidden.txt"
fi
dpkg -L python3-numpy | grep '/dist-packages/numpy$' >> "$ws/hidden.txt"  # whole: an empty one still imports

# 4. Offline, without them: ./run gpu-test. ccache's base directory holds the
# source tree, so the copy in BUILD_DIR compiles to the main build's entries
# (`run` does the same for its builds).
ccache_base=${CCACHE_BASEDIR:-$(ccache -k base_dir 2>/dev/null)}
if [ -z "$ccache_base" ] || [[ "$SRC/" != "${ccache_base%/}/"* ]]; then export CCACHE_BASEDIR=$SRC; fi
echo "rehearsal: started $(date -u +%FT%TZ)" > "$log"
unshare -n -m --propagation private bash "$0" --inside "$ws" "$venv" >> "$log" 2>&1
rc=$?
echo "rehearsal: ./run gpu-test exited $rc after $(stamp)" >> "$log"
check "./run gpu-test offline exits 0 ($(stamp))" [ $rc -eq 0 ]
check "the hidden packages were hidden" grep -q "^rehearsal: [0-9]* paths hidden; network: lo$" "$log"
check "gpu-test installed the carried nlohmann-json, Gloo headers, GoogleTest, OpenSSL's headers and liburing" \
  grep -q "^gpu-test: installed nlohmann-json gloo-headers googletest openssl liburing under /usr" "$log"
check "gpu-test built the tree" grep -q "^gpu-test: built" "$log"
check "every GPU case skipped (no GPU here)" grep -q "^gpu-test: GPU cases: 0 ran, [1-9][0-9]* skipped" "$log"
last_ctest() { grep '% tests passed' "$log" | tail -n 1; }  # the CPU suite's, after the GPU tests'
check "every other test passed ($(last_ctest))" grep -q "^100% tests passed" <<<"$(last_ctest)"
# The only tests allowed not to run: this one, inside its own run, and those
# that skip for a tool this host lacks as well (doxygen, gnuplot: not among
# `./run deps`' packages, so a fresh machine has neither). (ctest lists them
# as "<tab> 22 - name (Skipped)".)
not_run=$(grep -E '^\s+[0-9]+ - [^ ]+ \((Skipped|Not Run|Disabled)\)$' "$log" | awk '{ print $3 }' | sort -u)
may_skip=gpu_offline_rehearsal
command -v doxygen >/dev/null || may_skip+=$'\n'api_docs
command -v gnuplot >/dev/null || may_skip+=$'\n'bench_report
unexpected=$(comm -23 <(echo "$not_run") <(echo "$may_skip" | sort -u))
check "no other test skipped (did not run: $(echo $not_run))" [ -z "$unexpected" ]
if [ -s "$ws/ccache-stats.log" ]; then
  echo "rehearsal: compiler cache $(grep -c '^direct_cache_hit$' "$ws/ccache-stats.log") direct hits," \
    "$(grep -c '^preprocessed_cache_hit$' "$ws/ccache-stats.log") preprocessed hits," \
    "$(grep -c '^cache_miss$' "$ws/ccache-stats.log") misses"
fi
if [ "$failures" -ne 0 ]; then
  echo "---- tail of $log"
  tail -40 "$log"
else
  rm -rf "$ws/tree"  # the build (the log stays)
fi
finish
