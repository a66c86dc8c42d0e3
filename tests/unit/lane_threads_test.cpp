// The shared-memory lane's queue under ThreadSanitizer: two forked ranks,
// each with several collectives in flight, waited on by several threads at
// once (so the lane's worker and the waiting callers take turns running
// them); lanes torn down while a caller waits on work no peer will ever
// match, one with an input published for zero-copy that must outlive it.
// Built with -fsanitize=thread (tests/CMakeLists.txt): a data race fails
// the run (TSan's exit code), as does a wrong sum or a hang.
// No torch, no gtest: a plain program, one process per rank.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/shm/lane.h"

namespace shm = zero::comm::shm;

namespace {

constexpr int kRanks = 2;
constexpr int64_t kSlot = 4096;
constexpr auto kTimeout = std::chrono::milliseconds(20000);

void* new_region() {
  void* r =
      mmap(nullptr, shm::Lane::region_bytes(kRanks, kSlot), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (r == MAP_FAILED) std::abort();
  shm::Lane::format(r, kRanks, kSlot);
  return r;
}

// Rounds of 6 all-reduces of 3000 floats (each several slots): two threads
// wait on jobs in the middle while this one waits on the last, or polls.
int sums_with_concurrent_waiters(shm::Lane& lane, int rank) {
  int wrong = 0;
  const auto sig = zero::comm::make_signature_record("all_reduce of 3000 Float");
  for (int round = 0; round < 100; ++round) {
    std::vector<std::vector<float>> data(6, std::vector<float>(3000, static_cast<float>(rank + 1)));
    std::vector<std::shared_ptr<shm::Job>> jobs;
    for (auto& d : data) jobs.push_back(lane.all_reduce(d.data(), shm::Elem::F32, 3000, false, sig, nullptr));
    std::thread a([&] { jobs[3]->wait(); });
    std::thread b([&] { jobs[1]->wait(); });
    if (round % 3 == 0) {
      jobs[5]->wait();
    } else {
      for (auto& j : jobs)
        while (!j->done()) std::this_thread::yield();  // the worker runs them
    }
    a.join();
    b.join();
    for (auto& j : jobs) j->wait();
    for (auto& d : data) wrong += d.front() != 3.0f || d.back() != 3.0f;
  }
  return wrong;
}

// A collective's keep-alive (its buffers) is released before its job is
// done, whether the worker or the waiting caller ran it: a caller that lets
// go of its own references once wait() returns frees the buffers itself, not
// the lane's thread a moment later (a grad buffer freed after the backward
// has ended is not kept for the next: memory/shared_arena.h). Returns how
// many of 40 were released after their job was done.
int keep_alive_goes_before_the_job_is_done(shm::Lane& lane) {
  struct Probe {
    std::atomic<shm::Job*> job{nullptr};
    std::atomic<int> late{0};
  };
  auto probe = std::make_shared<Probe>();
  const auto sig = zero::comm::make_signature_record("a probe of when its buffers go");
  for (int i = 0; i < 40; ++i) {
    std::atomic<bool> published{false};
    shm::Lane::KeepAlive keep(nullptr, [probe](const void*) {
      shm::Job* job = probe->job.load();
      if (job == nullptr || job->done()) ++probe->late;
    });
    auto job = lane.external("probe", sig, std::move(keep), [&](const shm::Lane::Handshake& handshake) {
      while (!published) std::this_thread::yield();  // until the probe knows its job
      handshake();
    });
    probe->job = job.get();
    published = true;
    if (i % 2 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the worker runs it
    job->wait();
    probe->job = nullptr;
  }
  if (probe->late > 0) std::fprintf(stderr, "%d of 40 collectives let go of their buffers after they were done\n",
                                    probe->late.load());
  return probe->late;
}

// Rank 1 alone, on a lane of its own: a caller waits on the second of two
// collectives nobody else joins; tearing the lane down must fail both,
// with the shutdown named, and return.
int teardown_while_waiting(int rank) {
  auto lane = std::make_unique<shm::Lane>(new_region(), rank, kRanks, kSlot, kTimeout, "a lane nobody joins");
  const auto sig = zero::comm::make_signature_record("all_reduce of 10 Float");
  std::vector<float> d(10);
  auto first = lane->all_reduce(d.data(), shm::Elem::F32, 10, false, sig, nullptr);
  auto second = lane->all_reduce(d.data(), shm::Elem::F32, 10, false, sig, nullptr);
  std::string error;
  std::thread waiter([&] {
    try {
      second->wait();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  lane.reset();
  waiter.join();
  const bool ok = first->done() && error.find("shut down") != std::string::npos;
  if (!ok) std::fprintf(stderr, "teardown: first done %d, waiter's error '%s'\n", first->done(), error.c_str());
  return ok ? 0 : 1;
}

// Rank 1 alone again: an all_gather that published its input for a
// zero-copy round fails when the lane is torn down while it waits for rank
// 0. A peer could still map and read that input later (lane.pml, STOP), so
// the lane must keep it -- here the keep-alive -- past its end; a staged
// collective's it lets go.
int teardown_keeps_a_published_input(int rank) {
  int failures = 0;
  for (const bool zero_copy : {true, false}) {
    bool checked = false;
    for (int attempt = 0; attempt < 5 && !checked; ++attempt) {
      auto lane = std::make_unique<shm::Lane>(new_region(), rank, kRanks, kSlot, kTimeout, "a lane nobody joins",
                                              zero_copy);
      const auto sig = zero::comm::make_signature_record("allgather of 16 Float");
      std::vector<float> in(16), out(32);
      auto keep = std::make_shared<int>(0);
      const std::weak_ptr<int> kept = keep;
      const shm::BufferRef ref{getpid(), 0, /*inode: shareable*/ 1, 4096, 0};
      auto job = lane->all_gather(out.data(), shm::Elem::F32, in.data(), shm::Elem::F32, 16, sig, std::move(keep), ref);
      std::string error;
      std::thread waiter([&] {
        try {
          job->wait();
        } catch (const std::exception& e) {
          error = e.what();
        }
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(100 << attempt));
      lane.reset();
      waiter.join();
      if (error.find("while waiting for rank 0") == std::string::npos) continue;  // it never started: again
      checked = true;
      if (kept.expired() == zero_copy) {
        std::fprintf(stderr, "teardown (zero-copy %d): the failed collective's buffers %s\n", zero_copy,
                     zero_copy ? "were let go" : "were kept");
        ++failures;
      }
    }
    if (!checked) {
      std::fprintf(stderr, "teardown (zero-copy %d): the collective never started\n", zero_copy);
      ++failures;
    }
  }
  return failures;
}

}  // namespace

int main() {
  void* region = new_region();
  const pid_t child = fork();
  const int rank = child == 0 ? 1 : 0;
  int failures = 0;
  {
    shm::Lane lane(region, rank, kRanks, kSlot, kTimeout, "the test group");
    failures += sums_with_concurrent_waiters(lane, rank);
    failures += keep_alive_goes_before_the_job_is_done(lane);
  }
  if (rank == 1) failures += teardown_while_waiting(rank);
  if (rank == 1) failures += teardown_keeps_a_published_input(rank);
  std::printf("rank %d: %d failures\n", rank, failures);
  if (rank == 1) return failures == 0 ? 0 : 1;
  int status = 0;
  waitpid(child, &status, 0);
  const bool child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!child_ok) std::fprintf(stderr, "rank 1 failed (status %d)\n", status);
  return failures == 0 && child_ok ? 0 : 1;
}
