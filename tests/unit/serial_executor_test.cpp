// The hierarchical transport's executor: jobs in order; after a failure the
// later jobs fail at once, naming it; teardown cancels what has not begun
// instead of running it (a rank failing alone must not wait out a
// collective timeout per queued collective).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/serial_executor.h"

namespace {

using zero::comm::SerialExecutor;
using namespace std::chrono_literals;

std::string error_of(const std::shared_future<void>& f) {
  try {
    f.get();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(SerialExecutor, RunsJobsInSubmissionOrder) {
  std::vector<int> order;
  {
    SerialExecutor ex;
    std::vector<std::shared_future<void>> done;
    for (int i = 0; i < 5; ++i) done.push_back(ex.submit([&order, i] { order.push_back(i); }));
    for (auto& d : done) d.get();
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(SerialExecutor, JobsAfterAFailureFailAtOnceNamingIt) {
  SerialExecutor ex;
  std::atomic<int> ran{0};
  auto first = ex.submit([] { throw std::runtime_error("timed out waiting for rank 2"); });
  auto later = ex.submit([&] { ++ran; });
  EXPECT_EQ(error_of(first), "timed out waiting for rank 2");
  const std::string why = error_of(later);
  EXPECT_NE(why.find("an earlier collective on this lane failed: timed out waiting for rank 2"), std::string::npos)
      << why;
  EXPECT_EQ(ran.load(), 0);
}

TEST(SerialExecutor, TeardownCancelsQueuedJobsAndWaitsOnlyForTheRunningOne) {
  std::atomic<bool> release{false}, started{false};
  std::atomic<int> ran{0};
  std::vector<std::shared_future<void>> queued;
  std::shared_future<void> running;
  const auto t0 = std::chrono::steady_clock::now();
  {
    SerialExecutor ex;
    running = ex.submit([&] {
      started = true;
      while (!release) std::this_thread::sleep_for(1ms);
    });
    // Each of these would take a collective timeout with no peer to join it.
    for (int i = 0; i < 3; ++i) queued.push_back(ex.submit([&] {
      ++ran;
      std::this_thread::sleep_for(2s);
    }));
    while (!started) std::this_thread::sleep_for(1ms);
    std::thread releaser([&] {
      std::this_thread::sleep_for(50ms);
      release = true;
    });
    releaser.detach();
  }  // the destructor
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_NO_THROW(running.get());
  EXPECT_EQ(ran.load(), 0);
  for (auto& q : queued) EXPECT_NE(error_of(q).find("cancelled"), std::string::npos) << error_of(q);
  EXPECT_LT(took, 1s);
}

}  // namespace
