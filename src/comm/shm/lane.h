// One ordered stream of collectives over a shared-memory region, run by a
// worker thread so callers get asynchronous completion (as from Gloo) -- or
// by the caller itself when it waits while the worker is idle, which saves
// two thread wake-ups (~10-35 us each on a VM) per collective.
//
// Region: a header (per-rank pid and two progress counters, each on its own
// cache line) and two buffers of one slot per rank. A collective is split
// into rounds of at most one slot per rank; round t uses buffer t % 2, so a
// rank can fill the next round while slower peers still read this one.
//   1. wait until every rank has consumed round t-2 (buffer free again)
//   2. copy this rank's part into its slot; written[me] = t+1
//   3. wait until written[q] >= t+1 for every q
//   4. read / reduce the slots it needs; consumed[me] = t+1
// With its part, each rank writes the collective's signature record (op,
// size, dtype, label; comm/signature.h) into the round's header cell; after
// step 3 every rank compares all records, so ranks running different
// collectives all fail in the same round, naming both, before reading data.
// Counters are 32-bit futex words (waiters poll for 50 us, then sleep in the
// kernel; no polling when the group has more ranks than this process has
// CPUs); comparisons are wrap-safe. Every wait is bounded by the
// collective timeout and notices a peer process that died, so a killed rank
// turns into an error naming it, not a hang. After a failure the lane stays
// failed: its peers' progress is unknown. No torch.
//
// Zero-copy (a lane made with zero_copy, for inputs in shareable buffers,
// comm/shm/peer_buffers.h): the first round carries no data but where each
// rank's input is. When every rank's is shareable, each reads its peers'
// buffers in place -- allgather: the peers' shards straight into its
// output; reduce-scatter: its slice of every rank's input, summed in rank
// order; all-reduce: that into its own slice of its buffer, a round, then
// the peers' summed slices -- and the collective ends when every rank has
// finished reading (consumed), so no caller reuses or frees a buffer a
// peer still reads. Otherwise all of them take the staged rounds. The sums
// are the staged path's, element for element: bit-identical results.
//
// [Note: the shared-memory lane's protocol] at the top of lane.cpp walks
// through all of it; lane.pml beside it is its model, checked by SPIN
// (ctest lane_model).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/shm/peer_buffers.h"
#include "comm/shm/process_watch.h"
#include "comm/shm/reduce_kernels.h"
#include "comm/signature.h"

namespace zero::comm::shm {

// The ranks ran different collectives on a lane (see signature.h).
struct Mismatch : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct LaneQueue;

// Completion of one submitted collective.
class Job {
 public:
  // Blocks until it has run; throws Mismatch, or std::runtime_error with any
  // other error. While the lane's worker is idle the waiting thread runs the
  // queued collectives itself, up to this one: a caller that waits at once
  // pays no hand-over to the worker and back.
  void wait();
  bool done();

 private:
  friend class Lane;
  void finish(std::optional<std::string> error, bool mismatch = false);
  void wait_finished();
  std::shared_ptr<LaneQueue> queue_;  // outlives the lane while a job waits on it
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool mismatch_ = false;
  std::optional<std::string> error_;
};

class Lane {
 public:
  static constexpr int kMaxRanks = 64;

  // Bytes of the region for `size` ranks and slots of `slot_bytes`.
  static size_t region_bytes(int size, int64_t slot_bytes);
  // Writes the header into a fresh (zeroed) region: the creator does this
  // before the others attach.
  static void format(void* region, int size, int64_t slot_bytes);

  // Attaches to a formatted region as `rank`; throws if the header does not
  // match. `what` names the group in errors. `zero_copy`: every rank of the
  // group can map the others' buffers (decided together at setup).
  Lane(void* region, int rank, int size, int64_t slot_bytes, std::chrono::milliseconds timeout, std::string what,
       bool zero_copy = false);
  ~Lane();  // fails queued work and joins the worker
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  // Queue a collective. `keep` owns the buffers (e.g. the caller's tensors):
  // the lane holds it until the collective has run, even if the caller
  // drops its handle without waiting.
  // `sig` is what every rank must agree this collective is.
  using KeepAlive = std::shared_ptr<const void>;
  // `out_type` is `in_type`, or F32 for a 16-bit `in_type` (widened as it lands).
  // `in_ref` / `ref`: where the input is, if in a shareable buffer (zero-copy).
  std::shared_ptr<Job> all_gather(void* out, Elem out_type, const void* in, Elem in_type, int64_t shard_numel,
                                  const SignatureRecord& sig, KeepAlive keep, BufferRef in_ref = {});
  std::shared_ptr<Job> reduce_scatter(void* out, Elem out_type, const void* in, Elem in_type, int64_t shard_numel,
                                      bool average, const SignatureRecord& sig, KeepAlive keep,
                                      BufferRef in_ref = {});
  std::shared_ptr<Job> all_reduce(void* data, Elem type, int64_t numel, bool average, const SignatureRecord& sig,
                                  KeepAlive keep, BufferRef ref = {});
  std::shared_ptr<Job> broadcast(void* data, int64_t bytes, int root, const SignatureRecord& sig, KeepAlive keep);

