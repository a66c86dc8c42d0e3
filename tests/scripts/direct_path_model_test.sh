#!/usr/bin/env bash
# CUDA IPC's direct path (src/comm/cuda/direct_path.pml: rounds, IPC events
# and device streams) checked by SPIN, exhaustively: the protocol as
# cuda_ipc_transport.cpp runs it must verify (no device read of a peer's
# buffer before its owner's input is there or after its owner reuses it,
# no summed slice read before it is summed, nothing hangs; a rank that
# fails makes every rank fail in the same round), and each planted bug must
# be caught. Needs spin and a C compiler; exits 77 (ctest: skipped) without.
# Usage: direct_path_model_test.sh [MODEL]
set -u
. "$(dirname "$0")/spin_checks.sh"
model=${1:-$(dirname "$0")/../../src/comm/cuda/direct_path.pml}

# K=3: allgather, all-reduce, allgather; K=2: allgather, all-reduce.
variants=(
  "3 ranks|-DN=3 -DK=2|ok"
  "2 ranks, three collectives|-DK=3|ok"
  "a rank that cannot open its peers' buffers|-DFAIL -DN=3 -DK=2|ok"
  "one event for both of an all-reduce's points|-DONE_EVENT -DK=3|ok"
  "no wait for the ready events|-DBUG_NO_READY_WAIT|assertion violated"
  "ready recorded after the round|-DBUG_RECORD_AFTER_ROUND|assertion violated"
  "no wait for the summed events|-DBUG_NO_SUMMED_WAIT|assertion violated"
  "last round before the stream drained|-DBUG_NO_DRAIN|assertion violated"
  "a failure seen by its own rank only|-DFAIL -DBUG_STATUS_LOCAL|invalid end state"
)

run_spin_checks "$model"
