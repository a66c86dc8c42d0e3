// Runs jobs one after another on a thread of its own: the steps of a
// hierarchical collective (hierarchical_transport.h), which must not
// interleave on a lane's sub-groups, while the caller goes on.
//
// Failure and teardown. A lane's sub-collectives pair up with the peers'
// only while every job has run on every rank: once one fails, the ones
// after it would pair with the wrong collectives, or wait out the
// collective timeout for peers that never issue them. So they fail at once,
// naming the first failure. Destroying the executor fails the jobs not yet
// begun ("cancelled") and waits only for the one running, so the teardown
// of a rank that failed alone does not take a collective timeout per job
// it had queued.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace zero::comm {

class SerialExecutor {
 public:
  SerialExecutor();
  ~SerialExecutor();  // cancels what has not begun, joins the running job
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // The future holds the job's exception, or the reason it never ran.
  std::shared_future<void> submit(std::function<void()> job);

 private:
  struct Pending {
    std::function<void()> job;
    std::promise<void> done;
  };
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  bool stop_ = false;
  std::optional<std::string> failed_;  // the first job that threw: what it said
  std::thread thread_;
};

}  // namespace zero::comm
