// The GPU path, on a machine with a GPU (./run gpu-test; skipped elsewhere):
// collectives on CUDA tensors through NCCL, and the engine at stages 0-3
// (1-2 also with the optimizer offloaded to the host) with the model on the
// GPU against the same model trained in one CPU process.
//
// Ranks share the host's GPUs round-robin: several ranks on one GPU go
// through the CUDA IPC transport (NCCL refuses them); with ZERO_CUDA_IPC=off
// the multi-rank cases need a GPU per rank, and skip, saying so, without.
#include <map>
#include <optional>
#include <string>

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>

#include "comm/cuda_ipc_transport.h"
#include "fixtures.h"

namespace zero::test {
namespace {

// The GPU this rank uses, or a reason to skip.
std::string gpu_unavailable() {
  if (!torch::cuda::is_available()) return "no CUDA device";
  if (!zero::comm::cuda_ipc_allowed_by_env() && static_cast<int>(torch::cuda::device_count()) < world().size())
    return std::to_string(torch::cuda::device_count()) + " GPU(s) for " + std::to_string(world().size()) +
           " ranks with ZERO_CUDA_IPC=off: NCCL needs one per rank";
  return {};
}

at::Device my_gpu() {
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(world().rank() % torch::cuda::device_count()));
}

// Which transport served the CUDA collectives: IPC between ranks of one
// host (all of them here, unless it is off), else NCCL.
std::string cuda_transport() {
  return world().size() > 1 && zero::comm::cuda_ipc_allowed_by_env() ? "cuda_ipc" : "nccl";
}

TEST(GpuComm, CudaCollectivesMatchLocalValues) {
  if (auto why = gpu_unavailable(); !why.empty()) GTEST_SKIP() << why;
  auto& comm = world().comm();
  const auto& g = world().group();
  const int n = g.size(), r = g.rank();
  const auto before = comm.counters().totals();
  // All-gather, reduce-scatter (16-bit in, fp32 out) and all-reduce, each
  // against what every rank computes locally.
  at::Tensor shard = at::full({5}, static_cast<float>(r + 1), at::TensorOptions().device(my_gpu()));
  at::Tensor full = at::empty({5 * n}, shard.options());
  comm.all_gather(g, full, shard, "test")->wait();
  for (int k = 0; k < n; ++k) EXPECT_EQ(full[5 * k].item<float>(), static_cast<float>(k + 1));
  at::Tensor grads = at::ones({4 * n}, shard.options().dtype(at::kBFloat16));
  at::Tensor reduced = at::empty({4}, shard.options());
  comm.reduce_scatter(g, reduced, grads, zero::comm::ReduceOp::Sum, "test")->wait();
  EXPECT_EQ(reduced.sum().item<float>(), 4.0f * n);
  at::Tensor t = at::full({3}, 2.0f, shard.options());
  comm.all_reduce(g, t, zero::comm::ReduceOp::Avg, "test")->wait();
  EXPECT_EQ(t.sum().item<float>(), 6.0f);
  for (const auto& [op, c] : zero::comm::diff(comm.counters().totals(), before)) {
    if (op == "barrier") continue;
    EXPECT_EQ(c.calls_by_transport.count(cuda_transport()) ? c.calls_by_transport.at(cuda_transport()) : 0, c.calls)
        << op;
  }
}

constexpr int kRows = 8, kSteps = 5;

std::pair<at::Tensor, at::Tensor> batch(int step, int ranks) {
  at::manual_seed(500 + step);
  const at::Tensor x = at::randn({kRows * ranks, 32});
  return {x, x.sum(1, true).sin()};
}

Config gpu_config(int stage, const char* dtype, bool offload = false, bool offload_param = false) {
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", kRows},
                      {"gradient_clipping", 0.0},
                      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}}}}},
                      {"zero_optimization", {{"stage", stage}}}};
  if (std::string(dtype) == "bf16") j["bf16"] = {{"enabled", true}};
  if (offload) j["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (offload_param) j["zero_optimization"]["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
  return Config::from_json(j);
}

