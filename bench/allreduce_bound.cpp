// What an in-place all-reduce between processes on this host can reach at
// best: the zero-copy all-reduce's data movement alone, with no library in
// the way. N forked processes share their buffers; each round, rank r sums
// slice r of every buffer into its own (reading what its peers wrote the
// round before), all meet, and each copies the others' summed slices (which
// they have just written); all meet again. The meetings are bare polled
// counters, not the lane's protocol, and only the two data phases are
// timed. Every byte a peer contributes crosses between cores once each way
// -- the 2(N-1)/N x size any all-reduce moves -- and, as in training, it was
// written moments before by another core, so it comes from that core's cache,
// not this one's. Compare bench_comm's zero-copy all-reduce to this, and
// this to memcpy (every rank copying a buffer of the same size at once, as
// bench_comm's reference) measured in the same pass.
//
//   build/bench/bench_allreduce_bound [ranks] [max_mib]     (prints JSON)
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/shm/reduce_kernels.h"

namespace {

using Clock = std::chrono::steady_clock;
// Rounds per pass: 400 at 1 MiB, fewer for bigger buffers (8 at 256 MiB).
int rounds_for(int64_t bytes) { return static_cast<int>(std::clamp<int64_t>((int64_t{1} << 30) / bytes, 8, 400)); }

struct alignas(64) Counter {
  std::atomic<int64_t> value;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Seconds {
  double pattern, memcpy;
};

// Per round of the two data phases and per memcpy of the same size (every
// rank copying at once, in cache), medians, for `numel` floats.
Seconds measure(int ranks, int64_t numel) {
  const int64_t bytes = numel * 4;
  const size_t region = 4096 + ranks * bytes;  // the counters' page, then the buffers
  void* mem = mmap(nullptr, region, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) std::abort();
  auto* counters = static_cast<Counter*>(mem);
  auto* data = reinterpret_cast<float*>(static_cast<char*>(mem) + 4096);
  std::memset(mem, 0, region);
  const int64_t per = ((numel + ranks - 1) / ranks + 15) / 16 * 16;  // slices of whole cache lines
  const auto lo = [&](int q) { return std::min(numel, q * per); };
  const auto hi = [&](int q) { return std::min(numel, (q + 1) * per); };
  std::vector<pid_t> children;
  int me = 0;
  for (int r = 1; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      me = r;
      break;
    }
    children.push_back(pid);
  }
  // One CPU each (where there are enough): a polled meeting with two ranks
  // on one CPU would wait out the scheduler's time slice.
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_COUNT(&allowed) >= ranks) {
    int nth = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &allowed) && nth++ == me) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        sched_setaffinity(0, sizeof(one), &one);
        break;
      }
  }
  int64_t meetings = 0;
  const auto meet = [&] {
    ++meetings;
    counters[me].value.store(meetings, std::memory_order_release);
    for (int q = 0; q < ranks; ++q)
      while (counters[q].value.load(std::memory_order_acquire) < meetings) {
      }
  };
  float* mine = data + me * numel;
  std::vector<const void*> srcs(ranks);  // slice `me` of every buffer, summed by the collective's kernel
  for (int q = 0; q < ranks; ++q) srcs[q] = data + q * numel + lo(me);
  std::vector<double> pattern;
  for (int round = 0, n = rounds_for(bytes); round < n; ++round) {
    meet();
    const auto t0 = Clock::now();
    zero::comm::shm::sum_in_rank_order(srcs.data(), ranks, zero::comm::shm::Elem::F32, mine + lo(me),
                                       zero::comm::shm::Elem::F32, hi(me) - lo(me), false);
    const auto t1 = Clock::now();
    meet();
    const auto t2 = Clock::now();
    for (int q = 0; q < ranks; ++q)
      if (q != me) std::memcpy(mine + lo(q), data + q * numel + lo(q), (hi(q) - lo(q)) * 4);
    const auto t3 = Clock::now();
    pattern.push_back(std::chrono::duration<double>((t1 - t0) + (t3 - t2)).count());
  }
  std::vector<char> a(bytes, 1), b(bytes, 0);
  const int inner = static_cast<int>(std::max<int64_t>(1, (64 << 20) / bytes));
  std::vector<double> copies;
  for (int i = 0; i < 9; ++i) {
    meet();
    const auto t0 = Clock::now();
    for (int k = 0; k < inner; ++k) {
      std::memcpy(b.data(), a.data(), bytes);
      asm volatile("" : : "r"(b.data()) : "memory");
    }
    copies.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / inner);
  }
  if (me != 0) _exit(0);
  sched_setaffinity(0, sizeof(allowed), &allowed);  // the next pass forks from here
  for (pid_t c : children) waitpid(c, nullptr, 0);
  munmap(mem, region);
  return {median(pattern), median(copies)};
}

}  // namespace

int main(int argc, char** argv) {
  const int ranks = argc > 1 ? std::atoi(argv[1]) : 2;
  const int64_t max_bytes = (argc > 2 ? std::atoll(argv[2]) : 64) << 20;
  std::printf("{\"bench\": \"allreduce_bound\", \"ranks\": %d, \"dtype\": \"fp32\", \"rows\": [", ranks);
  bool first = true;
  for (int64_t bytes = 1 << 20; bytes <= max_bytes; bytes *= 4) {
    // A bound is the best the machine does: of three passes (each a median
    // over its rounds), the fastest, with the memcpy of that same pass. A
    // neighbour on the shared machine slows a whole pass, not single rounds.
    Seconds s = measure(ranks, bytes / 4);
    for (int pass = 1; pass < 3; ++pass) {
      const Seconds t = measure(ranks, bytes / 4);
      if (t.pattern < s.pattern) s = t;
    }
    std::printf(
        "%s\n  {\"bytes\": %lld, \"memcpy_gbps\": %.2f, \"allreduce_bound_gbps\": %.2f, "
        "\"bound_over_memcpy\": %.3f}",
        first ? "" : ",", static_cast<long long>(bytes), bytes / s.memcpy / 1e9, bytes / s.pattern / 1e9,
        s.memcpy / s.pattern);
    first = false;
  }
  std::printf("\n]}\n");
  return 0;
}
