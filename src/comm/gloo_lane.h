// One Gloo process group driven by a thread of its own, so that every
// collective's signature (comm/signature.h) is exchanged and compared before
// the collective itself is issued -- without the caller waiting for its
// peers: a rank may run ahead of the others, as with Gloo alone (stage 3
// relies on it when ranks finish a unit's grads at different moments).
//
// The thread takes the lane's collectives in submission order: it issues
// the allgather of the ranks' 128-byte signature records, waits for it,
// compares, and only then issues the collective (asynchronously: Gloo runs
// it on its own threads, so collectives still overlap). When the records
// differ every rank refuses the collective, so Gloo never sees mismatched
// buffers (it aborts the process on some). The lane then stays failed, as a
// shared-memory lane does: whatever a rank waits for next reports the
// disagreement (the peers' collectives no longer pair up).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/c10d.h"
#include "zero/comm.h"

namespace zero::comm {

class GlooLane {
 public:
  GlooLane(c10::intrusive_ptr<c10d::Backend> backend, std::chrono::milliseconds timeout);
  // Fails what is still queued, gives up the waits in progress (their
  // peers may never join: a rank failing alone must not wait out the
  // collective timeout) and joins the thread. A backend left with a
  // collective in flight is abandoned, not destroyed: Gloo's destructor
  // would wait for it to time out.
  ~GlooLane();
  GlooLane(const GlooLane&) = delete;
  GlooLane& operator=(const GlooLane&) = delete;

  // Issues the collective (on the lane's thread, after the signature check).
  using Launch = std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&)>;
  // `what` names op and group in errors ("allgather on group 'dp' (ranks 0,1)");
  // `finish` runs once after the collective completes (e.g. a local sum).
  WorkHandle submit(const Group& g, const char* op, const Signature& sig, Launch launch,
                    std::function<void()> finish);
  // The signature exchange alone, in the lane's order: a collective that
  // another transport runs (NCCL, in debug mode) checked first. One host
  // round trip among the group's ranks.
  WorkHandle check(const Group& g, const char* op, const Signature& sig);

  struct Job;  // a submitted collective (gloo_lane.cpp)

 private:
  void run();
  void check_signatures(Job& job);

  c10::intrusive_ptr<c10d::Backend> backend_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  std::optional<std::string> mismatch_;  // the first disagreement; later jobs fail with it
  // Set by the destructor; every wait on this lane's works gives up then.
  std::shared_ptr<std::atomic<bool>> closing_ = std::make_shared<std::atomic<bool>>(false);
  // Gloo works this lane launched that may still run (the lane's thread's).
  std::vector<c10::intrusive_ptr<c10d::Work>> in_flight_;
  void launched(const c10::intrusive_ptr<c10d::Work>& work);
  std::thread thread_;
};

}  // namespace zero::comm
