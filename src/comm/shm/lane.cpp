// [Note: the shared-memory lane's protocol]
//
// Two protocols meet in this file: the queue inside a process (which thread
// runs a collective) and the rounds between processes (how the ranks
// exchange). src/comm/shm/lane.pml models both for the SPIN model checker;
// `ctest -R lane_model` (tests/scripts/lane_model_test.sh) checks, in every
// interleaving, that nothing deadlocks, that every round pairs the same
// collective on every rank, that no read sees another round's data or a
// buffer its owner may reuse -- and that each planted bug (BUG_* there)
// breaks one of these. Each heading names the code, then the model's parts;
// capitalised names in parentheses are the model's variants and bugs.
//
// Taking turns (LaneQueue; model: Worker, Caller, Waiter, pop, run_front).
// The submitted collectives run one at a time, in order, on whichever thread
// pops the front item under `mu` while runnable() (none running, items
// queued, not stopping): the lane's worker (worker_loop), or a thread in
// Job::wait, which runs the items up to its own rather than sleep while the
// worker runs them (a hand-over costs two wake-ups). A thread with nothing to
// run sleeps on `cv`: the worker until something is runnable, a waiter
// (counted in waiting_callers) until its job is done. A runner that ends an
// item notifies all when items remain, threads wait, or the lane stops;
// submit() notifies only when no one runs (the runner will). Every sleeper
// re-checks, one takes the next item: notify_one could wake only a waiter
// whose job is done, which leaves (BUG_NOTIFY_ONE). The worker yields once
// after waking, so that a submitter about to wait runs its own collective.
//
// Rounds (model: open_round, check_round, END_ROUND; round_ is lround). Every
// collective is one or more rounds, numbered alike on every rank; round t
// uses buffer t % 2: its slots, signature cells and BufferRef cells. Rank r:
//   begin_round      wait until consumed[q] >= t - 1 for every q: every
//                    rank has read round t - 2, which used this buffer;
//   its part         copy into slot(r), or (zero-copy) publish its BufferRef;
//   publish_written  its signature, then written[r] = t + 1 (release);
//   wait_written     until written[q] >= t + 1 for every q; compare records;
//   read             the peers' slots (zero-copy: their buffers);
//   end_round        consumed[r] = t + 1; ++round_.
// A rank opens round t + 1 only after every rank wrote round t, and so had
// ended round t - 1: begin_round's wait is always met already (a cheap guard;
// FREE_WAIT_NEVER_BLOCKS proves it), and no rank is ever more than one round
// ahead of another. The counters are 32-bit futex words compared wrap-safely
// (reached(); WRAP runs the model across the wrap).
//
// Signatures. Each round carries the collective's signature record. After
// wait_written every rank compares all of the round's records, so ranks that
// issued different collectives all throw Mismatch, in the same round, before
// reading any data (MISMATCH). Ranks that agree run the same op with the same
// sizes over the same slot size: the same number of rounds.
//
// Zero-copy rounds (begin_direct .. end_direct; model: DIRECT, NODATA,
// dopen). On a lane made with zero_copy, a collective's first round carries
// only each rank's BufferRef. Every rank reads the same cells, so all decide
// alike: if any input is not shareable they end the round and stage the data
// in the rounds after it (BUG_LOCAL_SHAREABLE: deciding on one's own cell
// hangs); otherwise, within that round, each reads its peers' buffers in
// place. all_reduce ends that round once it has summed its slice into its own
// buffer, runs one more round with no data ("my slice is summed"; without it
// a peer copies a slice not yet summed: BUG_AR_ONE_ROUND), then copies the
// peers' slices. end_direct ends the last round and waits until consumed[q]
// >= round_ for every q: every peer is done reading this rank's buffer, so
// the caller may reuse or free it once the job is done (BUG_NO_READER_WAIT).
// These are ordinary rounds of the one sequence: a direct collective sits
// between staged ones with the same buffer alternation, and the peers'
// buffers are touched only inside its rounds.
//
// Stall detection (STALL). The group's two lanes (allgathers and
// all-reduces; reduce-scatters) are ordered apart, so ranks that issued
// different collectives to different lanes -- rank 0 a state dict's
// allgather, rank 1 its next backward's reduce-scatter -- never meet in a
// round to compare signatures: each waits for the other forever. So each
// rank also publishes, in its lanes' headers, the callers blocked in
// Job::wait, its collectives queued or running, and whether its runner
// sleeps in wait_word (on which word, for which value, in which
// collective), and how many of its threads ever submitted to the pair. A
// wait asleep past kStallAfter looks at both lanes of every rank: when every
// rank has a blocked caller whose collective sleeps on a word not yet at its
// value (a runner woken but not yet running can run), none has anything
// else that could run, every thread of it that ever submitted is blocked
// there, and nothing moved over kStallLooks looks, no rank can go on -- only
// a thread that never issued a collective to the group could still issue
// the one awaited -- so it throws Mismatch naming what each rank
// waits in as that look saw it, and declares it in the headers so that every
// peer's next look throws the same (ranks that find it together throw the
// first declaration: a second reading would miss the peers already gone). The words are diagnostics the protocol never reads: a
// throw at a wait not yet met is the model's TIMEOUT variant.
//
// Failures (CRASH, TIMEOUT, STOP). Every wait (wait_word) throws on the
// collective timeout, when the peer it waits for has exited (peer_exited,
// checked every 100 ms), or once the lane is stopping (~Lane). The rank that
// throws leaves its round unfinished, so its peers fail in turn, at their
// next wait on it (exit or timeout); nothing hangs. A failed lane stays
// failed (failed_): later jobs fail at once. The failed job's closure, with
// the buffers it keeps alive, goes to retained_, freed with the lane --
// except when its input was published to a zero-copy round whose readers it
// has not seen finish (direct_open_): a peer may still map and read it, and a
// freed buffer's memfd is truncated (SIGBUS there), so it is kept until the
// process exits (BUG_FREE_RETAINED). ~Lane: stop, notify, wait until no one
// runs, take the items left, join the worker, fail those items; Job::wait
// stops running the queue once stopping and waits for its job's end.