// The same collectives on CUDA tensors and on host tensors (the host
// transports' results are the tested reference): bit for bit, for every
// reducible dtype and sizes that do and do not fill the staging chunks
// (ctest runs the 2-rank case with 64 KiB chunks).
TEST(GpuComm, CudaResultsEqualTheHostTransportsBitForBit) {
  if (auto why = gpu_unavailable(); !why.empty()) GTEST_SKIP() << why;
  auto& comm = world().comm();
  const auto& g = world().group();
  const int n = g.size(), r = g.rank();
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int64_t numel : {int64_t{1}, int64_t{1000}, int64_t{65537}, int64_t{300001}}) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " x " + std::to_string(numel));
      at::manual_seed(40 + r);
      const at::Tensor mine = at::randn({numel}).to(dt);
      const at::Tensor spread = at::randn({numel * n}).to(dt);
      auto both = [&](auto&& op) {  // op(device) -> result tensor
        return std::make_pair(op(at::Device(at::kCPU)).to(at::kCPU), op(my_gpu()).to(at::kCPU));
      };
      auto [ag_cpu, ag_gpu] = both([&](at::Device d) {
        at::Tensor out = at::empty({numel * n}, mine.options().device(d));
        comm.all_gather(g, out, mine.to(d), "bit test")->wait();
        return out;
      });
      EXPECT_TRUE(ag_cpu.equal(ag_gpu)) << "allgather";
      auto [rs_cpu, rs_gpu] = both([&](at::Device d) {
        at::Tensor out = at::empty({numel}, at::TensorOptions().dtype(at::kFloat).device(d));
        comm.reduce_scatter(g, out, spread.to(d), zero::comm::ReduceOp::Sum, "bit test")->wait();
        return out;
      });
      EXPECT_TRUE(rs_cpu.equal(rs_gpu)) << "reduce-scatter into fp32";
      auto [ar_cpu, ar_gpu] = both([&](at::Device d) {
        at::Tensor t = mine.to(d).clone();
        comm.all_reduce(g, t, zero::comm::ReduceOp::Avg, "bit test")->wait();
        return t;
      });
      EXPECT_TRUE(ar_cpu.equal(ar_gpu)) << "all-reduce (avg)";
      auto [bc_cpu, bc_gpu] = both([&](at::Device d) {
        at::Tensor t = mine.to(d).clone();
        comm.broadcast(g, t, n - 1, "bit test")->wait();
        return t;
      });
      EXPECT_TRUE(bc_cpu.equal(bc_gpu)) << "broadcast";
    }
  }
}

StockMlp mlp() { return StockMlp(32, 64); }

// torch's AdamW on the whole batch, one CPU process.
std::map<std::string, at::Tensor> cpu_reference(int ranks) {
  StockMlp ref = mlp();
  torch::optim::AdamW opt(ref->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.01).eps(1e-8));
  return train_in_one_process(ref, opt, kSteps, [&](int s) { return batch(s, ranks); });
}

