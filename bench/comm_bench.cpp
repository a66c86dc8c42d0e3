// Collective bandwidth of the shared-memory fast path -- zero-copy (inputs
// in shared flat buffers, as the engine's are) and staged (ordinary
// tensors) -- against Gloo, by message size, with memcpy bandwidth measured
// in the same run as the reference. Run under zero-run; rank 0 prints one
// JSON object.
//
//   build/zero-run -n 2 -- build/bench/bench_comm [max_mib]
//
// Bandwidth is the full buffer (allgather output, reduce-scatter input,
// all-reduce tensor) over the time of one collective, the median of several
// (each sample a run of them back to back, each one waited on, every rank
// starting together after a barrier).
// memcpy: every rank at once copying a buffer of the same size into another
// (pre-faulted; each sample at least 64 MiB of copies; median of 9).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/gloo_transport.h"
#include "comm/shm_transport.h"
#include "memory/page_buffer.h"
#include "zero/comm.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int reps_for(int64_t bytes) { return static_cast<int>(std::clamp<int64_t>((256 << 20) / bytes, 3, 15)); }

// A sample is `inner` collectives back to back (each waited on): at least
// 64 MiB of buffer or 256 collectives, as the gathers of a training step run
// one after another. The ranks start each sample together: after the
// (TCP) barrier, whose exit is staggered by tens of microseconds, one small
// all-reduce on the group's fast path lines them up.
template <typename F>
double time_collective(zero::comm::Comm& comm, const zero::comm::Group& g, int64_t bytes, F&& run) {
  run();  // warm: first touch of buffers and segments
  const int inner = static_cast<int>(std::clamp<int64_t>((64 << 20) / bytes, 1, 256));
  at::Tensor align = at::zeros({16});
  std::vector<double> s;
  for (int i = 0, n = reps_for(bytes); i < n; ++i) {
    comm.barrier(g)->wait();
    comm.all_reduce(g, align)->wait();
    const auto t0 = Clock::now();
    for (int k = 0; k < inner; ++k) run();
    s.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / inner);
  }
  return median(s);
}

// Every rank copies at once, as in a collective: they share the memory bus.
double memcpy_seconds(zero::comm::Comm& comm, const zero::comm::Group& g, int64_t bytes) {
  std::vector<char> a(bytes), b(bytes);
  std::memset(a.data(), 1, bytes);  // every page faulted in before timing
  std::memset(b.data(), 0, bytes);
  const int inner = static_cast<int>(std::max<int64_t>(1, (64 << 20) / bytes));
  std::vector<double> s;
  for (int i = 0; i < 10; ++i) {
    comm.barrier(g)->wait();
    const auto t0 = Clock::now();
    for (int k = 0; k < inner; ++k) {
      std::memcpy(b.data(), a.data(), bytes);
      asm volatile("" : : "r"(b.data()) : "memory");
    }
    if (i > 0) s.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / inner);  // 0: warm-up
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
    nlohmann::json row = {{"bytes", numel * 4}};
    const double mc = memcpy_seconds(comm, g, numel * 4);
    row["memcpy_gbps"] = numel * 4 / mc / 1e9;
    for (const char* t : {"zero_copy", "staged", "gloo"}) {
      const bool shared = std::strcmp(t, "zero_copy") == 0;
      comm.set_fast_paths_enabled(std::strcmp(t, "gloo") != 0);
      // The engine's buffers (shared memfds) or ordinary tensors.
      auto make = [&](int64_t m) { return shared ? zero::memory::zeros_flat(m, at::kFloat) : at::empty({m}); };
      at::Tensor full = make(numel), shard = make(numel / n);
      full.fill_(1.0);
      shard.fill_(1.0);
      const int64_t zc0 = zero::comm::shm_zero_copy_collectives(g);
      const double ag = time_collective(comm, g, numel * 4, [&] { comm.all_gather(g, full, shard)->wait(); });
      const double rs = time_collective(comm, g, numel * 4, [&] { comm.reduce_scatter(g, shard, full)->wait(); });
      const double ar = time_collective(comm, g, numel * 4, [&] { comm.all_reduce(g, full)->wait(); });
      row[t] = {{"allgather_gbps", numel * 4 / ag / 1e9},
                {"reduce_scatter_gbps", numel * 4 / rs / 1e9},
                {"all_reduce_gbps", numel * 4 / ar / 1e9},
                {"zero_copy_collectives", zero::comm::shm_zero_copy_collectives(g) - zc0}};
    }
    comm.set_fast_paths_enabled(true);
    for (const char* op : {"allgather_gbps", "reduce_scatter_gbps", "all_reduce_gbps"}) {
      const double zc = row["zero_copy"][op].get<double>(), st = row["staged"][op].get<double>();
      row["zero_copy_over_memcpy"][op] = zc / row["memcpy_gbps"].get<double>();
      row["staged_over_memcpy"][op] = st / row["memcpy_gbps"].get<double>();
      row["zero_copy_over_staged"][op] = zc / st;
      row["staged_over_gloo"][op] = st / row["gloo"][op].get<double>();
    }
    rows.push_back(row);
  }
  // What TORCH_DISTRIBUTED_DEBUG=DETAIL adds before each NCCL collective:
  // the signature check on the group's Gloo lane (comm/nccl_transport.h),
  // beside a small all-reduce on the fast path, in microseconds.
  const zero::comm::Signature sig{"allgather of 4096 BFloat16 [bench]"};
  const double check_s = time_collective(comm, g, 4096, [&] {
    zero::comm::check_signature_on_host(g, zero::comm::CollectiveOp::AllGather, sig);
  });
  at::Tensor small = at::zeros({1024});
  const double small_s = time_collective(comm, g, 4096, [&] { comm.all_reduce(g, small)->wait(); });
  if (world->rank() == 0) {
    nlohmann::json out = {{"bench", "comm"}, {"ranks", n}, {"dtype", "fp32"}, {"rows", rows},
                          {"debug_signature_check_us", check_s * 1e6},
                          {"fast_path_4kib_all_reduce_us", small_s * 1e6}};
    std::printf("%s\n", out.dump(2).c_str());
  }
  return 0;
}
