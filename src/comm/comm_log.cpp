#include "comm/comm_log.h"

#include <atomic>
#include <mutex>
#include <utility>

namespace zero::comm::comm_log {

namespace {

std::atomic<bool> g_enabled{false};
std::mutex g_mu;
std::vector<Record> g_records;

const char* deepspeed_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::AllGather: return "all_gather_into_tensor";
    case CollectiveOp::ReduceScatter: return "reduce_scatter_tensor";
    case CollectiveOp::AllReduce: return "all_reduce";
    case CollectiveOp::Broadcast: return "broadcast";
    case CollectiveOp::Barrier: return "barrier";
  }
  return "?";
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// A handle whose completion, seen by wait() or is_completed(), logs the
// time in the issuing call plus the time waited.
class TimedWork : public Work {
 public:
  TimedWork(WorkHandle inner, Record record) : inner_(std::move(inner)), record_(std::move(record)) {}
  ~TimedWork() override { log(0.0); }  // never waited on: the call's time alone

  void wait() override {
    const auto start = Clock::now();
    try {
      inner_->wait();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      logged_ = true;  // it failed: nothing to log
      throw;
    }
    log(ms_since(start));
  }
  bool is_completed() override {
    const bool done = inner_->is_completed();
    if (done) log(0.0);
    return done;
  }

 private:
  void log(double waited_ms) {
    std::lock_guard<std::mutex> lock(mu_);
    if (logged_) return;
    logged_ = true;
    record_.ms += waited_ms;
    std::lock_guard<std::mutex> all(g_mu);
    g_records.push_back(record_);
  }

  WorkHandle inner_;
  Record record_;
  std::mutex mu_;
  bool logged_ = false;
};

}  // namespace

void set_enabled(bool on) { g_enabled.store(on, std::memory_order_release); }
bool enabled() { return g_enabled.load(std::memory_order_acquire); }

std::vector<Record> drain() {
  std::lock_guard<std::mutex> lock(g_mu);
  return std::exchange(g_records, {});
}

WorkHandle timed(CollectiveOp op, int64_t message_bytes, int group_size, Clock::time_point issued,
                 WorkHandle work) {
  if (!enabled() || !work) return work;
  return std::make_shared<TimedWork>(std::move(work),
                                     Record{deepspeed_name(op), message_bytes, group_size, ms_since(issued)});
}

}  // namespace zero::comm::comm_log
