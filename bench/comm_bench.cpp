// Collective bandwidth of the shared-memory fast path against Gloo, by
// message size, with memcpy bandwidth measured in the same run as the
// ceiling. Run under zero-run; rank 0 prints one JSON object.
//
//   build/zero-run -n 2 -- build/bench/bench_comm [max_mib]
//
// Bandwidth is the full buffer (allgather output, reduce-scatter input,
// all-reduce tensor) over the time of one collective, the median of several
// (each one waited on, with every rank starting together after a barrier).
// memcpy: every rank at once copying a buffer of the same size into another.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "zero/comm.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int reps_for(int64_t bytes) { return static_cast<int>(std::clamp<int64_t>((256 << 20) / bytes, 3, 30)); }

template <typename F>
double time_collective(zero::comm::Comm& comm, const zero::comm::Group& g, int64_t bytes, F&& run) {
  run();  // warm: first touch of buffers and segments
  std::vector<double> s;
  for (int i = 0, n = reps_for(bytes); i < n; ++i) {
    comm.barrier(g)->wait();
    const auto t0 = Clock::now();
    run();
    s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(s);
}

// Every rank copies at once, as in a collective: they share the memory bus.
double memcpy_seconds(zero::comm::Comm& comm, const zero::comm::Group& g, int64_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  const int inner = static_cast<int>(std::max<int64_t>(1, (1 << 20) / bytes));  // above timer resolution
  std::vector<double> s;
  for (int i = 0, n = reps_for(bytes) + 1; i < n; ++i) {
    comm.barrier(g)->wait();
    const auto t0 = Clock::now();
    for (int k = 0; k < inner; ++k) {
      std::memcpy(b.data(), a.data(), bytes);
      asm volatile("" : : "r"(b.data()) : "memory");
    }
    s.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / inner);
  }
  return median(s);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t max_bytes = (argc > 1 ? std::atoll(argv[1]) : 256) << 20;
  auto world = zero::init_distributed();
  auto& comm = world->comm();
  const auto& g = world->group();
  const int n = g.size();
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t bytes = 4 << 10; bytes <= max_bytes; bytes *= 4) {
    const int64_t numel = bytes / 4 / n * n;  // fp32, divisible by the group
    auto full = at::ones({numel});
    auto shard = at::ones({numel / n});
    nlohmann::json row = {{"bytes", numel * 4}};
    const double mc = memcpy_seconds(comm, g, numel * 4);
    row["memcpy_gbps"] = numel * 4 / mc / 1e9;
    for (bool shm : {true, false}) {
      comm.set_fast_paths_enabled(shm);
      const char* t = shm ? "shm" : "gloo";
      const double ag = time_collective(comm, g, numel * 4, [&] { comm.all_gather(g, full, shard)->wait(); });
      const double rs = time_collective(comm, g, numel * 4, [&] { comm.reduce_scatter(g, shard, full)->wait(); });
      const double ar = time_collective(comm, g, numel * 4, [&] { comm.all_reduce(g, full)->wait(); });
      row[t] = {{"allgather_gbps", numel * 4 / ag / 1e9},
                {"reduce_scatter_gbps", numel * 4 / rs / 1e9},
                {"all_reduce_gbps", numel * 4 / ar / 1e9}};
      full.fill_(1.0);
    }
    comm.set_fast_paths_enabled(true);
    for (const char* op : {"allgather_gbps", "reduce_scatter_gbps", "all_reduce_gbps"}) {
      row["shm_over_gloo"][op] = row["shm"][op].get<double>() / row["gloo"][op].get<double>();
      row["shm_over_memcpy"][op] = row["shm"][op].get<double>() / row["memcpy_gbps"].get<double>();
    }
    rows.push_back(row);
  }
  if (world->rank() == 0) {
    nlohmann::json out = {{"bench", "comm"}, {"ranks", n}, {"dtype", "fp32"}, {"rows", rows}};
    std::printf("%s\n", out.dump(2).c_str());
  }
  return 0;
}
