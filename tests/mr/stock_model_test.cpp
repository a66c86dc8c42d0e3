// A model made only of stock torch::nn layers -- an embedding with a tied
// head, a frozen Linear, BatchNorm, LayerNorm -- trains at every stage and
// precision with no change to its code: no zero::compute(), no zero::Unit,
// the same program switching stage and dtype by config alone. Oracles: the
// fp32 stage-0 run of the same model on the same batches, the plain model's
// param names, and the bytes a 16-bit param holds at rest.
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <filesystem>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/normalization.h>
#include <algorithm>
#include <utility>
#include <vector>

#include "fixtures.h"
#include "memory/cpu_allocator.h"

namespace zero::test {
namespace {

constexpr int64_t kVocab = 48, kDim = 24, kHidden = 64, kSeq = 8, kRowsPerRank = 4;

struct StockNetImpl : torch::nn::Module {
  StockNetImpl() {
    at::manual_seed(11);
    emb = register_module("emb", torch::nn::Embedding(kVocab, kDim));
    frozen = register_module("frozen", torch::nn::Linear(kDim, kDim));
    for (auto& p : frozen->parameters()) p.set_requires_grad(false);
    fc1 = register_module("fc1", torch::nn::Linear(kDim, kHidden));
    bn = register_module("bn", torch::nn::BatchNorm1d(kHidden));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})));
    fc2 = register_module("fc2", torch::nn::Linear(kHidden, kDim));
  }
  // tokens [B, T] -> logits [B, T, vocab]; the head is the embedding's weight.
  at::Tensor forward(const at::Tensor& tokens) {
    at::Tensor x = emb(tokens);
    x = x + frozen(x);
    at::Tensor h = fc1(x);
    h = bn(h.reshape({-1, kHidden})).reshape(h.sizes());
    h = ln(torch::nn::functional::gelu(h));
    x = x + fc2(h);
    return at::linear(x, emb->weight);
  }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear frozen{nullptr}, fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::LayerNorm ln{nullptr};
};
TORCH_MODULE(StockNet);

// `tweak` edits the ds_config before it is read (an offload block, say).
Config stock_config(int stage, const std::string& dtype, const std::string& compute,
                    const std::function<void(nlohmann::json&)>& tweak = {}) {
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", kRowsPerRank},
                      {"gradient_clipping", 1.0},
                      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}}},
                      {"zero_optimization", {{"stage", stage},
                                             {"reduce_bucket_size", 1500},  // several groups at stages 0-2
                                             {"stage3_param_persistence_threshold", 100}}},
                      {"zero_cpp", {{"compute_dtype", compute}}}};
  if (dtype == "bf16") j["bf16"] = {{"enabled", true}};
  if (dtype == "fp16") j["fp16"] = {{"enabled", true}, {"initial_scale_power", 12}};
  if (tweak) tweak(j);
  return Config::from_json(j);
}

struct StockRun {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> state;  // engine.state_dict()
  std::vector<std::string> param_names;     // the model's own, after training
  StateBytes at_rest;
  at::ScalarType compute = at::kFloat;
};

// The same loop at every stage and precision: each rank its rows of a
// global batch drawn from the step's seed; the forward through engine.forward.
StockRun train_stock(int stage, const std::string& dtype, const std::string& compute, int steps = 8,
                     const std::function<void(nlohmann::json&)>& tweak = {}) {
  StockNet model;
  zero::Engine engine(*model, stock_config(stage, dtype, compute, tweak), world().comm(), dp_group());
  StockRun r;
  r.compute = engine.compute_dtype();
  const int rank = dp_group()->rank(), n = dp_group()->size();
  for (int s = 0; s < steps; ++s) {
    at::manual_seed(100 + s);
    const at::Tensor tokens = at::randint(kVocab, {kRowsPerRank * n, kSeq + 1}, at::kLong);
    const at::Tensor mine = tokens.narrow(0, kRowsPerRank * rank, kRowsPerRank);
    const at::Tensor x = mine.narrow(1, 0, kSeq), y = mine.narrow(1, 1, kSeq);
    const at::Tensor logits = engine.forward(model, x);
    const at::Tensor loss =
        torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}).to(at::kFloat), y.reshape({-1}));
    engine.backward(loss);
    engine.step();
    r.losses.push_back(engine.global_mean(loss));
  }
  r.at_rest = engine.state_bytes();
  r.state = engine.state_dict();
  for (const auto& item : model->named_parameters()) r.param_names.push_back(item.key());
  return r;
}

