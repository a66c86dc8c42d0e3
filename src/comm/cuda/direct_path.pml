/*
 * A model of CUDA IPC's direct path (comm/cuda_ipc_transport.h; the Run
 * struct's open_direct / publish_summed / close_direct in
 * cuda_ipc_transport.cpp) for the SPIN model checker. tests/scripts/
 * direct_path_model_test.sh (ctest direct_path_model) runs every check:
 *
 *   spin -a [-DN=3] [-DK=3] [-DFAIL | -DBUG_...] direct_path.pml
 *   cc -O0 -DSAFETY -o pan pan.c && ./pan -n
 *
 * N ranks, each a host thread H(r) (the lane's runner) and its IPC stream
 * D(r), which runs the ops H queues in order. Rounds are the lane's (their
 * own protocol is lane.pml's): here a barrier that may carry a status
 * byte. Interprocess events as CUDA keeps them: a record is queued with the
 * number it will complete as; cudaStreamWaitEvent captures, when the host
 * calls it, the latest record issued, and the waiting stream stalls until
 * that one has completed. The K collectives alternate allgather (every
 * rank reads every peer's whole input) and all-reduce (rank r reads slice r
 * of every input, sums into its own slice r in place, records `summed`, a
 * round, then copies each peer q's summed slice q into its own slice q).
 * Each collective's input is written by the caller's work (queued ahead of
 * the ready record, as the IPC stream waits for the caller's stream) with
 * the collective's number; the next collective's write is the owner reusing
 * its buffer.
 *
 * Checked in every interleaving (assertions at each device read, and
 * spin's invalid end states):
 *   - a read of a peer's input sees that collective's input, written and
 *     not yet overwritten (phase 1), and a read of a summed slice sees it
 *     summed, for this collective (phase 2);
 *   - nothing hangs: every host ends, every stream idles.
 * Variants (-D):
 *   ONE_EVENT  one event per rank for both of an all-reduce's points (a
 *          peer's first wait may then take the summed record: later, not
 *          wrong);
 *   FAIL   rank N-1 cannot open its peers' buffers in the first collective
 *          (it queues no reads and says so in the collective's status
 *          rounds): every rank fails that collective in the same round and
 *          stops (the lane stays failed), none hangs.
 * Planted bugs, each of which spin must catch:
 *   BUG_NO_READY_WAIT     the stream does not wait for the peers' ready events;
 *   BUG_RECORD_AFTER_ROUND  ready is recorded after the first round;
 *   BUG_NO_SUMMED_WAIT    phase 2 does not wait for the peers' summed events;
 *   BUG_NO_DRAIN          the last round does not wait for this rank's stream;
 *   BUG_STATUS_LOCAL      a rank looks at its own status only.
 */

#ifndef N
#define N 2
#endif
#ifndef K
#define K 2
#endif
#define READY 0
#ifdef ONE_EVENT
#define SUMMED 0  /* the first version: one event for both points (slower, still right) */
#else
#define SUMMED 1
#endif
#define QLEN (4 * N + 4)
#define ROUNDS 16

mtype = { WRITE_IN, RECORD, WAIT, READ_IN, READ_SLICE, SUM, READ_SUMMED };

chan dq[N] = [QLEN] of { mtype, byte, byte, byte };  /* op, a, b, c */

byte buf[N * N];       /* slice s of rank r's buffer: 2 * (collective + 1), +1 once summed; 0: never written */
byte issued[N * 2];    /* records issued, by rank and event */
byte completed[N * 2]; /* records completed */
byte queued[N];        /* ops queued on each stream */
byte executed[N];      /* ops each stream has run */
byte arrived[ROUNDS];  /* barrier counts, by round */
bool bad[ROUNDS * N];  /* a round's status cells: rank r failed */
byte failed_ranks;     /* ranks that ended on a failed collective */
byte ended;            /* hosts that ended */

#define INPUT(c) (2 * ((c) + 1))

/* The host side, expanded into Host (its locals r, q, t, all_ok). */
inline queue(what, arg1, arg2, arg3) {
  atomic { queued[r]++; dq[r]!what, arg1, arg2, arg3 }
}

inline record(ev) {  /* cudaEventRecord: numbered when issued, completed when the stream gets there */
  atomic { issued[r * 2 + ev]++; queued[r]++; dq[r]!RECORD, ev, issued[r * 2 + ev], 0 }
}

