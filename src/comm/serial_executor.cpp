#include "comm/serial_executor.h"

#include <exception>
#include <stdexcept>
#include <utility>

namespace zero::comm {

SerialExecutor::SerialExecutor() : thread_([this] { run(); }) {}

SerialExecutor::~SerialExecutor() {
  std::deque<Pending> cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cancelled.swap(queue_);
  }
  cv_.notify_all();
  for (auto& p : cancelled)
    p.done.set_exception(std::make_exception_ptr(
        std::runtime_error("cancelled: the group was shut down before this collective began")));
  thread_.join();
}

std::shared_future<void> SerialExecutor::submit(std::function<void()> job) {
  Pending p{std::move(job), {}};
  auto done = p.done.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(p));
  }
  cv_.notify_all();
  return done;
}

void SerialExecutor::run() {
  for (;;) {
    Pending p;
    std::optional<std::string> earlier;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      p = std::move(queue_.front());
      queue_.pop_front();
      earlier = failed_;
    }
    if (earlier) {
      p.done.set_exception(
          std::make_exception_ptr(std::runtime_error("an earlier collective on this lane failed: " + *earlier)));
      continue;
    }
    try {
      p.job();
      p.done.set_value();
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        failed_ = e.what();
      }
      p.done.set_exception(std::current_exception());
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        failed_ = "an unknown exception";
      }
      p.done.set_exception(std::current_exception());
    }
  }
}

}  // namespace zero::comm