std::vector<std::string> plain_names() {
  StockNet plain;
  std::vector<std::string> names;
  for (const auto& item : plain->named_parameters()) names.push_back(item.key());
  return names;
}

std::vector<std::string> plain_state_names() {
  StockNet plain;
  std::vector<std::string> names;
  for (const auto& item : plain->named_parameters()) names.push_back(item.key());
  for (const auto& item : plain->named_buffers()) names.push_back(item.key());
  std::sort(names.begin(), names.end());
  return names;
}

// How far a 16-bit run's loss may stray from fp32's (relative) over 8
// steps: params round every update to 8 (bf16) or 11 (fp16) mantissa bits,
// a relative error of 2^-9 / 2^-12 per param per step; through 8 Adam steps
// at lr 3e-3 that moves the loss by ~1e-3 (bf16) and ~1e-4 (fp16) -- the
// bounds leave ~8x margin -- while a real error (a shard missed, a wrong
// scale) moves it by more than 0.1 within 2 steps.
double loss_bound(const std::string& dtype) { return dtype == "fp32" ? 2e-5 * 4 : dtype == "bf16" ? 0.01 : 0.002; }

TEST(StockModules, TrainAtEveryStageAndPrecisionWithNoModelChange) {
  const StockRun ref = train_stock(0, "fp32", "fp32");
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.05) << "the reference must learn";
  const auto state_names = plain_state_names();
  for (const std::string dtype : {"fp32", "bf16", "fp16"})
    for (const std::string& compute : {std::string("fp32"), dtype})
      for (int stage = 0; stage <= 3; ++stage) {
        if (dtype == "fp32" && compute != "fp32") continue;
        if (dtype == "fp32" && stage == 0) continue;  // the reference
        SCOPED_TRACE("stage " + std::to_string(stage) + " " + dtype + " computing in " + compute);
        const StockRun r = train_stock(stage, dtype, compute);
        EXPECT_EQ(c10::toString(r.compute), c10::toString(compute == "fp32" ? at::kFloat
                                                          : dtype == "bf16" ? at::kBFloat16
                                                                            : at::kHalf));
        ASSERT_EQ(r.losses.size(), ref.losses.size());
        double worst = 0;
        for (size_t i = 0; i < r.losses.size(); ++i)
          worst = std::max(worst, std::fabs(r.losses[i] - ref.losses[i]) / ref.losses[i]);
        EXPECT_LT(worst, loss_bound(dtype));
        // Names as the plain model registers them, in the model and in the state dict.
        EXPECT_EQ(r.param_names, plain_names());
        std::vector<std::string> got;
        for (const auto& [name, t] : r.state) got.push_back(name);
        EXPECT_EQ(got, state_names);
      }
}

// 16-bit storage with fp32 compute: at rest a stage-3 rank holds its part
// of the params in 16 bits (2 bytes/param/N), and the gathers move 16 bits.
TEST(StockModules, Stage3WidenedHoldsSixteenBitShardsAtRest) {
  const int64_t n = dp_group()->size();
  StockNet model;
  int64_t trainable = 0;
  for (const auto& p : model->parameters())
    if (p.requires_grad()) trainable += p.numel();
  zero::Engine engine(*model, stock_config(3, "bf16", "fp32"), world().comm(), dp_group());
  ASSERT_EQ(engine.compute_dtype(), at::kFloat);
  for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);
  engine.comm().counters().reset();
  const at::Tensor tokens = at::randint(kVocab, {kRowsPerRank, kSeq}, at::kLong);
  engine.backward(engine.forward(model, tokens).to(at::kFloat).pow(2).mean());
  engine.step();
  const auto bytes = engine.state_bytes();
  // Shards are padded to 16 elements per rank per group.
  EXPECT_NEAR(static_cast<double>(bytes.params), 2.0 * trainable / n, 64.0 * n) << "param bytes at rest";
  const auto totals = engine.comm().counters().totals()[comm::to_string(comm::CollectiveOp::AllGather)];
  // Each gather of the root (the one group) moves it whole in 16 bits, not 32.
  ASSERT_GT(totals.calls, 0);
  EXPECT_NEAR(static_cast<double>(totals.bytes) / totals.calls, 2.0 * trainable, 2.0 * 64 * n);
}

