/*
 * A model of the shared-memory lane's protocol (lane.h, lane.cpp) for the
 * SPIN model checker. The [Note] at the top of lane.cpp explains the
 * protocol and how this model maps onto it; tests/scripts/lane_model_test.sh
 * (ctest lane_model) runs every check below, one at a time by hand:
 *
 *   spin -a [-DN=3] [-DK=2] [-DMISMATCH | -DCRASH | -DBUG_... | ...] lane.pml
 *   cc -O0 -DSAFETY -DCOLLAPSE -o pan pan.c && ./pan -n
 *   (on an error: spin -t -p [the same -D flags] lane.pml replays its trail)
 *
 * N ranks, each a process whose threads may run its lane's queue: Worker(r)
 * (Lane::worker_loop) and Caller(r) (the thread that submits with
 * Lane::submit and waits with Job::wait); with WAITER a second waiting
 * thread, with STOP ~Lane's. Every rank submits the same K collectives in
 * the same order. Checked in every interleaving:
 *   - no deadlock: every thread ends, or sleeps idle on the queue's cv
 *     (spin's invalid end states);
 *   - one runner per lane at a time, and each rank's jobs finish in the
 *     order submitted (assertions in pop and at Job::finish);
 *   - every round t pairs the same collective on every rank, with the same
 *     signature (check_round: coll_at[], sig[]), so every rank runs the
 *     collectives in one order;
 *   - each round reads only what its peers wrote for that round: slots,
 *     signature and BufferRef cells, and (zero-copy) the peers' own
 *     buffers, which a caller reuses as soon as its collective returns;
 *   - every job ends, on every rank; without a failure variant, without
 *     error and after the same rounds.
 * Variants (-D):
 *   MISMATCH      rank N-1 issues another collective second: every rank
 *                 fails it, in the same round, the jobs after it fail, and
 *                 nothing hangs;
 *   CRASH         rank N-1 may die at any wait: every live rank ends, each
 *                 of its jobs done or failed (wait_word's peer_exited and
 *                 timeout);
 *   TIMEOUT       any wait not yet met may time out (a peer slower than the
 *                 collective timeout, or lane.cpp's stall detection, which
 *                 throws at such a wait): every rank ends, every job done,
 *                 and no read sees the wrong round;
 *   STOP          rank 0's lane is destroyed (~Lane) at any moment after its
 *                 last submit, with work queued, running or waited on: its
 *                 threads end, each job done; the peers time out; no peer
 *                 reads a buffer freed with the lane;
 *   WAITER        a second thread per rank waits on job WJ at the same time
 *                 (as in lane_threads_test): three threads take turns;
 *   WRAP          the counters start 2 rounds before they wrap (8-bit
 *                 here): reached() is wrap-safe;
 *   NO_ZERO_COPY  a lane made without zero_copy;
 *   FREE_WAIT_NEVER_BLOCKS  begin_round asserts instead of waiting: its
 *                 wait has always been met already (see the [Note]).
 * Planted bugs, each of which spin must catch:
 *   BUG_ONE_BUFFER        every round uses buffer 0;
 *   BUG_NO_WRITTEN_WAIT   wait_written does not wait;
 *   BUG_LOCAL_SHAREABLE   begin_direct looks at its own BufferRef only;
 *   BUG_AR_ONE_ROUND      zero-copy all_reduce without its second round;
 *   BUG_NO_READER_WAIT    end_direct does not wait for the readers;
 *   BUG_LOST_WAKEUP       run_front notifies only when items are left;
 *   BUG_SUBMIT_NO_NOTIFY  submit does not notify;
 *   BUG_TWO_RUNNERS       runnable() forgets `running` (with
 *                         NO_RUNNER_CHECK: caught by the other properties);
 *   BUG_NOTIFY_ONE        notify_one for notify_all (with WAITER);
 *   BUG_FREE_RETAINED     ~Lane frees a failed zero-copy round's buffers,
 *                         as lane.cpp did before direct_open_ (with STOP).
 * SHARE_CHOOSERS, WAIT_CHOOSERS and TIMERS bound the nondeterminism (below).
 * Not modelled: the data itself (tags stand for it), PeerBuffers failing to
 * map a peer's buffer (that rank fails; its peers time out), external()'s
 * body (its handshakes are staged rounds without data), broadcast's root.
 */