#include "comm/shm/lane.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

namespace zero::comm::shm {

namespace {

constexpr uint64_t kMagic = 0x7a65726f2d73686dULL;     // "zero-shm"
constexpr auto kSpin = std::chrono::microseconds(50);  // polling before sleeping in the kernel (spin_budget)
constexpr auto kSleepSlice = std::chrono::milliseconds(10);
constexpr auto kLivenessEvery = std::chrono::milliseconds(100);
// Stall detection: a wait this long starts looking at the group's state,
// every kStallEvery; kStallLooks alike looks (over a second) declare it.
constexpr auto kStallAfter = std::chrono::seconds(2);
constexpr auto kStallEvery = std::chrono::milliseconds(500);
constexpr int kStallLooks = 3;
constexpr size_t kDeadlockTextBytes = 1024;

struct alignas(64) Cell {
  uint32_t value;
};

uint64_t pid_namespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// How long a wait polls before sleeping in the kernel. Waking a sleeper
// costs ~10 us (more on a VM), a collective on a small buffer a few: while
// every rank of the group has a CPU of its own, a short poll keeps that
// latency off the critical path. With more ranks than CPUs it would take
// the CPU a peer needs, so they sleep at once.
std::chrono::microseconds spin_budget(int group_size) {
  cpu_set_t set;
  const int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  return group_size <= cpus ? kSpin : std::chrono::microseconds(0);
}

// The closures of failed collectives, with the buffers they keep alive,
// until the process ends. A peer may still be reading such a buffer in
// place -- the collective failed before every reader was done -- and
// freeing it gives its pages back (memory/shared_arena.h): the reader would
// read zeros, or a later buffer's bytes, and could even complete the
// collective, since this rank may have finished its own part. A lane
// retains at most one (later jobs fail without running), so what is kept
// is one collective's buffers per failed lane; their pages go with the last
// process that maps them.
void keep_until_exit(std::vector<std::function<void()>> bodies) {
  static auto* mu = new std::mutex;  // never destroyed: a lane may fail during exit
  static auto* kept = new std::vector<std::function<void()>>;
  std::lock_guard<std::mutex> lock(*mu);
  for (auto& b : bodies) kept->push_back(std::move(b));
}

inline bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

void futex_wait(uint32_t* word, uint32_t expected, std::chrono::milliseconds slice) {
  timespec ts{0, static_cast<long>(std::chrono::nanoseconds(slice).count())};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);  // shared mapping: no PRIVATE flag
}

void futex_wake_all(uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0); }

}  // namespace