// ZeRO-Infinity on a user's own model of stock layers -- a frozen Linear,
// BatchNorm's buffers, the head tied to the embedding, the whole model one
// root unit through engine.forward -- with every param shard and the
// optimizer state on disk: the same losses and state as in memory, bit for bit.
TEST(StockModules, Stage3WithParamsAndOptimizerOnNvmeMatchesMemory) {
  const std::string dir = ckpt_dir("stock-nvme");
  if (world().rank() == 0) std::filesystem::create_directories(dir);
  world().comm().barrier(world().group())->wait();
  const auto on_nvme = [&](nlohmann::json& j) {
    j["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", dir}};
    j["zero_optimization"]["offload_param"] = {{"device", "nvme"}, {"nvme_path", dir}, {"max_in_cpu", 0}};
  };
  for (const char* dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(dtype);
    const StockRun want = train_stock(3, dtype, "auto", 4);
    const StockRun got = train_stock(3, dtype, "auto", 4, on_nvme);
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_EQ(max_abs_diff(got.state, want.state), 0.0);
    EXPECT_GT(got.at_rest.nvme, 0);
    EXPECT_LT(got.at_rest.params, want.at_rest.params) << "the shards are on disk between steps";
  }
  remove_dir(dir);
}

// A user's model of stock layers made from `seed` -- a frozen Linear(in, in),
// Linear(in, wide), ReLU, LayerNorm(wide), Linear(wide, in) -- trained at
// `stage` with the CPU allocator `allocator` on batches of rows[s] x in
// (mapped back to themselves): its losses, its state, and how far the caching
// allocator's `counted` stat rose over the run.
struct AllocatorRun {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> state;
  uint64_t counted = 0;
};
AllocatorRun train_stock_sequential(int stage, const char* allocator, int64_t in, int64_t wide,
                                    const std::vector<int64_t>& rows, int seed,
                                    uint64_t zero::memory::LargeBlockCacheStats::*counted) {
  at::manual_seed(seed);
  torch::nn::Sequential model(torch::nn::Linear(in, in), torch::nn::Linear(in, wide), torch::nn::ReLU(),
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({wide})), torch::nn::Linear(wide, in));
  for (auto& p : model[0]->parameters()) p.set_requires_grad(false);  // the first Linear frozen
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", rows.front()},
                      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
                      {"zero_optimization", {{"stage", stage}}},
                      {"zero_cpp", {{"cpu_allocator", allocator}}}};
  zero::Engine engine(*model, Config::from_json(j), world().comm(), dp_group());
  const uint64_t before = zero::memory::cpu_large_block_stats().*counted;
  AllocatorRun r;
  for (size_t s = 0; s < rows.size(); ++s) {
    at::manual_seed(seed * 100 + static_cast<int64_t>(s) * dp_group()->size() + dp_group()->rank());
    const at::Tensor x = at::randn({rows[s], in});
    const at::Tensor loss = (engine.forward(model, x) - x).pow(2).mean();
    engine.backward(loss);
    engine.step();
    r.losses.push_back(engine.global_mean(loss));
  }
  r.counted = zero::memory::cpu_large_block_stats().*counted - before;
  r.state = engine.state_dict();
  return r;
}

// The same model trained with torch's allocator and with the caching one:
// the same losses and state, bit for bit; `counted` rose by more than
// `more_than` with the caching one (`what` it says), by nothing with torch's.
void expect_caching_as_torchs_own(int stage, int64_t in, int64_t wide, const std::vector<int64_t>& rows, int seed,
                                  uint64_t zero::memory::LargeBlockCacheStats::*counted, uint64_t more_than,
                                  const char* what) {
  SCOPED_TRACE("stage " + std::to_string(stage));
  const AllocatorRun want = train_stock_sequential(stage, "torch", in, wide, rows, seed, counted);
  const AllocatorRun got = train_stock_sequential(stage, "caching", in, wide, rows, seed, counted);
  EXPECT_EQ(want.counted, 0u);
  EXPECT_GT(got.counted, more_than) << what;
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(max_abs_diff(got.state, want.state), 0.0);
}

