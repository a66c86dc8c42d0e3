// Work handles over c10d's asynchronous work.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "comm/c10d.h"
#include "zero/comm.h"

namespace zero::comm {

// Waits on a c10d work item, then runs `finish` (the local part of a
// composite collective, e.g. the sum after an all-to-all) exactly once.
// Failures and timeouts become CommError naming `what` ("allgather on dp0 (ranks 0,1)").
// With `closing`, a wait is given up once it is set (its group is being
// shut down): the peers may never join, and teardown must not wait out the
// collective timeout for them.
class BackendWork : public Work {
 public:
  BackendWork(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish, std::string what,
              std::chrono::milliseconds timeout, std::shared_ptr<const std::atomic<bool>> closing = nullptr);
  void wait() override;
  bool is_completed() override;

 private:
  void wait_for_peers();  // work_->wait within the timeout, or until closing
  std::mutex mu_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> finish_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<const std::atomic<bool>> closing_;
  bool done_ = false;
  std::optional<std::string> error_;
};

// A collective that finished synchronously (e.g. on a group of one).
WorkHandle completed_work();

// The first line of an exception message (c10d appends C++ backtraces).
std::string first_line(const std::string& s);

}  // namespace zero::comm
