// Seed 001's measurement: collective bandwidth on CUDA tensors through the
// CUDA IPC transport and through NCCL, by message size, against the
// device-to-device copy rate measured in the same run (every rank copying a
// buffer of the same size at once). Run under zero-run on a GPU machine;
// ranks share the GPUs round-robin (NCCL is measured only with a GPU per
// rank: it refuses two ranks on one). Rank 0 prints one JSON object.
//
//   build/zero-run -n 2 -- build/bench/bench_cuda_comm [max_mib]
//
// Bandwidth is the full buffer (allgather output, reduce-scatter input,
// all-reduce tensor) over the time of one collective, device synchronized,
// the median of several with every rank starting after a barrier.
// STATUS: ran on an H100 (2026-11-26; CUDA IPC only, one GPU: docs/gpu.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "zero/comm.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int reps_for(int64_t bytes) { return static_cast<int>(std::clamp<int64_t>((1LL << 30) / bytes, 5, 50)); }

template <typename F>
double time_on_device(zero::comm::Comm& comm, const zero::comm::Group& g, int64_t bytes, F&& run) {
  run();
  torch::cuda::synchronize();
  std::vector<double> s;
  for (int i = 0, n = reps_for(bytes); i < n; ++i) {
    comm.barrier(g)->wait();
    const auto t0 = Clock::now();
    run();
    torch::cuda::synchronize();
    s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(s);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t max_bytes = (argc > 1 ? std::atoll(argv[1]) : 1024) << 20;
  auto world = zero::init_distributed();
  auto& comm = world->comm();
  const auto& g = world->group();
  const int n = g.size();
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "bench_cuda_comm: no CUDA device\n");
    return 2;
  }
  const int gpus = static_cast<int>(torch::cuda::device_count());
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(world->rank() % gpus));
  const bool nccl_possible = gpus >= n;
  const auto opts = at::TensorOptions().device(device);
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t bytes = 1 << 20; bytes <= max_bytes; bytes *= 4) {
    const int64_t numel = bytes / 2 / n * n;  // bf16, divisible by the group
    auto full = at::ones({numel}, opts.dtype(at::kBFloat16));
    auto shard = at::ones({numel / n}, opts.dtype(at::kBFloat16));
    auto copy_dst = at::empty_like(full);
    const int64_t b = numel * 2;
    nlohmann::json row = {{"bytes", b}};
    // Read + write of every byte, as a collective's copies.
    row["d2d_copy_gbps"] = b / time_on_device(comm, g, b, [&] { copy_dst.copy_(full); }) / 1e9;
    for (bool ipc : {true, false}) {
      if (!ipc && !nccl_possible) continue;
      comm.set_fast_paths_enabled(ipc);  // off: CUDA collectives go to NCCL
      const char* t = ipc ? "cuda_ipc" : "nccl";
      row[t] = {{"allgather_gbps", b / time_on_device(comm, g, b, [&] { comm.all_gather(g, full, shard)->wait(); }) / 1e9},
                {"reduce_scatter_gbps",
                 b / time_on_device(comm, g, b, [&] { comm.reduce_scatter(g, shard, full)->wait(); }) / 1e9},
                {"all_reduce_gbps", b / time_on_device(comm, g, b, [&] { comm.all_reduce(g, full)->wait(); }) / 1e9}};
      full.fill_(1.0);
    }
    comm.set_fast_paths_enabled(true);
    for (const char* op : {"allgather_gbps", "reduce_scatter_gbps", "all_reduce_gbps"}) {
      row["cuda_ipc_over_d2d_copy"][op] = row["cuda_ipc"][op].get<double>() / row["d2d_copy_gbps"].get<double>();
      if (row.contains("nccl"))
        row["cuda_ipc_over_nccl"][op] = row["cuda_ipc"][op].get<double>() / row["nccl"][op].get<double>();
    }
    rows.push_back(row);
  }
  if (world->rank() == 0) {
    nlohmann::json out = {{"bench", "cuda_comm"}, {"ranks", n}, {"gpus", gpus}, {"dtype", "bf16"}, {"rows", rows}};
    std::printf("%s\n", out.dump(2).c_str());
  }
  return 0;
}