// The caching CPU allocator (the default) on a user's model of stock layers
// whose activations are MiBs (so they come from its cache: its hits are
// counted), with a frozen layer and LayerNorm: the same losses and state as
// torch's own allocator, bit for bit, at stages 0 and 3.
TEST(StockModules, CachingAllocatorTrainsAsTorchsOwn) {
  const std::vector<int64_t> rows(4, 512);  // activations 512 x 1024 fp32: 2 MiB
  for (int stage : {0, 3})
    expect_caching_as_torchs_own(stage, 256, 1024, rows, 5, &zero::memory::LargeBlockCacheStats::hits, 20,
                                 "the activations came from the cache");
}

// Batches whose size changes from step to step (a last partial batch,
// sequences packed to varying lengths), on a user's model of stock layers
// whose activations are 9-16 MiB: each new size misses the caching
// allocator, and keeping within its bound makes it give back blocks of the
// sizes before -- a miss then takes one's pages (resized, not mapped
// afresh). The same losses and state as torch's own allocator, bit for
// bit, at stages 0 and 3; the resizes are counted (none with
// ZERO_LARGE_BLOCK_RESIZE=off). Run in a process of its own (ctest
// engine_2ranks_fresh_cache): the cache's bound is the most the process
// ever held, so earlier tests' peaks would leave it room enough to give
// nothing back.
TEST(StockModulesFreshProcess, CachingAllocatorResizesForBatchesOfChangingSize) {
  if (zero::memory::cpu_large_block_stats().maps > 0)
    GTEST_SKIP() << "the caching allocator was used before in this process: run it alone "
                    "(--gtest_filter=StockModulesFreshProcess.*)";
  // An activation of rows x 4096 fp32: rows / 64 MiB. Stage 3's sizes differ
  // from stage 0's, whose blocks it finds cached.
  for (const auto& [stage, rows] : {std::pair<int, std::vector<int64_t>>{0, {1024, 768, 896, 640, 1024}},
                                    std::pair<int, std::vector<int64_t>>{3, {960, 704, 832, 576, 960}}})
    expect_caching_as_torchs_own(stage, 64, 4096, rows, 7, &zero::memory::LargeBlockCacheStats::resizes, 0,
                                 "no miss took a cached block's pages");
}

TEST(StockModules, InitWorksAtEveryStage) {
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const Config c = stock_config(stage, "fp32", "fp32");
    StockNet model{nullptr};
    {
      zero::Init init(world().comm(), dp_group(), c);
      model = StockNet();
      EXPECT_EQ(init.units_sharded(), 0);  // no zero::Unit: the model is built whole
    }
    zero::Engine engine(*model, c, world().comm(), dp_group());
    const at::Tensor tokens = at::randint(kVocab, {kRowsPerRank, kSeq}, at::kLong);
    engine.backward(engine.forward(model, tokens).pow(2).mean());
    EXPECT_TRUE(engine.step());
  }
}

// wall_clock_breakdown's timers, step by step (what zero-train logs as
// times_ms): DeepSpeed's five names, nested as DeepSpeed's are (the
// reduction wait inside backward, the all-gather inside step), each of
// this step only -- forward + backward + step within the step's own wall
// time -- and nothing without the option.
TEST(TrainingLog, LastStepTimesHoldThatStepsPhases) {
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "wall_clock_breakdown" : "without it");
    nlohmann::json j = stock_config(2, "fp32", "fp32").to_json();
    j["wall_clock_breakdown"] = on;
    j["gradient_accumulation_steps"] = 2;
    StockNet model;
    zero::Engine engine(*model, Config::from_json(j), world().comm(), dp_group());
    for (int s = 0; s < 3; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int micro = 0; micro < 2; ++micro) {
        at::manual_seed(400 + s * 2 + micro);
        const at::Tensor tokens = at::randint(kVocab, {kRowsPerRank, kSeq}, at::kLong);
        engine.backward(engine.forward(model, tokens).pow(2).mean());
        engine.step();
      }
      const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const auto times = engine.last_step_times();
      if (!on) {
        EXPECT_TRUE(times.empty());
        continue;
      }
      for (const char* name : {"forward", "backward", "backward_allreduce", "step", "step_allgather"}) {
        ASSERT_TRUE(times.count(name)) << name;
        EXPECT_GE(times.at(name), 0.0) << name;
      }
      EXPECT_GT(times.at("forward"), 0.0);
      EXPECT_GT(times.at("backward"), 0.0);
      EXPECT_GT(times.at("step"), 0.0);
      EXPECT_LE(times.at("backward_allreduce"), times.at("backward"));
      EXPECT_LE(times.at("step_allgather"), times.at("step"));
      EXPECT_LE(times.at("forward") + times.at("backward") + times.at("step"), wall)
          << "step " << s + 1 << ": the phases of one step only";
    }
  }
}