#ifndef N
#define N 2            /* ranks (Lane::size_), 2 to 4 */
#endif
#ifndef K
#define K 3            /* collectives each rank submits, 1 to 4 */
#endif
#define MAXR (2 * K)   /* rounds: at most two per collective */
#ifndef SHARE_CHOOSERS
#define SHARE_CHOOSERS N  /* ranks r < this may pass unshareable inputs; the others' always are */
#endif
#ifndef TIMERS
#define TIMERS N          /* TIMEOUT: ranks r < this may time out */
#endif
#ifndef WAIT_CHOOSERS
#define WAIT_CHOOSERS N   /* ranks r < this may leave a job unwaited; the others wait on each at once */
#endif
#define CRASHER (N - 1)
#define STOPPER 0      /* STOP: the rank whose lane is destroyed */
#ifndef WJ
#define WJ (K > 1 -> 1 : 0)  /* WAITER: the job the second thread waits on */
#endif
/* WRAP: Lane::round_ and the counters start at W0 (the code's start at 0
   and wrap after 2^32 rounds; here after 256). The ghost round number,
   G(r), counts from 0 and tags what each round wrote. */
#ifdef WRAP
#define W0 254
#else
#define W0 0
#endif
#define G(r) ((lround[r] - W0) & 255)

/* The collectives (the op in their SignatureRecord). */
#define ST1 1  /* staged, one round: a small all_gather, all_reduce or broadcast, or external()'s handshake */
#define ST2 2  /* staged, two rounds: a payload over two slots */
#define AG  3  /* all_gather: begin_direct's round, then reads in place, or one staged round */
#define RS  4  /* reduce_scatter: likewise */
#define AR  5  /* all_reduce: begin_direct's round and one more, or one staged round after the first */
#define BAD 6  /* MISMATCH: a one-round staged collective one rank issues instead */

byte ops[K];   /* the program every rank submits (init) */
#ifdef MISMATCH
#define OPOF(r, k) (((r) == N - 1 && (k) == 1) -> BAD : ops[k])
#else
#define OPOF(r, k) ops[k]
#endif

/* ---- the region: Lane::Header and the two buffers of slots ---------------------- */
byte written[N];    /* Header::written[r] */
byte consumed[N];   /* Header::consumed[r] */
byte sig[2 * N];    /* Header::sig[b][r]: the record (here its op: all describe_disagreement compares) */
byte sigtag[2 * N]; /* ghost: 1 + the round whose record the cell holds */
byte ref[2 * N];    /* Header::ref[b][r]: 2 * (1 + round) + BufferRef::shareable() */
byte slot[2 * N];   /* slot(r) of buffer b: 1 + the round whose data it holds */
/* The ranks' own buffers (memory::zeros_flat, mapped by peers through
   PeerBuffers and read in place by zero-copy rounds): slice s of rank r's
   is buf[r * N + s] = 4 * (1 + collective) + what it holds. */
byte buf[N * N];
#define INPUT(k) (4 * ((k) + 1) + 1)   /* collective k's input */
#define SUMMED(k) (4 * ((k) + 1) + 2)  /* all_reduce k: the slice summed over the ranks */

/* ---- each rank's lane ------------------------------------------------------------- */
byte lround[N];     /* Lane::round_ */
bool failed[N];     /* Lane::failed_ */
bool dopen[N];      /* Lane::direct_open_: this rank's input published to a zero-copy round not yet ended */
bool dead[N];       /* CRASH: the process is gone (what peer_exited() sees) */
bool stop[N];       /* STOP: LaneQueue::stop */
bool wexit[N];      /* STOP: the worker has returned (what ~Lane joins) */
/* LaneQueue (one per lane): its items are the jobs head[r] .. submitted[r]-1 */
byte submitted[N];
byte head[N];
bool running[N];    /* LaneQueue::running */
byte wc[N];         /* LaneQueue::waiting_callers */
bool sleepW[N];     /* the worker sleeps in LaneQueue::cv.wait */
bool sleepC[N];     /* the caller sleeps in LaneQueue::cv.wait */
bool sleepX[N];     /* WAITER: the second waiting thread sleeps there */
bool done[N * K];   /* Job::done_ */
bool jerr[N * K];   /* Job::error_ is set */
/* ghosts, for the checks */
byte runners[N];    /* threads running an item of the queue */
byte finished[N];   /* jobs finished so far */
byte coll_at[MAXR]; /* 1 + the collective the ranks ran round t for */
byte mm_round[N];   /* MISMATCH: 1 + the round in which the rank threw Mismatch */
byte callers_done;

