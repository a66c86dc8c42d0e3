#include "comm/gloo_lane.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <sstream>

#include "comm/signature.h"
#include "comm/work.h"

namespace zero::comm {

// A submitted collective: launched by the lane's thread, then waited for
// like any c10d work.
struct GlooLane::Job {
  std::string what;  // "allgather on group 'dp' (ranks 0,1)"
  std::string op;
  std::string group;
  std::vector<int> ranks;
  SignatureRecord record;
  Launch launch;
  std::function<void()> finish;

  std::mutex mu;
  std::condition_variable cv;
  bool settled = false;
  std::shared_ptr<BackendWork> work;  // once launched
  std::optional<std::string> error;   // or why it was not
  bool mismatch = false;

  void settle(std::shared_ptr<BackendWork> w, std::optional<std::string> e, bool is_mismatch = false) {
    {
      std::lock_guard<std::mutex> lock(mu);
      settled = true;
      work = std::move(w);
      error = std::move(e);
      mismatch = is_mismatch;
    }
    cv.notify_all();
  }
};

namespace {

class LaneWork : public Work {
 public:
  explicit LaneWork(std::shared_ptr<GlooLane::Job> job) : job_(std::move(job)) {}
  void wait() override {
    std::shared_ptr<BackendWork> work;
    {
      std::unique_lock<std::mutex> lock(job_->mu);
      job_->cv.wait(lock, [&] { return job_->settled; });
      if (job_->error && job_->mismatch) throw CollectiveMismatch(*job_->error);
      if (job_->error) throw CommError(*job_->error);
      work = job_->work;
    }
    if (work) work->wait();  // none for a signature check alone
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(job_->mu);
    return job_->settled && (job_->error || !job_->work || job_->work->is_completed());
  }

 private:
  std::shared_ptr<GlooLane::Job> job_;
};

}  // namespace

GlooLane::GlooLane(c10::intrusive_ptr<c10d::Backend> backend, std::chrono::milliseconds timeout)
    : backend_(std::move(backend)), timeout_(timeout), thread_([this] { run(); }) {}

GlooLane::~GlooLane() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  closing_->store(true, std::memory_order_release);
  cv_.notify_all();
  thread_.join();
  for (auto& job : queue_) job->settle(nullptr, job->what + " failed: its group was destroyed");
  const auto running = std::count_if(in_flight_.begin(), in_flight_.end(), [](const auto& w) { return !w->isCompleted(); });
  if (running > 0) {
    // Gloo's threads stay blocked in it until the collective timeout; the
    // process may exit before that. Kept for the life of the process.
    static auto* abandoned = new std::vector<c10::intrusive_ptr<c10d::Backend>>();
    static std::mutex abandoned_mu;
    std::lock_guard<std::mutex> lock(abandoned_mu);
    abandoned->push_back(backend_);
  }
}

void GlooLane::launched(const c10::intrusive_ptr<c10d::Work>& work) {
  in_flight_.erase(std::remove_if(in_flight_.begin(), in_flight_.end(), [](const auto& w) { return w->isCompleted(); }),
                   in_flight_.end());
  in_flight_.push_back(work);
}

WorkHandle GlooLane::check(const Group& g, const char* op, const Signature& sig) {
  return submit(g, op, sig, nullptr, nullptr);
}

WorkHandle GlooLane::submit(const Group& g, const char* op, const Signature& sig, Launch launch,
                            std::function<void()> finish) {
  auto job = std::make_shared<Job>();
  job->op = op;
  job->group = g.describe();
  job->what = job->op + " on " + job->group;
  job->ranks = g.global_ranks();
  job->record = make_signature_record(sig.text);
  job->launch = std::move(launch);
  job->finish = std::move(finish);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(job);
  }
  cv_.notify_one();
  return std::make_shared<LaneWork>(job);
}

void GlooLane::check_signatures(Job& job) {
  constexpr int64_t kBytes = sizeof(SignatureRecord);
  const int n = static_cast<int>(job.ranks.size());
  auto in = at::empty({kBytes}, at::kByte);
  std::memcpy(in.data_ptr(), &job.record, kBytes);
  auto all = at::empty({kBytes * n}, at::kByte);
  std::vector<std::vector<at::Tensor>> outs(1);
  for (int r = 0; r < n; ++r) outs[0].push_back(all.narrow(0, r * kBytes, kBytes));
  std::vector<at::Tensor> ins{in};
  auto exchange = backend_->allgather(outs, ins);
  launched(exchange);
  BackendWork(exchange, nullptr, job.what, timeout_, closing_).wait();
  const auto* records = reinterpret_cast<const SignatureRecord*>(all.data_ptr());
  const std::string error = describe_disagreement(job.op, job.group, records, n,
                                                  [&](int q) { return "rank " + std::to_string(job.ranks[q]); });
  if (!error.empty()) throw CollectiveMismatch(error);
}

void GlooLane::run() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      job = queue_.front();
      queue_.pop_front();
    }
    if (mismatch_) {
      job->settle(nullptr, *mismatch_, /*is_mismatch=*/true);
      continue;
    }
    try {
      check_signatures(*job);
      if (!job->launch) {  // check()
        job->settle(nullptr, std::nullopt);
        continue;
      }
      auto launched_work = job->launch(*backend_);
      launched(launched_work);
      auto work = std::make_shared<BackendWork>(launched_work, std::move(job->finish), job->what, timeout_, closing_);
      job->settle(std::move(work), std::nullopt);
    } catch (const CollectiveMismatch& e) {
      mismatch_ = e.what();
      job->settle(nullptr, *mismatch_, /*is_mismatch=*/true);
    } catch (const std::exception& e) {
      // BackendWork's message already names op, group and timeout.
      job->settle(nullptr, std::string(e.what()));
    }
  }
}

}  // namespace zero::comm