TEST(GpuEngine, StagesZeroToThreeMatchTheCpuReference) {
  if (auto why = gpu_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const int n = world().size(), r = world().rank();
  const auto want = cpu_reference(n);
  for (const char* dtype : {"fp32", "bf16"}) {
    for (int run = 0; run <= 7; ++run) {
      // Stages 0-3 (3: the model is one root unit, gathered by
      // engine.forward); 1 and 2 with the optimizer offloaded to the host;
      // 3 with the params offloaded, then with both.
      const int stage = run <= 3 ? run : run <= 5 ? run - 3 : 3;
      const bool offload = (run >= 4 && run <= 5) || run == 7, offload_param = run >= 6;
      SCOPED_TRACE(std::string(dtype) + " stage " + std::to_string(stage) + (offload ? " optimizer offloaded" : "") +
                   (offload_param ? " params offloaded" : ""));
      StockMlp model = mlp();
      model->to(my_gpu());
      zero::Engine engine(*model, gpu_config(stage, dtype, offload, offload_param), world().comm(), dp_group());
      for (int s = 0; s < kSteps; ++s) {
        auto [x, y] = batch(s, n);
        const at::Tensor mine = x.narrow(0, kRows * r, kRows).to(my_gpu());
        const at::Tensor out = engine.forward(model, mine).to(at::kFloat);
        engine.backward((out - y.narrow(0, kRows * r, kRows).to(my_gpu())).pow(2).mean());
        engine.step();
      }
      // fp32: the GPU's reductions differ from the CPU's only in order;
      // bf16: params rounded to 8 bits of mantissa at every step.
      const double bound = std::string(dtype) == "fp32" ? 1e-4 : 3e-2;
      EXPECT_LT(max_abs_diff(engine.full_parameters(), want), bound);
      if (offload) {
        EXPECT_GT(engine.state_bytes().master, 0);
      }
    }
  }
}

// The bundled GPT at stage 3 on the GPU, built under zero::Init onto the
// device (seed 003: each block flattened there as it is built) -- its
// blocks are zero::Units, each gathered and released around its forward and
// backward in device memory -- against the same run in one CPU process.
TEST(GpuEngine, GptStage3MatchesTheCpuReference) {
  if (auto why = gpu_unavailable(); !why.empty()) GTEST_SKIP() << why;
  RunSpec s;
  s.stage = 3;
  const int steps = 10;
  const RunResult want = reference(s, steps);
  GptTrainer t(small_gpt(), make_config(s), corpus(), /*seed=*/7, world().comm(), dp_group(), true, my_gpu());
  for (int i = 0; i < steps; ++i) {
    const double loss = t.train_step().loss;
    // fp32 on both; the GPU sums in other orders.
    EXPECT_NEAR(loss, want.losses[i], 1e-3 * std::fabs(want.losses[i])) << "step " << i + 1;
  }
  EXPECT_GT(t.engine().peak_live_params(), 0) << "units were gathered";
}

// Seed 002 on the GPU: four backward passes inside
// engine.coalesce_grad_reduction() cost one reduce-scatter per group at
// stage 2 (four without), through NCCL, and train alike.
TEST(GpuEngine, CoalescedGradReductionIsOneReduceScatterPerGroup) {
  if (auto why = gpu_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const int n = world().size(), r = world().rank();
  std::map<std::string, at::Tensor> params[2];
  int64_t reduce_scatters[2] = {0, 0};
  for (int coalesce = 0; coalesce <= 1; ++coalesce) {
    StockMlp model = mlp();
    model->to(my_gpu());
    zero::Engine engine(*model, gpu_config(2, "fp32"), world().comm(), dp_group());
    auto [x, y] = batch(0, n);
    const at::Tensor mine = x.narrow(0, kRows * r, kRows).to(my_gpu());
    const at::Tensor target = y.narrow(0, kRows * r, kRows).to(my_gpu());
    const auto before = world().comm().counters().totals();
    {
      std::optional<zero::Engine::CoalesceGradReduction> scope;
      if (coalesce) scope.emplace(engine);
      for (int c = 0; c < 4; ++c) {
        const at::Tensor part = mine.narrow(0, c * (kRows / 4), kRows / 4);
        const at::Tensor out = engine.forward(model, part);
        engine.backward((out - target.narrow(0, c * (kRows / 4), kRows / 4)).pow(2).mean() / 4.0);
      }
    }
    engine.step();
    const auto d = zero::comm::diff(world().comm().counters().totals(), before);
    const auto rs = d.find(zero::comm::to_string(zero::comm::CollectiveOp::ReduceScatter));
    reduce_scatters[coalesce] = rs == d.end() ? 0 : rs->second.calls;
    params[coalesce] = engine.full_parameters();
  }
  EXPECT_EQ(reduce_scatters[0], 4 * reduce_scatters[1]);
  EXPECT_GT(reduce_scatters[1], 0);
  EXPECT_LT(max_abs_diff(params[0], params[1]), 1e-6);
}

// zero::Init onto the device: every block flattened there (it has room),
// its shard on the device, its full buffer released until gathered.
TEST(GpuInit, UnitsAreFlattenedAndShardedOnTheDevice) {
  if (auto why = gpu_unavailable(); !why.empty()) GTEST_SKIP() << why;
  RunSpec s;
  s.stage = 3;
  const auto c = small_gpt();
  zero::models::GPT model{nullptr};
  {
    zero::Init init(world().comm(), dp_group(), make_config(s), my_gpu());
    model = zero::models::GPT(c);
    EXPECT_EQ(init.units_sharded(), c.n_layer);
    EXPECT_EQ(init.units_flattened_on_device(), c.n_layer);
    EXPECT_EQ(init.units_flattened_on_host(), 0);
  }
  for (const auto& item : model->named_parameters())
    if (item.key().rfind("h0.", 0) == 0) {
      EXPECT_TRUE(item.value().is_cuda()) << item.key();
      EXPECT_EQ(item.value().storage().nbytes(), 0u) << item.key() << " released until gathered";
    }
}

}  // namespace
}  // namespace zero::test