/* slot(r), sig and ref of the round: buffer round_ % 2. BUG_ONE_BUFFER: one buffer for all rounds. */
#ifdef BUG_ONE_BUFFER
#define B(r) 0
#else
#define B(r) (lround[r] & 1)
#endif

/* Lane::zero_copy_, decided by every rank together at setup */
#ifdef NO_ZERO_COPY
#define ZC 0
#else
#define ZC 1
#endif

/* reached(): wrap-safe, here on 8-bit words (the code's are 32-bit) */
#define REACHED(v, t) ((((v) - (t)) & 255) < 128)
/* wait_all(): every peer q != r has w[q] reached t. The counters only grow,
   so waiting for the peers one by one (as the code does) ends when all have
   reached it (one guard here). */
#define PEER_AT(w, t, r, q) ((q) >= N || (q) == (r) || REACHED(w[q], t))
#define ALL_AT(w, t, r) (PEER_AT(w, t, r, 0) && PEER_AT(w, t, r, 1) && PEER_AT(w, t, r, 2) && PEER_AT(w, t, r, 3))
#define PEER_GONE(w, t, r, q) ((q) < N && (q) != (r) && dead[q] && !REACHED(w[q], t))
#define ANY_GONE(w, t, r) \
  (PEER_GONE(w, t, r, 0) || PEER_GONE(w, t, r, 1) || PEER_GONE(w, t, r, 2) || PEER_GONE(w, t, r, 3))
#define WRITTEN 0
#define CONSUMED 1
#define WORD_AT(which, t, r) (which == WRITTEN -> ALL_AT(written, t, r) : ALL_AT(consumed, t, r))
#define WORD_GONE(which, t, r) (which == WRITTEN -> ANY_GONE(written, t, r) : ANY_GONE(consumed, t, r))

/* what a round carries */
#define STAGED 0
#define DIRECT 1
#define NODATA 2

/* The queue: LaneQueue::runnable(). BUG_TWO_RUNNERS forgets `running`. */
#ifdef BUG_TWO_RUNNERS
#define RUNNABLE(r) (head[r] < submitted[r] && !stop[r])
#else
#define RUNNABLE(r) (!running[r] && head[r] < submitted[r] && !stop[r])
#endif
/* LaneQueue::cv.notify_all(). BUG_NOTIFY_ONE: notify_one() (wakes one
   sleeper, maybe one that has nothing to do: caught with WAITER). */
#ifdef BUG_NOTIFY_ONE
#define NOTIFY(r) \
  if \
  :: sleepW[r] -> sleepW[r] = 0 \
  :: sleepC[r] -> sleepC[r] = 0 \
  :: sleepX[r] -> sleepX[r] = 0 \
  :: else \
  fi
#else
#define NOTIFY(r) sleepW[r] = 0; sleepC[r] = 0; sleepX[r] = 0
#endif

/* ---- the round protocol ------------------------------------------------------------ */
/* Granularity. Every access to a slot, a header cell or a peer's buffer is
   ordered by a release store and an acquire load of written/consumed (the
   assertions check that it reads what it should), and a rank does nothing
   a peer can see between its wait and its next store. So a round is two
   steps: open_round (the buffer wait, this rank's part, the publish) and
   the closing step (the written wait, the checks, the reads, end_round).
   A read is modelled at the wait: any write a peer could make before the
   reader's end_round can be made before its wait as well, since the
   counters only grow, so a racing write is found all the same. */

/* Lane::wait_all -> wait_word, as the guard of a step: every peer has
   reached the target. CRASH: wait_word throws when a peer it waits for has
   exited (peer_exited), or on the collective timeout -- here only once
   nothing in the system can move (spin's `timeout`), so a timeout never
   hides a deadlock of the protocol itself (checked without CRASH). The
   crashing rank may die at any wait: its last publish is then all its
   peers ever see of it. A thread of a dead process stops. TIMEOUT: any
   wait not met yet may throw. STOP: a wait not met throws once the lane
   is stopping (wait_word checks `stop` after each sleep slice). */