/* cudaStreamWaitEvent on each peer's event ev: the latest record issued now. */
inline wait_for_peers(ev) {
  q = 0;
  do
  :: q < N ->
     if
     :: q != r -> queue(WAIT, q, ev, issued[q * 2 + ev])
     :: else
     fi;
     q++
  :: else -> break
  od
}

/* One round: arrive, carry this rank's status, wait for everyone; `all_ok`
 * is every rank's status (or, planted bug, this rank's own). */
inline round(status) {
  atomic { bad[t * N + r] = status; arrived[t]++ };
  (arrived[t] == N);
  d_step {
    all_ok = true;
    q = 0;
    do
    :: q < N ->
#ifdef BUG_STATUS_LOCAL
       if :: q == r && bad[t * N + q] -> all_ok = false :: else fi;
#else
       if :: bad[t * N + q] -> all_ok = false :: else fi;
#endif
       q++
    :: else -> break
    od;
    t++
  }
}

proctype Stream(byte r) {
  mtype op;
  byte a, b, c, s;
end:
  do
  :: atomic { dq[r]?op, a, b, c ->  /* one op at a time, whole (a WAIT may stall it) */
     if
     :: op == WRITE_IN ->   /* the caller's work: its input for collective a */
        s = 0;
        do :: s < N -> buf[r * N + s] = INPUT(a); s++ :: else -> break od
     :: op == RECORD -> completed[r * 2 + a] = b
     :: op == WAIT -> (completed[a * 2 + b] >= c)
     :: op == READ_IN ->    /* allgather: peer a's whole input of collective c */
        s = 0;
        do :: s < N -> assert(buf[a * N + s] == INPUT(c)); s++ :: else -> break od
     :: op == READ_SLICE -> /* all-reduce phase 1: slice r of peer a's input */
        assert(buf[a * N + r] == INPUT(c))
     :: op == SUM -> buf[r * N + r] = INPUT(c) + 1
     :: op == READ_SUMMED ->/* phase 2: peer a's summed slice a into this buffer */
        assert(buf[a * N + a] == INPUT(c) + 1);
        buf[r * N + a] = INPUT(c) + 1
     fi;
     executed[r]++ }
  od
}

proctype Host(byte r) {
  byte c = 0, q, t = 0;
  bool all_ok, mine_bad;
  do
  :: c < K ->
     mine_bad = false;
     queue(WRITE_IN, c, 0, 0);
#ifndef BUG_RECORD_AFTER_ROUND
     record(READY);
#endif
     round(false);  /* where each input is */
#ifdef BUG_RECORD_AFTER_ROUND
     record(READY);
#endif
#ifdef FAIL
     if :: c == 0 && r == N - 1 -> mine_bad = true :: else fi;
#endif
     if
     :: !mine_bad ->
#ifndef BUG_NO_READY_WAIT
        wait_for_peers(READY);
#endif
        q = 0;
        do
        :: q < N ->
           if
           :: q != r && c % 2 == 0 -> queue(READ_IN, q, 0, c)
           :: q != r && c % 2 == 1 -> queue(READ_SLICE, q, 0, c)
           :: else
           fi;
           q++
        :: else -> break
        od
     :: else
     fi;
     if
     :: c % 2 == 1 ->  /* all-reduce: this rank's slice summed in place, then the peers' */
        if :: !mine_bad -> queue(SUM, 0, 0, c); record(SUMMED) :: else fi;
        round(mine_bad);
        if
        :: all_ok ->
#ifndef BUG_NO_SUMMED_WAIT
           wait_for_peers(SUMMED);
#endif
           q = 0;
           do
           :: q < N -> if :: q != r -> queue(READ_SUMMED, q, 0, c) :: else fi; q++
           :: else -> break
           od
        :: else -> mine_bad = true  /* a peer failed: the rest is skipped */
        fi
     :: else
     fi;
#ifndef BUG_NO_DRAIN
     (executed[r] == queued[r]);  /* the stream drained */
#endif
     round(mine_bad);          /* the last: every rank's input is its caller's again */
     if
     :: !all_ok -> failed_ranks++; break  /* thrown on every rank; the lane stays failed */
     :: else
     fi;
     c++
  :: else -> break
  od;
  ended++
}

init {
  byte r;
  atomic {
    r = 0;
    do
    :: r < N -> run Stream(r); run Host(r); r++
    :: else -> break
    od
  }
  (ended == N);
#ifdef FAIL
  assert(failed_ranks == N);  /* every rank failed the collective, none went on alone */
#else
  assert(failed_ranks == 0);
#endif
}
