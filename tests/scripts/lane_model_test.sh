#!/usr/bin/env bash
# The shared-memory lane's protocol model (src/comm/shm/lane.pml) checked
# by SPIN, exhaustively, in every variant: each variant of the protocol as
# the code runs it must verify with no error (no deadlock, one collective
# per round on every rank, no read of the wrong round's data, every job
# finished), and each planted bug must be caught, by the property named.
# Needs spin and a C compiler; exits 77 (ctest: skipped) without them.
# Usage: lane_model_test.sh [MODEL]    (LANE_MODEL_JOBS: checks at once, 2)
set -u
. "$(dirname "$0")/spin_checks.sh"
model=${1:-$(dirname "$0")/../../src/comm/shm/lane.pml}

# name | -D flags | expected: "ok", or what pan reports for the bug. The
# largest first (they run 2 at a time). K=3: all_reduce, a two-round staged
# collective, all_gather; K=2: all_reduce, reduce_scatter (lane.pml, init).
variants=(
  # The protocol as lane.cpp runs it (2 ranks unless -DN), each verified:
  "3 ranks|-DN=3 -DK=2 -DSHARE_CHOOSERS=0 -DWAIT_CHOOSERS=0|ok"
  "teardown|-DSTOP -DK=2 -DWAIT_CHOOSERS=1|ok"
  "concurrent waiters|-DWAITER -DK=2 -DSHARE_CHOOSERS=0 -DWAIT_CHOOSERS=1|ok"
  "timeouts|-DTIMEOUT -DK=2 -DTIMERS=1|ok"
  "zero-copy or staged|-DK=3|ok"
  "free wait never blocks|-DFREE_WAIT_NEVER_BLOCKS|ok"
  "peer crash|-DCRASH -DK=2|ok"
  "mismatch, staged|-DMISMATCH -DWAIT_CHOOSERS=1|ok"
  "mismatch, zero-copy|-DMISMATCH -DK=2|ok"
  "reduce_scatter|-DK=2|ok"
  "counters wrap|-DWRAP -DK=2|ok"
  "no zero-copy lane|-DNO_ZERO_COPY|ok"
  # Planted bugs, each caught:
  "one buffer|-DBUG_ONE_BUFFER|assertion violated (sigtag"
  "no written wait|-DBUG_NO_WRITTEN_WAIT|assertion violated (sigtag"
  "own shareable only|-DBUG_LOCAL_SHAREABLE|invalid end state"
  "all_reduce in one round|-DBUG_AR_ONE_ROUND|assertion violated (buf"
  "no reader wait|-DBUG_NO_READER_WAIT|assertion violated (buf"
  "lost wake-up|-DBUG_LOST_WAKEUP|invalid end state"
  "submit without notify|-DBUG_SUBMIT_NO_NOTIFY|invalid end state"
  "two runners|-DBUG_TWO_RUNNERS|assertion violated (runners"
  "two runners, unchecked|-DBUG_TWO_RUNNERS -DNO_RUNNER_CHECK|assertion violated"
  "notify_one|-DBUG_NOTIFY_ONE -DWAITER -DK=2 -DSHARE_CHOOSERS=0|invalid end state"
  "teardown frees a read buffer|-DBUG_FREE_RETAINED -DSTOP -DK=2|assertion violated (buf"
)

run_spin_checks "$model"