inline wait_all(which, t, r) {
  if
  :: !dead[r] && WORD_AT(which, t, r)
#ifdef CRASH
  :: !dead[r] && WORD_GONE(which, t, r) -> goto thrown
  :: dead[r] -> goto died
  :: !dead[r] && r == CRASHER -> dead[r] = 1; goto died
#endif
#if defined(CRASH) || defined(STOP) || defined(TIMEOUT)
  :: timeout -> goto thrown
#endif
#ifdef TIMEOUT
  :: r < TIMERS && !WORD_AT(which, t, r) -> goto thrown
#endif
#ifdef STOP
  :: stop[r] && !WORD_AT(which, t, r) -> goto thrown
#endif
  fi
}

/* One step: Lane::begin_round (buffer round_ % 2 was last used by round
   round_ - 2: wait until every peer consumed that), this rank's part (the
   memcpy into slot(rank_) of a staged round, or begin_direct's BufferRef
   cell), then Lane::publish_written (the signature record, then written[me]
   = round_ + 1, a release store). FREE_WAIT_NEVER_BLOCKS asserts, instead
   of waiting, that the buffer wait is already met. */
inline open_round(r, kind, part) {
  atomic {
#if defined(FREE_WAIT_NEVER_BLOCKS)
    assert(WORD_AT(CONSUMED, (lround[r] + 255) & 255, r));
#else
    wait_all(CONSUMED, (lround[r] + 255) & 255, r);
#endif
    if
    :: part == STAGED -> slot[B(r) * N + r] = G(r) + 1
    :: part == DIRECT ->
       if
       :: sh = 1  /* the caller's input is in a shareable buffer, or not (ref_of) */
       :: r < SHARE_CHOOSERS -> sh = 0
       fi;
       ref[B(r) * N + r] = 2 * (G(r) + 1) + sh;
       dopen[r] = sh
    :: else  /* all_reduce's second zero-copy round: no data */
    fi;
    sig[B(r) * N + r] = kind;
    sigtag[B(r) * N + r] = G(r) + 1;
    written[r] = (lround[r] + 1) & 255
  }
}

/* The head of a closing step: Lane::wait_written (every peer wrote the
   round; BUG_NO_WRITTEN_WAIT drops the wait), then the comparison of every
   rank's record (describe_disagreement): Mismatch, thrown before any data
   is read, when they differ. */
inline check_round(r) {
#ifndef BUG_NO_WRITTEN_WAIT
  wait_all(WRITTEN, (lround[r] + 1) & 255, r);
#endif
  agree = 1;
  q = 0;
  do
  :: q < N ->
     assert(sigtag[B(r) * N + q] == G(r) + 1);  /* the record is this round's */
     if
     :: sig[B(r) * N + q] != sig[B(r) * N] -> agree = 0
     :: else
     fi;
     q++
  :: else -> break
  od;
  q = 0;
  if
  :: !agree ->
#ifndef MISMATCH
     assert(false);  /* every rank issues the same collectives: no round may pair different ones */
#endif
     mm_round[r] = G(r) + 1;
     goto thrown
  :: else ->  /* every rank runs round t for the same collective */
     if
     :: coll_at[G(r)] == 0 -> coll_at[G(r)] = jk + 1
     :: else -> assert(coll_at[G(r)] == jk + 1)
     fi
  fi
}

/* Lane::end_round: consumed[me] = round_ + 1 (release); ++round_. */
#define END_ROUND(r) consumed[r] = (lround[r] + 1) & 255; lround[r] = (lround[r] + 1) & 255

/* Job::finish without error. The caller may then reuse its buffer: it does
   at once (the worst case), the same buffer, for the next collective's input. */
#define FINISH_OK(r) \
  assert(finished[r] == jk); \
  finished[r]++; \
  s = 0; \
  do \
  :: s < N -> buf[r * N + s] = INPUT(jk + 1); s++ \
  :: else -> break \
  od; \
  s = 0; \
  done[r * K + jk] = 1

/* The reads of a round's slots: the loop bodies of all_gather,
   reduce_scatter, all_reduce and broadcast (each reads some of them). */
