#!/usr/bin/env bash
# A rank's stdout is line buffered (init_distributed): its printf line comes
# through zero-run's pipe as printed, so it is not lost when the rank is
# killed before exiting. ZERO_STDOUT_LINE_BUFFERED=0 keeps the C library's
# block buffering (the line is then lost). Usage: stdout_test.sh ZERO_RUN PROBE
set -u
. "$(dirname "$0")/lib.sh"
ZR=$1
PROBE=$2
out=$("$ZR" -n 1 --timeout 60 -- "$PROBE" 2>&1)
check "a killed rank's stdout line arrived (got: $(echo "$out" | head -3 | tr '\n' '|'))" contains "$out" "stdout_probe: rank 0's line"
out=$(ZERO_STDOUT_LINE_BUFFERED=0 "$ZR" -n 1 --timeout 60 -- "$PROBE" 2>&1)
check "ZERO_STDOUT_LINE_BUFFERED=0: block buffered, the killed rank's line is lost" lacks "$out" "stdout_probe: rank 0's line"
out=$("$ZR" -n 2 --timeout 60 -- "$PROBE" --exit 2>&1)
check "2 ranks that exit: both lines" [ "$(echo "$out" | grep -c "stdout_probe: rank [01]'s line")" = 2 ]
finish
