#!/usr/bin/env bash
# The direct I/O engine's sequential read and write GB/s against fio's on
# the same file of the same disk, in the same run (bench/ds_io.cpp; issue
# 31's goal: >= 90% of fio's best). Block sizes 128K, 1M, 8M x queue depths
# 1, 4, 8, 32 x threads (fio: numjobs) 1, 2; best of 3 runs each, ours and
# fio's interleaved. Prints one JSON object (stdout); progress on stderr.
#   bench/ds_io.sh BUILD_DIR [DIR_ON_THE_DISK [BYTES [ds_io options...]]]
# DIR defaults to $TMPDIR or /tmp, BYTES to 1G. Without fio (apt-get install
# fio; ./run bench installs it) only our figures are given, with a note.
set -euo pipefail
B=${1:-build}
dir=${2:-${TMPDIR:-/tmp}}
bytes=${3:-1G}
shift $(( $# < 3 ? $# : 3 ))
[ -x "$B/bench/ds_io" ] || { echo "ds_io.sh: $B/bench/ds_io is not built (cmake --build $B --target ds_io)" >&2; exit 2; }
if ! command -v fio >/dev/null; then
  echo "ds_io.sh: fio is not installed: our engine alone is measured (apt-get install fio)" >&2
  set -- --no-fio "$@"
fi
exec "$B/bench/ds_io" --dir "$dir" --bytes "$bytes" "$@"