#define READ_SLOTS(r) \
  q = 0; \
  do \
  :: q < N -> assert(slot[B(r) * N + q] == G(r) + 1); q++ \
  :: else -> break \
  od; \
  q = 0

/* A staged round (also external()'s handshake, which carries no data);
   the last one of its collective finishes the job. */
inline staged_round(r, kind) {
  open_round(r, kind, STAGED);
  atomic {
    check_round(r);
    READ_SLOTS(r);
    END_ROUND(r);
    if
    :: nr == 1 -> FINISH_OK(r)
    :: else
    fi
  }
}

/* ---- one item of the queue: LaneQueue::run_front after the pop ------------------------ */

/* Lane::run (a failed lane fails the job at once; else the item's closure
   sets current_sig_ and runs the collective's body; Job::finish), then,
   under the queue's lock, running = false and the notify. Expanded once in
   each thread type. */
inline run_front(r) {
  kind = OPOF(r, jk);
  if
  :: failed[r] -> goto finish_err
  :: else
  fi;
  nr = 0;
  if
  :: (kind == AG || kind == RS || kind == AR) && ZC ->
     /* Lane::begin_direct: a round publishing where this rank's input is */
     open_round(r, kind, DIRECT);
     atomic {
       check_round(r);
       all = 1;  /* every rank reads the same cells: all take the same branch */
       q = 0;
       do
       :: q < N ->
          assert(ref[B(r) * N + q] / 2 == G(r) + 1);  /* the cell is this round's */
#ifdef BUG_LOCAL_SHAREABLE
          if :: q == r && ref[B(r) * N + q] % 2 == 0 -> all = 0 :: else fi;
#else
          if :: ref[B(r) * N + q] % 2 == 0 -> all = 0 :: else fi;
#endif
          q++
       :: else -> break
       od;
       q = 0;
       if
       :: all && kind != AR ->
          /* all_gather: each peer's shard (slice q of its buffer) in place;
             reduce_scatter: slice r of every peer's input. What they write
             is this rank's own output, which no peer reads. Then end_direct. */
          do
          :: q < N ->
             if
             :: q != r && kind == AG -> assert(buf[q * N + q] == INPUT(jk))
             :: q != r && kind == RS -> assert(buf[q * N + r] == INPUT(jk))
             :: else
             fi;
             q++
          :: else -> break
          od;
          q = 0;
          END_ROUND(r);
          ph = 1
       :: all && kind == AR ->
          /* all_reduce: slice r of every buffer summed into this rank's own ... */
          do
          :: q < N -> assert(q == r || buf[q * N + r] == INPUT(jk)); q++
          :: else -> break
          od;
          q = 0;
          buf[r * N + r] = SUMMED(jk);
#ifndef BUG_AR_ONE_ROUND
          END_ROUND(r);
          ph = 2
#else
          ph = 3
#endif
       :: else ->
          END_ROUND(r);  /* some input is not shareable: every rank stages it */
          dopen[r] = 0;
          nr = 1
       fi
     };
     if
     :: ph == 2 || ph == 3 ->
        if
        :: ph == 2 ->  /* ... a round without data: "my slice is summed" ... */
           open_round(r, kind, NODATA)
        :: else
        fi;
        atomic {
          if
          :: ph == 2 -> check_round(r)
          :: else
          fi;
          /* ... then the peers' summed slices copied into this rank's buffer */
          do
          :: q < N ->
             if
             :: q != r -> assert(buf[q * N + q] == SUMMED(jk)); buf[r * N + q] = SUMMED(jk)
             :: else
             fi;
             q++
          :: else -> break
          od;
          q = 0;
          END_ROUND(r);
          ph = 1
        }
     :: else
     fi;
     if
     :: ph == 1 ->
        /* Lane::end_direct: wait until every peer has consumed the round --
           finished reading this rank's buffer (BUG_NO_READER_WAIT drops
           that); then Job::finish */
        atomic {
#ifndef BUG_NO_READER_WAIT
          wait_all(CONSUMED, lround[r], r);
#endif
          dopen[r] = 0;
          FINISH_OK(r)
        };
        goto ran
     :: else
     fi
  :: kind == ST2 -> nr = 2
  :: else -> nr = 1  /* ST1, BAD, or a zero-copy kind on a lane without zero-copy */
  fi;
  do
  :: nr > 0 -> staged_round(r, kind); nr--
  :: else -> break
  od;
  goto ran;
thrown:
  /* Lane::run's catch: failed_ set; the body, and the buffers it keeps
     alive, retained (the model: the caller does not reuse them). */
  failed[r] = 1;
finish_err:
  skip;
  d_step {
    assert(finished[r] == jk);
    finished[r]++;
    jerr[r * K + jk] = 1;
    done[r * K + jk] = 1
  };
ran:
  skip;
  atomic {
    running[r] = 0;
    runners[r]--;
#ifdef BUG_LOST_WAKEUP
    if :: head[r] < submitted[r] || stop[r] -> NOTIFY(r) :: else fi;
#else
    if :: head[r] < submitted[r] || wc[r] > 0 || stop[r] -> NOTIFY(r) :: else fi;
#endif
    jk = 0; nr = 0; kind = 0; sh = 0; all = 0; agree = 0; ph = 0
  }
}