  // A collective whose data moves elsewhere (device buffers: the CUDA IPC
  // transport). `body` runs on the lane's worker, in order with the lane's
  // other collectives, and runs rounds through its Handshake as many times
  // as its peers do. `op` names it in errors (a string literal).
  class Handshake {
   public:
    // One round: every rank publishes and checks the collective's signature
    // and waits for all the others.
    void operator()() const { exchange(nullptr, 0, nullptr); }
    // One round that also carries `bytes` (at most slot_bytes()) from every
    // rank, through the round's slots: `all` (size * bytes) gets them in
    // rank order. Every rank passes the same `bytes`.
    void exchange(const void* mine, size_t bytes, void* all) const;

   private:
    friend class Lane;
    explicit Handshake(Lane* lane) : lane_(lane) {}
    Lane* lane_;
  };
  std::shared_ptr<Job> external(const char* op, const SignatureRecord& sig, KeepAlive keep,
                                std::function<void(const Handshake&)> body);

  // The group's other lane, over the same segment: collectives that the
  // ranks issued to different lanes (one runs an allgather where another
  // runs a reduce-scatter) wait for each other forever; with the sibling
  // known, that is found within seconds (stall detection, lane.cpp) instead
  // of at the collective timeout. `role`: each lane's name in the message.
  static void pair(Lane& a, const char* a_role, Lane& b, const char* b_role);

  int64_t slot_bytes() const { return slot_bytes_; }
  bool zero_copy() const { return zero_copy_; }
  // Collectives that ran zero-copy so far (for tests and logs).
  int64_t zero_copy_collectives() const { return direct_ops_.load(std::memory_order_relaxed); }
  // For tests: a zero-copy collective pauses this long after mapping its
  // peers' buffers, before reading them, so that a test can fail a peer while
  // this rank is in the middle of reading (tests/mr/zero_copy_test.cpp).
  void delay_peer_reads_for_testing(std::chrono::milliseconds d) { read_delay_ms_.store(d.count()); }

 private:
  friend struct LaneQueue;
  friend class Job;  // note_blocked
  struct Header;
  std::shared_ptr<Job> submit(const char* op, const SignatureRecord& sig, KeepAlive keep, std::function<void()> body);
  void worker_loop();
  void run(Job& job, std::function<void()>& body);  // on whichever thread runs the queue

  // Round protocol (see the top of the file).
  char* slot(int rank) const;  // this round's slot of `rank`
  void begin_round();
  void publish_written();   // with the current signature
  void wait_written();      // then checks every rank's signature
  void end_round();
  void wait_all(uint32_t* (Lane::*word)(int) const, uint32_t target, const char* what);
  void wait_word(uint32_t* word, uint32_t target, int peer, const char* what);
  bool peer_exited(int peer);
  // Stall detection: the message when every rank of the group has a caller
  // blocked on a collective that waits for a peer, on either lane, with
  // nothing else to run and no counter moving over kStallRepeats looks;
  // or a deadlock a peer declared. Called while wait_word sleeps.
  std::optional<std::string> group_deadlocked();
  void declare_deadlock(const std::string& text);
  std::optional<std::string> declared_deadlock() const;  // the first declaration's text, once written
  void note_blocked(int delta);  // a caller entered (+1) or left (-1) Job::wait
  // Zero-copy: the round publishing `mine`; true, with the round open, when
  // every rank's input is shareable; false (round closed) otherwise.
  bool begin_direct(const BufferRef& mine);
  // Every rank's input in the open round, `mine` for this rank's: the
  // peers' buffers mapped here.
  std::vector<const char*> peer_inputs(const char* mine);
  void end_direct();  // closes the round; waits for every reader
  uint32_t* written_word(int r) const;
  uint32_t* consumed_word(int r) const;

  Header* header_;
  char* data_;
  int rank_, size_;
  int64_t slot_bytes_;
  std::chrono::milliseconds timeout_;
  std::chrono::microseconds spin_;  // polling before a wait sleeps
  std::string what_;
  const char* current_op_ = "";
  SignatureRecord current_sig_;
  uint32_t round_ = 0;
  bool zero_copy_;
  PeerBuffers peers_;  // the running thread's (one at a time)
  std::vector<ProcessWatch> watches_;  // per rank; touched only by the thread running the queue
  std::atomic<int64_t> direct_ops_{0};
  std::atomic<int64_t> read_delay_ms_{0};
  // A failed job's closure (with the buffers it keeps alive): a peer may be
  // reading them still, so they are never freed -- not with the lane either
  // (~Lane hands them to keep_until_exit in lane.cpp).
  std::vector<std::function<void()>> retained_;
  // This rank's input is published to a zero-copy round whose readers it
  // has not yet seen finish (end_direct). Left set by a failure: a peer may
  // read that buffer at any later time, so ~Lane never frees retained_.
  bool direct_open_ = false;

  // Touched only by the thread running the queue (one at a time).
  std::optional<std::string> failed_;  // the first error; later jobs fail with it
  bool failed_mismatch_ = false;

  // Stall detection, touched only by the thread running the queue: the
  // sibling lane's header (the segment outlives both lanes), the names, and
  // the last look at the group's state with how many looks found it alike.
  Header* sibling_ = nullptr;
  uint64_t pair_id_ = 0;  // the pair's, unique in the process (counts each submitting thread once)
  const char* role_ = "";
  const char* sibling_role_ = "";
  std::vector<uint32_t> stall_view_;
  int stall_looks_ = 0;

  std::shared_ptr<LaneQueue> queue_;
  std::thread worker_;
};

}  // namespace zero::comm::shm
