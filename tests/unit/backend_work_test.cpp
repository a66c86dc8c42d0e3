// BackendWork's wait in slices (comm/work.h): a c10d work that completes
// just as a slice's wait times out is done, not timed out. (Gloo's barrier
// failed with "Operation timed out!" after 114 ms in CI: the slice ended,
// the peers arrived, and the completed work's timeout was rethrown.)
#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/work.h"

namespace {

using namespace std::chrono_literals;

// A work whose first wait sleeps out its timeout, completes, and throws the
// timeout c10d's own wait throws when the deadline passes first: the race,
// made certain. Later waits give the work's own result.
class CompletesAsItsFirstWaitTimesOut : public c10d::Work {
 public:
  explicit CompletesAsItsFirstWaitTimesOut(std::string own_error = "") : own_error_(std::move(own_error)) {}
  bool isCompleted() override { return completed_; }
  bool wait(std::chrono::milliseconds timeout) override {
    if (waits_++ == 0) {
      std::this_thread::sleep_for(timeout);
      completed_ = true;
      throw std::runtime_error("Operation timed out!");
    }
    if (!own_error_.empty()) throw std::runtime_error(own_error_);
    return true;
  }
  int waits() const { return waits_; }

 private:
  std::string own_error_;
  std::atomic<bool> completed_{false};
  std::atomic<int> waits_{0};
};

std::shared_ptr<const std::atomic<bool>> not_closing() { return std::make_shared<const std::atomic<bool>>(false); }

TEST(BackendWork, CompletedAsASliceTimedOutIsDone) {
  auto work = c10::make_intrusive<CompletesAsItsFirstWaitTimesOut>();
  bool finished = false;
  zero::comm::BackendWork w(work, [&] { finished = true; }, "barrier on group 'world'", 300s, not_closing());
  EXPECT_NO_THROW(w.wait());
  EXPECT_TRUE(finished);
}

TEST(BackendWork, CompletedWithItsOwnErrorAsASliceTimedOutNamesThatError) {
  auto work = c10::make_intrusive<CompletesAsItsFirstWaitTimesOut>("Connection closed by peer");
  zero::comm::BackendWork w(work, nullptr, "barrier on group 'world'", 300s, not_closing());
  try {
    w.wait();
    FAIL() << "no error";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("Connection closed by peer"), std::string::npos) << what;
    EXPECT_EQ(what.find("timed out"), std::string::npos) << what;
  }
}

}  // namespace