struct Lane::Header {
  uint64_t magic;
  int32_t size;
  int32_t reserved;
  int64_t slot_bytes;
  int32_t pid[kMaxRanks];
  uint64_t pid_ns[kMaxRanks];
  Cell written[kMaxRanks];
  Cell consumed[kMaxRanks];
  // Each rank's signature for the rounds using buffer 0 and 1: round t's is
  // read until every rank has consumed round t, and overwritten only by
  // round t + 2, which waits for exactly that.
  SignatureRecord sig[2][kMaxRanks];
  // Zero-copy: where each rank's input is, for the rounds using buffer 0
  // and 1 (kept as long as the signatures, for the same reason).
  BufferRef ref[2][kMaxRanks];
  // Stall detection (read by the peers, never by the protocol): per rank,
  // the callers blocked in Job::wait on this lane, its collectives queued
  // or running, whether its runner sleeps in wait_word, and on what.
  Cell blocked[kMaxRanks];
  Cell pending[kMaxRanks];
  Cell asleep[kMaxRanks];
  Cell submitters[kMaxRanks];    // threads that ever submitted to the pair (the first lane's header)
  Cell asleep_on[kMaxRanks];     // the awaited word: its byte offset in this header
  Cell asleep_until[kMaxRanks];  // ...and the value it waits for
  SignatureRecord asleep_sig[kMaxRanks];
  // A deadlock one rank declared (2 once its text is written), for the others.
  uint32_t deadlock;
  char deadlock_text[kDeadlockTextBytes];
};

// ---- the queue ------------------------------------------------------------------

// A lane's submitted collectives, run in order by one thread at a time: the
// lane's worker, or a caller waiting for one of them (Job::wait). Shared
// with the jobs, so a job can still be waited on once its lane is gone.
struct LaneQueue {
  using Body = std::function<void()>;
  std::mutex mu;
  std::condition_variable cv;  // work queued, a run ended, or stopping
  std::deque<std::pair<std::shared_ptr<Job>, Body>> items;
  bool running = false;     // a thread is running the front item
  int waiting_callers = 0;  // callers asleep on cv until the runner is done
  std::atomic<bool> stop{false};
  Lane* lane;  // runs items only while !stop, and ~Lane waits for !running

  bool runnable() const { return !running && !items.empty() && !stop; }

  // Runs the front item with `lock` released.
  void run_front(std::unique_lock<std::mutex>& lock) {
    auto item = std::move(items.front());
    items.pop_front();
    running = true;
    lock.unlock();
    // Once it has run, the buffers it kept alive go outside the lock: a
    // successful run lets go of them before finishing the job, this of what
    // is left (a lane that had failed already; a failed run's are retained_).
    lane->run(*item.first, item.second);
    item = {};
    lock.lock();
    running = false;
    if (!items.empty() || waiting_callers > 0 || stop) cv.notify_all();
  }
};

// ---- Job ----------------------------------------------------------------------

void Job::wait() {
  if (queue_) {
    LaneQueue& q = *queue_;
    std::unique_lock<std::mutex> lock(q.mu);
    // Counted for the peers' stall detection while this caller blocks; the
    // lane (and its segment) is there while it does not stop.
    const bool counted = !done() && !q.stop;
    if (counted) q.lane->note_blocked(+1);
    while (!done() && !q.stop) {  // once stopping, ~Lane finishes what is queued
      if (q.runnable()) {
        q.run_front(lock);
        continue;
      }
      ++q.waiting_callers;
      q.cv.wait(lock);
      --q.waiting_callers;
    }
    if (counted && !q.stop) q.lane->note_blocked(-1);
  }
  wait_finished();
}

void Job::wait_finished() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (error_ && mismatch_) throw Mismatch(*error_);
  if (error_) throw std::runtime_error(*error_);
}