// DeepSpeed's csv_monitor layout, with the loss as the mean over ranks of
// what each gave engine.backward, and the wall-clock timers' files.
TEST(TrainingLog, CsvMonitorWritesDeepSpeedsFiles) {
  const std::string dir = ckpt_dir("csv-monitor");
  remove_dir(dir);
  nlohmann::json j = stock_config(2, "fp32", "fp32").to_json();
  j["steps_per_print"] = 2;
  j["wall_clock_breakdown"] = true;
  j["csv_monitor"] = {{"enabled", true}, {"output_path", dir}, {"job_name", "job"}};
  StockNet model;
  zero::Engine engine(*model, Config::from_json(j), world().comm(), dp_group());
  const int n = dp_group()->size();
  std::vector<double> want;
  for (int s = 0; s < 3; ++s) {
    at::manual_seed(300 + s * n + dp_group()->rank());
    const at::Tensor tokens = at::randint(kVocab, {kRowsPerRank, kSeq}, at::kLong);
    const at::Tensor loss = engine.forward(model, tokens).pow(2).mean();
    engine.backward(loss);
    engine.step();
    want.push_back(engine.global_mean(loss));
  }
  world().comm().barrier(world().group())->wait();
  if (dp_group()->rank() == 0) {
    std::ifstream in(dir + "/job/Train_Samples_train_loss.csv");
    ASSERT_TRUE(in.good()) << "no " << dir << "/job/Train_Samples_train_loss.csv";
    std::string header;
    std::getline(in, header);
    EXPECT_EQ(header, "step,train_loss");
    for (int s = 0; s < 3; ++s) {
      int64_t samples = 0;
      char comma = 0;
      double value = 0;
      in >> samples >> comma >> value;
      EXPECT_EQ(samples, (s + 1) * kRowsPerRank * n);
      EXPECT_NEAR(value, want[s], 1e-6 * std::fabs(want[s]));
    }
    for (const char* f : {"Train_Samples_lr.csv", "Train_Samples_elapsed_time_ms_forward.csv",
                          "Train_Samples_elapsed_time_ms_backward_allreduce.csv",
                          "Train_Samples_elapsed_time_ms_step.csv"})
      EXPECT_TRUE(std::filesystem::exists(dir + "/job/" + f)) << f;
  }
  remove_dir(dir);
}

// The bundled GPT (stock modules, blocks as units) with each block's
// activations recomputed in backward trains as without, at every stage: at
// stage 3 each block is gathered again for its recompute.
TEST(ActivationCheckpointing, GptMatchesTheSameModelWithout) {
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    RunSpec s;
    s.stage = stage;
    auto run = [&](bool checkpoint) {
      auto c = small_gpt();
      c.checkpoint_activations = checkpoint;
      GptTrainer t(c, make_config(s), corpus(), 7, world().comm(), dp_group());
      RunResult r;
      for (int i = 0; i < 6; ++i) r.losses.push_back(t.train_step().loss);
      r.params = t.engine().full_parameters();
      return r;
    };
    const RunResult plain = run(false), recomputed = run(true);
    // The same ops on the same values: only the grads' summation order may
    // differ (each block's grads come from a nested backward).
    EXPECT_LT(max_rel_loss_diff(recomputed.losses, plain.losses), kLossRelTol);
    expect_params_close(recomputed.params, plain.params);
  }
}

TEST(StockModules, AutoComputeDtypeIsOneAnswerOnEveryRank) {
  StockNet model;
  zero::Engine engine(*model, stock_config(2, "bf16", "auto"), world().comm(), dp_group());
  const at::ScalarType mine = engine.compute_dtype();
  EXPECT_TRUE(mine == at::kFloat || mine == at::kBFloat16);
  at::Tensor all = at::zeros({dp_group()->size()}, at::kInt);
  engine.comm().all_gather(*dp_group(), all, at::full({1}, static_cast<int>(mine), at::kInt))->wait();
  EXPECT_EQ(all.min().item<int>(), all.max().item<int>());
  const std::string how = dp_group()->rank() == 0 ? "measured on rank 0" : "rank 0's measurement";
  EXPECT_NE(engine.describe().find(how), std::string::npos) << engine.describe();
}

}  // namespace
}  // namespace zero::test