/* Under the queue's lock, the front item taken: LaneQueue::run_front's first lines. */
inline pop(r) {
  jk = head[r];
  head[r]++;
  running[r] = 1;
  runners[r]++;
#ifndef NO_RUNNER_CHECK  /* without it, BUG_TWO_RUNNERS must still break a property above */
  assert(runners[r] == 1)  /* one runner at a time */
#endif
}

/* ---- the threads ------------------------------------------------------------------------ */

/* Lane::worker_loop: cv.wait(lock, stop || runnable); if stop, return;
   unlock; sched_yield(); lock; if still runnable, run the front item. */
proctype Worker(byte r) {
  byte jk, kind, q, s, nr, ph, go;
  bool sh, all, agree;
  do
  :: atomic {
       if
       :: stop[r] -> go = 2
       :: !stop[r] && RUNNABLE(r) -> go = 1
       :: !stop[r] && !RUNNABLE(r) -> go = 0; sleepW[r] = 1
       fi
     };
     if
     :: go == 2 -> break
     :: go == 1 ->
        /* the lock is dropped around sched_yield(): a caller may take the item */
        atomic {
          if
          :: RUNNABLE(r) -> pop(r); go = 1
          :: else -> go = 0
          fi
        };
        if
        :: go == 1 -> run_front(r)
        :: else
        fi
     :: go == 0 ->
end_idle:  /* asleep on the cv: a valid end state */
        (sleepW[r] == 0)
     fi;
     go = 0
  od;
  wexit[r] = 1;  /* returned: ~Lane's join ends */
  goto out;
died:
  skip;
out:
  skip
}

/* Job::wait for job `k` of rank r, by a thread whose sleep flag is `slp`:
   under the queue's lock, while (!done() && !stop) { if (runnable) run
   the front item (maybe an earlier job); else cv.wait }; then
   wait_finished (the job's own cv: done). Expanded once per thread type. */
inline job_wait(r, k, slp) {
  do
  :: atomic {
       if
       :: done[r * K + k] || stop[r] -> act = 0
       :: !done[r * K + k] && !stop[r] && RUNNABLE(r) -> pop(r); act = 1
       :: !done[r * K + k] && !stop[r] && !RUNNABLE(r) -> wc[r]++; slp = 1; act = 2
       fi
     };
     if
     :: act == 0 -> break
     :: act == 1 -> run_front(r)
     :: act == 2 ->
        if
        :: atomic { slp == 0 -> wc[r]-- }  /* woken by a notify_all */
#ifdef CRASH
        :: dead[r] -> goto died
#endif
        fi
     fi;
     act = 0
  od
#ifdef STOP
  ;
  (done[r * K + k])  /* Job::wait_finished: once stopping, ~Lane fails what is queued */
#endif
}

/* The thread that submits every collective (Lane::submit), waits on it at
   once (Job::wait) or not (WAIT_CHOOSERS), and at the end polls until each
   job is done (as lane_threads_test does). */