bool Job::done() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Job::finish(std::optional<std::string> error, bool mismatch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    mismatch_ = mismatch;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

// ---- region -------------------------------------------------------------------

// The header takes the first kHeaderBytes; the two buffers follow.
constexpr int64_t kHeaderBytes = 16 * 4096;

size_t Lane::region_bytes(int size, int64_t slot_bytes) {
  static_assert(sizeof(Header) <= kHeaderBytes, "header fits its pages");
  return kHeaderBytes + 2 * static_cast<size_t>(size) * static_cast<size_t>(slot_bytes);
}

void Lane::format(void* region, int size, int64_t slot_bytes) {
  if (size < 1 || size > kMaxRanks) throw std::invalid_argument("shm lane: group size out of range");
  auto* h = static_cast<Header*>(region);
  h->size = size;
  h->slot_bytes = slot_bytes;
  __atomic_store_n(&h->magic, kMagic, __ATOMIC_RELEASE);
}

Lane::Lane(void* region, int rank, int size, int64_t slot_bytes, std::chrono::milliseconds timeout, std::string what,
           bool zero_copy)
    : header_(static_cast<Header*>(region)),
      data_(static_cast<char*>(region) + kHeaderBytes),
      rank_(rank),
      size_(size),
      slot_bytes_(slot_bytes),
      timeout_(timeout),
      spin_(spin_budget(size)),
      what_(std::move(what)),
      zero_copy_(zero_copy),
      watches_(size),
      queue_(std::make_shared<LaneQueue>()) {
  queue_->lane = this;
  if (__atomic_load_n(&header_->magic, __ATOMIC_ACQUIRE) != kMagic || header_->size != size ||
      header_->slot_bytes != slot_bytes)
    throw std::runtime_error("shared-memory region of " + what_ + " has an unexpected header");
  header_->pid[rank] = static_cast<int32_t>(getpid());
  header_->pid_ns[rank] = pid_namespace();
}

Lane::~Lane() {
  std::deque<std::pair<std::shared_ptr<Job>, LaneQueue::Body>> left;
  {
    std::unique_lock<std::mutex> lock(queue_->mu);
    queue_->stop = true;
    queue_->cv.notify_all();
    // A caller may be running a collective on this lane: its waits see
    // `stop` within a sleep slice and it returns.
    queue_->cv.wait(lock, [&] { return !queue_->running; });
    left.swap(queue_->items);
  }
  if (worker_.joinable()) worker_.join();
  for (auto& [job, body] : left) job->finish("shared-memory lane of " + what_ + " shut down");
  // A zero-copy round failed with this rank's input published: a peer may
  // still read it, through its own mapping, at any later time. Freeing it
  // (its pages given back to the arena, memory/shared_arena.h) would let
  // that peer read zeros, or another buffer's data once the range is reused,
  // and finish the collective silently wrong instead of failing it.
  // (lane.pml: STOP, BUG_FREE_RETAINED)
  if (direct_open_) keep_until_exit(std::move(retained_));
}

uint32_t* Lane::written_word(int r) const { return &header_->written[r].value; }
uint32_t* Lane::consumed_word(int r) const { return &header_->consumed[r].value; }
char* Lane::slot(int r) const { return data_ + ((round_ & 1u) * size_ + r) * slot_bytes_; }

// ---- worker -------------------------------------------------------------------

std::shared_ptr<Job> Lane::submit(const char* op, const SignatureRecord& sig, KeepAlive keep,
                                  std::function<void()> body) {
  auto job = std::make_shared<Job>();
  job->queue_ = queue_;
  std::lock_guard<std::mutex> lock(queue_->mu);
  if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  __atomic_fetch_add(&header_->pending[rank_].value, 1u, __ATOMIC_RELEASE);  // until run() has finished it
  if (pair_id_ != 0) {  // a thread new to this pair of lanes is counted once
    thread_local std::vector<uint64_t> pairs_submitted_to;
    if (std::find(pairs_submitted_to.begin(), pairs_submitted_to.end(), pair_id_) == pairs_submitted_to.end()) {
      pairs_submitted_to.push_back(pair_id_);
      __atomic_fetch_add(&std::min(header_, sibling_)->submitters[rank_].value, 1u, __ATOMIC_RELEASE);
    }
  }
  // `keep` lives in the queued closure: released once the collective has
  // run, before its job is finished (Lane::run).
  queue_->items.emplace_back(job, [this, op, sig, keep = std::move(keep), body = std::move(body)] {
    current_op_ = op;
    current_sig_ = sig;
    body();
  });
  if (!queue_->running) queue_->cv.notify_all();  // else the runner wakes whoever runs it next
  return job;
}

void Lane::worker_loop() {
  LaneQueue& q = *queue_;
  std::unique_lock<std::mutex> lock(q.mu);
  for (;;) {
    q.cv.wait(lock, [&] { return q.stop || q.runnable(); });
    if (q.stop) return;
    // Woken by a submit: on a busy CPU the wake-up may have preempted the
    // submitting thread, which is about to wait and would run the
    // collective itself. Let it; an unwaited collective starts a moment later.
    lock.unlock();
    sched_yield();
    lock.lock();
    if (q.runnable()) q.run_front(lock);
  }
}

void Lane::run(Job& job, std::function<void()>& body) {
  struct Finished {
    uint32_t* pending;
    ~Finished() { __atomic_fetch_sub(pending, 1u, __ATOMIC_RELEASE); }
  } finished{&header_->pending[rank_].value};
  if (failed_) {
    job.finish(failed_, failed_mismatch_);
    return;
  }
  try {
    body();
    // The buffers it kept alive go before its waiter wakes: a waiter that
    // then lets go of its own references frees them there, not this thread
    // a moment later (memory/shared_arena.h: a grad buffer freed after the
    // backward's scope has ended is not kept).
    body = nullptr;
    job.finish(std::nullopt);
  } catch (const Mismatch& e) {
    failed_ = e.what();  // it names op and group
    failed_mismatch_ = true;
    retained_.push_back(std::move(body));
    job.finish(failed_, true);
  } catch (const std::exception& e) {
    failed_ = std::string(current_op_) + " on " + what_ + " (shared memory) failed: " + e.what();
    retained_.push_back(std::move(body));
    job.finish(failed_);
  }
}

// ---- the round protocol (see [Note: the shared-memory lane's protocol]) ------------

bool Lane::peer_exited(int peer) {
  const int pid = header_->pid[peer];
  if (pid <= 0 || header_->pid_ns[peer] != pid_namespace()) return false;  // cannot tell from here
  return watches_[peer].exited(pid);
}

void Lane::wait_word(uint32_t* word, uint32_t target, int peer, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  if (spin_ > std::chrono::microseconds(0))
    for (;;) {
      for (int i = 0; i < 64; ++i) {
        if (reached(__atomic_load_n(word, __ATOMIC_ACQUIRE), target)) return;
        cpu_relax();
      }
      if (std::chrono::steady_clock::now() - start > spin_) break;
    }
  // Asleep, and on what: published for the peers' stall detection.
  __atomic_store_n(&header_->asleep_on[rank_].value,
                   static_cast<uint32_t>(reinterpret_cast<char*>(word) - reinterpret_cast<char*>(header_)),
                   __ATOMIC_RELAXED);
  __atomic_store_n(&header_->asleep_until[rank_].value, target, __ATOMIC_RELAXED);
  header_->asleep_sig[rank_] = current_sig_;
  __atomic_store_n(&header_->asleep[rank_].value, 1u, __ATOMIC_RELEASE);  // publishes the three above
  struct Awake {
    uint32_t* asleep;
    ~Awake() { __atomic_store_n(asleep, 0u, __ATOMIC_RELEASE); }
  } awake{&header_->asleep[rank_].value};
  stall_looks_ = 0;
  auto last_check = start, last_stall_look = start;
  for (;;) {
    const uint32_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    if (reached(v, target)) return;
    futex_wait(word, v, kSleepSlice);
    const bool stopping = queue_->stop.load();
    const auto now = std::chrono::steady_clock::now();
    if (sibling_ && now - start > kStallAfter && now - last_stall_look >= kStallEvery) {
      last_stall_look = now;
      if (auto why = group_deadlocked()) throw Mismatch(*why);
    }
    if (stopping) throw std::runtime_error("shut down while waiting for rank " + std::to_string(peer) + " " + what);
    if (now - start > timeout_)
      throw std::runtime_error("timed out after " + std::to_string(timeout_.count() / 1000.0).substr(0, 5) +
                               " s waiting for rank " + std::to_string(peer) + " (pid " +
                               std::to_string(header_->pid[peer]) + ") " + what);
    if (now - last_check > kLivenessEvery) {
      if (peer_exited(peer))
        throw std::runtime_error("rank " + std::to_string(peer) + " (pid " + std::to_string(header_->pid[peer]) +
                                 ") exited while this rank waited for it " + what);
      last_check = now;
    }
  }
}

// ---- stall detection (see [Note: the shared-memory lane's protocol], STALL) -----

void Lane::pair(Lane& a, const char* a_role, Lane& b, const char* b_role) {
  static std::atomic<uint64_t> next_pair{1};
  a.pair_id_ = b.pair_id_ = next_pair.fetch_add(1);
  a.sibling_ = b.header_;
  b.sibling_ = a.header_;
  a.role_ = b.sibling_role_ = a_role;
  b.role_ = a.sibling_role_ = b_role;
}

void Lane::note_blocked(int delta) {
  if (delta > 0) __atomic_fetch_add(&header_->blocked[rank_].value, 1u, __ATOMIC_RELEASE);
  else __atomic_fetch_sub(&header_->blocked[rank_].value, 1u, __ATOMIC_RELEASE);
}

std::optional<std::string> Lane::group_deadlocked() {
  if (__atomic_load_n(&header_->deadlock, __ATOMIC_ACQUIRE) == 2) return std::string(header_->deadlock_text);
  auto load = [](const Cell& c) { return __atomic_load_n(&c.value, __ATOMIC_ACQUIRE); };
  // Rank p's runner on h sleeps on a word not yet at its target (one woken
  // but not yet running counts as able to run).
  auto waits = [&](Header* h, int p) {
    if (load(h->asleep[p]) == 0) return false;
    const uint32_t at = load(h->asleep_on[p]), until = load(h->asleep_until[p]);
    if (at % alignof(uint32_t) != 0 || at > sizeof(Header) - sizeof(uint32_t)) return false;
    const auto* word = reinterpret_cast<const uint32_t*>(reinterpret_cast<const char*>(h) + at);
    return !reached(__atomic_load_n(word, __ATOMIC_ACQUIRE), until);
  };
  Header* const lanes[2] = {header_, sibling_};
  // Every rank stuck: a caller of it blocked on a collective whose runner
  // sleeps waiting for a peer, and nothing of it that could still run (a
  // collective queued or running but not asleep).
  std::vector<uint32_t> view;
  view.reserve(static_cast<size_t>(size_) * 12);
  // What each rank waits in, as this look saw it: the message says what was
  // seen, not what a second reading finds once a peer has given up.
  std::string waits_in;
  bool all_stuck = true;
  for (int p = 0; p < size_; ++p) {
    // Every thread of p that ever submitted to these lanes must be blocked
    // in them: one still running could issue the collective awaited.
    const uint32_t submitters = load(std::min(header_, sibling_)->submitters[p]);
    uint32_t blocked_callers = 0;
    bool stuck = false, can_run = false;
    for (Header* h : lanes) {
      const uint32_t blocked = load(h->blocked[p]), pending = load(h->pending[p]);
      const bool asleep = waits(h, p);
      if (blocked > 0 && asleep && !stuck)
        waits_in += std::string(waits_in.empty() ? "" : ", ") + "rank " + std::to_string(p) + " (pid " +
                    std::to_string(header_->pid[p]) + ") waits in " + h->asleep_sig[p].text + " on its " +
                    (h == header_ ? role_ : sibling_role_) + " lane";
      stuck = stuck || (blocked > 0 && asleep);
      can_run = can_run || (pending > 0 && !asleep);
      blocked_callers += blocked;
      view.insert(view.end(), {load(h->written[p]), load(h->consumed[p]), blocked, pending, uint32_t{asleep}});
    }
    view.push_back(submitters);
    all_stuck = all_stuck && stuck && !can_run && blocked_callers >= submitters;
  }
  // ...and so over kStallLooks looks with nothing moved: no rank can go on.
  if (!all_stuck) {
    stall_looks_ = 0;
    return std::nullopt;
  }
  if (view != stall_view_) {
    stall_view_ = std::move(view);
    stall_looks_ = 1;
    return std::nullopt;
  }
  if (++stall_looks_ < kStallLooks) return std::nullopt;
  const std::string text =
      "collectives on " + what_ + " (shared memory) are deadlocked: " + waits_in +
      "; no rank can go on. Every rank must issue the same collectives in the same order: one that only some "
      "ranks call (a checkpoint save or a full state dict on rank 0 alone) leaves the others in their next.";
  declare_deadlock(text);
  return declared_deadlock().value_or(text);
}

std::optional<std::string> Lane::declared_deadlock() const {
  // Ranks that find the stall together all report the first declaration,
  // once its writer has finished it (a few stores away).
  for (int i = 0; i < 1000; ++i) {
    if (__atomic_load_n(&header_->deadlock, __ATOMIC_ACQUIRE) == 2) return std::string(header_->deadlock_text);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return std::nullopt;
}

void Lane::declare_deadlock(const std::string& text) {
  // One declaration per pair: claimed on the header both lanes agree on.
  Header* const claim = std::min(header_, sibling_);
  uint32_t none = 0;
  if (!__atomic_compare_exchange_n(&claim->deadlock, &none, 1u, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return;
  for (Header* h : {header_, sibling_}) {
    const size_t n = std::min(text.size(), kDeadlockTextBytes - 1);
    std::memcpy(h->deadlock_text, text.data(), n);
    h->deadlock_text[n] = '\0';
    __atomic_store_n(&h->deadlock, 2u, __ATOMIC_RELEASE);
  }
}

void Lane::wait_all(uint32_t* (Lane::*word)(int) const, uint32_t target, const char* what) {
  for (int q = 0; q < size_; ++q)
    if (q != rank_) wait_word((this->*word)(q), target, q, what);
}

void Lane::begin_round() {
  // Buffer round_ % 2 was last used by round_ - 2: every rank must be done reading it.
  wait_all(&Lane::consumed_word, round_ - 1, "to free a buffer");
}

void Lane::publish_written() {
  header_->sig[round_ & 1u][rank_] = current_sig_;  // published by the release store below
  __atomic_store_n(written_word(rank_), round_ + 1, __ATOMIC_RELEASE);
  futex_wake_all(written_word(rank_));
}

void Lane::wait_written() {
  wait_all(&Lane::written_word, round_ + 1, "to write its part");
  const std::string error =
      describe_disagreement(current_op_, what_ + " (shared memory)", header_->sig[round_ & 1u], size_, [&](int q) {
        return "rank " + std::to_string(q) + " (pid " + std::to_string(header_->pid[q]) + ")";
      });
  if (!error.empty()) throw Mismatch(error);
}

void Lane::end_round() {
  __atomic_store_n(consumed_word(rank_), round_ + 1, __ATOMIC_RELEASE);
  futex_wake_all(consumed_word(rank_));
  ++round_;
}

bool Lane::begin_direct(const BufferRef& mine) {
  if (!zero_copy_) return false;
  begin_round();
  header_->ref[round_ & 1u][rank_] = mine;  // published with the signature
  direct_open_ = mine.shareable();          // peers may read it from now on
  publish_written();
  wait_written();
  for (int q = 0; q < size_; ++q)
    if (!header_->ref[round_ & 1u][q].shareable()) {
      end_round();  // every rank saw the same cells: all of them stage it
      direct_open_ = false;
      return false;
    }
  return true;
}

std::vector<const char*> Lane::peer_inputs(const char* mine) {
  std::vector<const char*> inputs(size_);
  for (int q = 0; q < size_; ++q) inputs[q] = q == rank_ ? mine : peers_.data(q, header_->ref[round_ & 1u][q]);
  if (const int64_t ms = read_delay_ms_.load(std::memory_order_relaxed); ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return inputs;
}

void Lane::end_direct() {
  end_round();
  // This rank's reads are done: its view of the peers' pages goes now,
  // while they may still be reading its own buffer.
  peers_.release_read_pages();
  // The caller may reuse or free its input once this returns: not before
  // every peer has read what it needed from it.
  wait_all(&Lane::consumed_word, round_, "to finish reading this rank's buffer");
  direct_open_ = false;
  direct_ops_.fetch_add(1, std::memory_order_relaxed);
}

// ---- collectives ----------------------------------------------------------------
// Each loop runs at least one round (`a == 0 ||`), so an empty collective
// still exchanges its signature and a size mismatch against zero is caught.

std::shared_ptr<Job> Lane::all_gather(void* out, Elem out_type, const void* in, Elem in_type, int64_t shard_numel,
                                      const SignatureRecord& sig, KeepAlive keep, BufferRef in_ref) {
  return submit("allgather", sig, std::move(keep), [=] {
    const int64_t ei = elem_size(in_type), eo = elem_size(out_type);
    const bool widen = in_type != out_type;  // 16-bit shards into fp32: converted on the way out
    const int64_t shard_bytes = shard_numel * ei;
    char* o = static_cast<char*>(out);
    const char* i = static_cast<const char*>(in);
    const bool in_place = !widen && o + rank_ * shard_bytes == i;
    if (begin_direct(in_ref)) {
      const std::vector<const char*> srcs = peer_inputs(i);
      for (int q = 0; q < size_; ++q) {
        if (q == rank_ && in_place) continue;
        const void* src = srcs[q];
        void* dst = o + q * shard_numel * eo;
        if (widen) sum_in_rank_order(&src, 1, in_type, dst, out_type, shard_numel, false);
        else std::memcpy(dst, src, shard_bytes);
      }
      end_direct();
      return;
    }
    const int64_t piece = slot_bytes_ / ei;  // elements per round
    for (int64_t a = 0; a == 0 || a < shard_numel; a += piece) {
      const int64_t n = std::min(piece, shard_numel - a);
      begin_round();
      std::memcpy(slot(rank_), i + a * ei, n * ei);
      publish_written();
      wait_written();
      for (int q = 0; q < size_; ++q) {
        if (q == rank_ && in_place) continue;
        const void* src = q == rank_ ? i + a * ei : slot(q);
        void* dst = o + (q * shard_numel + a) * eo;
        if (widen) sum_in_rank_order(&src, 1, in_type, dst, out_type, n, false);
        else std::memcpy(dst, src, n * ei);
      }
      end_round();
    }
  });
}

std::shared_ptr<Job> Lane::reduce_scatter(void* out, Elem out_type, const void* in, Elem in_type,
                                          int64_t shard_numel, bool average, const SignatureRecord& sig,
                                          KeepAlive keep, BufferRef in_ref) {
  return submit("reduce_scatter", sig, std::move(keep), [=] {
    const int64_t ei = elem_size(in_type), eo = elem_size(out_type);
    if (begin_direct(in_ref)) {
      // out may be this rank's own slice of `in`: the sum reads a block of
      // every source before writing it.
      const std::vector<const char*> inputs = peer_inputs(static_cast<const char*>(in));
      std::vector<const void*> srcs(size_);
      for (int q = 0; q < size_; ++q) srcs[q] = inputs[q] + rank_ * shard_numel * ei;
      sum_in_rank_order(srcs.data(), size_, in_type, out, out_type, shard_numel, average);
      end_direct();
      return;
    }
    // Each slot holds one piece per destination rank.
    int64_t piece = std::max<int64_t>(1, slot_bytes_ / (size_ * ei));
    if (piece >= 64) piece &= ~int64_t{63};
    const char* i = static_cast<const char*>(in);
    char* o = static_cast<char*>(out);
    std::vector<const void*> srcs(size_);
    for (int64_t a = 0; a == 0 || a < shard_numel; a += piece) {
      const int64_t n = std::min(piece, shard_numel - a);
      begin_round();
      for (int r = 0; r < size_; ++r)
        std::memcpy(slot(rank_) + r * piece * ei, i + (r * shard_numel + a) * ei, n * ei);
      publish_written();
      wait_written();
      for (int q = 0; q < size_; ++q) srcs[q] = slot(q) + rank_ * piece * ei;
      sum_in_rank_order(srcs.data(), size_, in_type, o + a * eo, out_type, n, average);
      end_round();
    }
  });
}

std::shared_ptr<Job> Lane::all_reduce(void* data, Elem type, int64_t numel, bool average,
                                      const SignatureRecord& sig, KeepAlive keep, BufferRef ref) {
  return submit("all_reduce", sig, std::move(keep), [=] {
    const int64_t e = elem_size(type);
    if (begin_direct(ref)) {
      // Rank q sums slice q of every buffer into its own; then each copies
      // the others' summed slices. Slices are whole cache lines.
      const int64_t per = ((numel + size_ - 1) / size_ + 63) / 64 * 64;
      const auto begin = [&](int q) { return std::min<int64_t>(numel, q * per); };
      const auto count = [&](int q) { return std::min<int64_t>(numel, (q + 1) * per) - begin(q); };
      char* d = static_cast<char*>(data);
      const std::vector<const char*> bufs = peer_inputs(d);
      std::vector<const void*> srcs(size_);
      for (int q = 0; q < size_; ++q) srcs[q] = bufs[q] + begin(rank_) * e;
      sum_in_rank_order(srcs.data(), size_, type, d + begin(rank_) * e, type, count(rank_), average);
      end_round();
      begin_round();  // no data: "my slice is summed"
      publish_written();
      wait_written();
      for (int q = 0; q < size_; ++q)
        if (q != rank_) std::memcpy(d + begin(q) * e, bufs[q] + begin(q) * e, count(q) * e);
      end_direct();
      return;
    }
    const int64_t piece = std::max<int64_t>(1, slot_bytes_ / e);
    char* d = static_cast<char*>(data);
    std::vector<const void*> srcs(size_);
    for (int64_t a = 0; a == 0 || a < numel; a += piece) {
      const int64_t n = std::min(piece, numel - a);
      begin_round();
      std::memcpy(slot(rank_), d + a * e, n * e);
      publish_written();
      wait_written();
      // Every rank sums all copies in the same order: identical results everywhere.
      for (int q = 0; q < size_; ++q) srcs[q] = slot(q);
      sum_in_rank_order(srcs.data(), size_, type, d + a * e, type, n, average);
      end_round();
    }
  });
}

std::shared_ptr<Job> Lane::external(const char* op, const SignatureRecord& sig, KeepAlive keep,
                                    std::function<void(const Handshake&)> body) {
  return submit(op, sig, std::move(keep), [this, body = std::move(body)] { body(Handshake(this)); });
}

void Lane::Handshake::exchange(const void* mine, size_t bytes, void* all) const {
  Lane& l = *lane_;
  if (bytes > static_cast<size_t>(l.slot_bytes_))
    throw std::invalid_argument(std::to_string(bytes) + " bytes exchanged in one round of " + l.what_ +
                                ": more than its slots' " + std::to_string(l.slot_bytes_));
  l.begin_round();
  if (bytes > 0) std::memcpy(l.slot(l.rank_), mine, bytes);
  l.publish_written();
  l.wait_written();
  for (int q = 0; bytes > 0 && q < l.size_; ++q)  // before end_round: then the slots may be reused
    std::memcpy(static_cast<char*>(all) + q * bytes, l.slot(q), bytes);
  l.end_round();
}

std::shared_ptr<Job> Lane::broadcast(void* data, int64_t bytes, int root, const SignatureRecord& sig,
                                     KeepAlive keep) {
  return submit("broadcast", sig, std::move(keep), [=] {
    char* d = static_cast<char*>(data);
    for (int64_t a = 0; a == 0 || a < bytes; a += slot_bytes_) {
      const int64_t n = std::min(slot_bytes_, bytes - a);
      begin_round();
      if (rank_ == root) std::memcpy(slot(root), d + a, n);
      publish_written();
      wait_written();
      if (rank_ != root) std::memcpy(d + a, slot(root), n);
      end_round();
    }
  });
}

}  // namespace zero::comm::shm