proctype Caller(byte r) {
  byte jk, kind, q, s, nr, ph, k, act;
  bool sh, all, agree;
  do
  :: k < K ->
     atomic {  /* Lane::submit: the item pushed; notify if nothing runs */
       submitted[r]++;
#ifndef BUG_SUBMIT_NO_NOTIFY
       if :: !running[r] -> NOTIFY(r) :: else fi
#endif
     };
     if
     :: true -> job_wait(r, k, sleepC[r])
     :: r < WAIT_CHOOSERS -> skip  /* not waited on now */
     fi;
     k++
  :: else -> break
  od;
  k = 0;
  do  /* while (!job->done()) yield(), for each */
  :: k < K ->
     if
     :: done[r * K + k] -> k++
#ifdef CRASH
     :: dead[r] -> goto died
#endif
     fi
  :: else -> break
  od;
  callers_done++;
  goto out;
died:
  skip;
out:
  skip
}

#ifdef WAITER
/* Another thread of the rank, waiting on job WJ once it is submitted, at
   the same time as the caller (lane_threads_test's extra waiters). */
proctype Waiter(byte r) {
  byte jk, kind, q, s, nr, ph, act;
  bool sh, all, agree;
  (submitted[r] > WJ);
  job_wait(r, WJ, sleepX[r]);
  goto out;
died:
  skip;
out:
  skip
}
#endif

#ifdef STOP
/* Lane::~Lane on rank STOPPER, at any moment after its last submit: under
   the lock, stop = true and notify_all; wait until no thread runs an item;
   take the items left; join the worker; fail each item left. Then
   retained_ goes, and with it the failed job's buffers (freed: a memfd
   truncated, and a peer reading it dies of SIGBUS) -- unless the failure
   left a zero-copy round open (direct_open_): then they are kept until the
   process exits. BUG_FREE_RETAINED frees them regardless. */
proctype Destroyer(byte r) {
  byte jk;
  (submitted[r] == K);
  atomic { stop[r] = 1; NOTIFY(r) };
  atomic { !running[r] -> jk = head[r]; head[r] = submitted[r] };
  (wexit[r]);
  d_step {
    do
    :: jk < K ->
       assert(finished[r] == jk);
       finished[r]++;
       jerr[r * K + jk] = 1;
       done[r * K + jk] = 1;
       jk++
    :: else -> break
    od
  };
#ifdef BUG_FREE_RETAINED
  if :: failed[r] ->
#else
  if :: failed[r] && !dopen[r] ->
#endif
       jk = 0;
       do
       :: jk < N -> buf[r * N + jk] = 0; jk++  /* no longer any collective's data */
       :: else -> break
       od
  :: else
  fi
}
#endif

init {
  byte r, k;
  atomic {
#if K == 1
    ops[0] = AR;
#elif K == 2
    ops[0] = AR; ops[1] = RS;
#elif K == 3
    ops[0] = AR; ops[1] = ST2; ops[2] = AG;
#else
    ops[0] = AG; ops[1] = AR; ops[2] = ST1; ops[3] = RS;
#endif
    r = 0;
    do
    :: r < N * N -> buf[r] = INPUT(0); r++
    :: else -> break
    od;
    r = 0;
    do
    :: r < N ->
       lround[r] = W0; written[r] = W0; consumed[r] = W0;
       run Worker(r); run Caller(r);
#ifdef WAITER
       run Waiter(r);
#endif
       r++
    :: else -> break
    od;
#ifdef STOP
    run Destroyer(STOPPER);
#endif
  };
  (callers_done == N || (dead[CRASHER] && callers_done == N - 1));
  /* every live rank has every job done; without a failure variant, all
     without error and every rank took the same rounds */
  d_step {
    r = 0;
    do
    :: r < N ->
       if
       :: !dead[r] ->
          k = 0;
          do
          :: k < K ->
             assert(done[r * K + k]);
#if !defined(MISMATCH) && !defined(CRASH) && !defined(TIMEOUT) && !defined(STOP)
             assert(!jerr[r * K + k]);
#endif
#ifdef MISMATCH
             assert(jerr[r * K + k] == (k >= 1));  /* the mismatched one and every one after fail */
#endif
             k++
          :: else -> break
          od;
#ifdef MISMATCH
          assert(mm_round[r] != 0 && mm_round[r] == mm_round[0]);  /* all in the same round */
#endif
          skip
       :: else
       fi;
#if !defined(MISMATCH) && !defined(CRASH) && !defined(TIMEOUT) && !defined(STOP)
       assert(lround[r] == lround[0]);
#endif
       r++
    :: else -> break
    od
  }
}
