// What the multi-rank engine tests share: the small GPT and its run specs,
// the data-parallel and single-rank groups, the single-process reference
// run, comparison helpers and their tolerances, and checkpoint directories.
// Every rank runs the same test binary, so these are called in the same
// order everywhere (group creation is collective).
#pragma once

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "mr.h"
#include "train/gpt_trainer.h"
#include "zero/unit.h"

namespace zero::test {

using zero::Config;
using zero::train::GptTrainer;

inline const zero::data::ByteCorpus& corpus() {
  static auto c = zero::data::ByteCorpus::load(zero::data::ByteCorpus::default_path());
  return c;
}

inline zero::models::GPTConfig small_gpt() {
  zero::models::GPTConfig c;
  c.n_layer = 2;
  c.d_model = 64;
  c.n_head = 4;
  c.seq_len = 32;
  return c;
}

struct RunSpec {
  int stage = 0;
  int64_t micro = 2;
  int64_t gas = 1;
  const char* dtype = "fp32";  // fp32, bf16, fp16
  double clip = 1.0;
  bool overlap = true;
  bool contiguous = true;
  int64_t bucket = 20000;  // small, so the small GPT spans several groups
  // Stage 3: small enough that the GPT's blocks are sharded units, and
  // release after every forward (the classic gather-twice schedule).
  int64_t persistence = 1000;
  int64_t reuse_distance = 0;
  int64_t max_live = 1'000'000'000;
  int64_t prefetch = 50'000'000;
};

inline Config make_config(const RunSpec& s) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", s.micro},
      {"gradient_accumulation_steps", s.gas},
      {"gradient_clipping", s.clip},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}}},
      {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 5}, {"warmup_type", "linear"},
                                                      {"warmup_min_lr", 1e-4}}}}},
      {"zero_optimization", {{"stage", s.stage}, {"overlap_comm", s.overlap},
                             {"contiguous_gradients", s.contiguous}, {"reduce_bucket_size", s.bucket},
                             {"stage3_param_persistence_threshold", s.persistence},
                             {"stage3_max_reuse_distance", s.reuse_distance},
                             {"stage3_max_live_parameters", s.max_live},
                             {"stage3_prefetch_bucket_size", s.prefetch}}}};
  if (std::string(s.dtype) == "bf16") j["bf16"] = {{"enabled", true}};
  // A start scale the small model's grads never overflow at, so the fp16
  // run takes the same steps as fp32 (overflow skips are tested apart).
  if (std::string(s.dtype) == "fp16") j["fp16"] = {{"enabled", true}, {"initial_scale_power", 12}};
  return Config::from_json(j);
}

inline std::shared_ptr<zero::comm::Group> dp_group() {
  static auto g = world().split(world().size(), "dp");
  return g;
}

// A new group of all ranks, for tests whose collectives are meant to fail
// (a shared-memory lane that saw its ranks disagree stays failed).
inline std::shared_ptr<zero::comm::Group> fresh_dp_group() {
  static int n = 0;
  std::vector<int> all(world().size());
  for (int r = 0; r < world().size(); ++r) all[r] = r;
  return world().new_group(all, "fresh" + std::to_string(n++));
}

// A group of this rank alone: the single-process reference runs on it.
inline std::shared_ptr<zero::comm::Group> solo_group() {
  static auto g = world().split(1, "solo");
  return g;
}

struct RunResult {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;  // fp32 copies by name
};

inline RunResult train(const RunSpec& s, std::shared_ptr<zero::comm::Group> g, int steps = 20) {
  GptTrainer t(small_gpt(), make_config(s), corpus(), /*seed=*/7, world().comm(), g);
  RunResult r;
  for (int i = 0; i < steps; ++i) r.losses.push_back(t.train_step().loss);
  r.params = t.engine().full_parameters();
  return r;
}

// The reference: one process, the whole global batch as its micro-batch.
inline RunResult reference(RunSpec s, int steps = 20) {
  s.stage = 0;
  s.micro *= world().size();
  return train(s, solo_group(), steps);
}

inline double max_abs_diff(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (const auto& [name, t] : a) d = std::max(d, (t - b.at(name)).abs().max().item<double>());
  return d;
}

inline double max_rel_loss_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]) / std::fabs(b[i]));
  return d;
}

// fp32 tolerance: the only difference from the reference is the order of
// float sums (per-rank partial batch means, then the average across ranks,
// instead of one mean over the whole batch): ~1e-7 relative per step.
// Adam normalizes updates, so over 20 steps params drift apart by far less
// than one lr-sized step (3e-3): 2e-5 absolute bounds it with margin, while
// any real error (a missing or doubled shard, a wrong scale) moves params
// by ~lr and losses by >1e-3.
inline constexpr double kLossRelTol = 2e-5;
inline constexpr double kParamAbsTol = 2e-5;

// One step of a toy model: each rank trains on its 4 rows of a global batch
// drawn from `seed`; the reference engine (on a group of one) on all of it.
template <typename Model>
inline void step_with_reference(zero::Engine& e, Model& m, zero::Engine& er, Model& ref, uint64_t seed, int64_t features) {
  at::manual_seed(seed);
  auto x = at::randn({4 * world().size(), features});
  e.backward(m.loss(x.narrow(0, 4 * dp_group()->rank(), 4)));
  e.step();
  er.backward(ref.loss(x));
  er.step();
}

// AdamW at lr 0.01 for the toy modules; the reference runs stage 0 with
// the whole global batch as its micro-batch.
inline Config toy_config(int stage, int64_t micro, int64_t persistence = 100000, int64_t prefetch = 50000000) {
  return Config::from_json({{"train_micro_batch_size_per_gpu", micro},
                            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                            {"zero_optimization", {{"stage", stage},
                                                   {"stage3_param_persistence_threshold", persistence},
                                                   {"stage3_prefetch_bucket_size", prefetch}}}});
}

// `fn` throws an E whose message contains `part`.
template <typename E = std::exception, typename Fn>
inline void expect_error(Fn&& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error, expected one saying: " << part;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// A directory every rank of this job names alike (zero-run sets ZERO_JOB_ID).
inline std::string ckpt_dir(const std::string& name) {
  const char* job = std::getenv("ZERO_JOB_ID");
  return std::string("/tmp/zero-test-ckpt-") + (job ? job : "local") + "-" + name;
}

inline void remove_dir(const std::string& dir) {
  world().comm().barrier(world().group())->wait();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

// A group of ranks 0..n-1 of the world (null on the others); cached, as
// creating one is collective.
inline std::shared_ptr<zero::comm::Group> first_ranks(int n) {
  static std::map<int, std::shared_ptr<zero::comm::Group>> cache;
  if (!cache.count(n)) {
    std::vector<int> ranks(n);
    for (int i = 0; i < n; ++i) ranks[i] = i;
    cache[n] = world().new_group(ranks, "first" + std::to_string(n));
  }
  return cache[n];
}

// ---- toy models -----------------------------------------------------------------

// A module with a param that no forward uses, and an odd total size.
struct WithUnused : torch::nn::Module {
  WithUnused() {
    at::manual_seed(3);
    used = register_parameter("used", at::randn({13, 7}));
    unused = register_parameter("unused", at::randn({5}));
    bias = register_parameter("bias", at::randn({7}));
  }
  at::Tensor loss(const at::Tensor& x) {
    return (at::matmul(x, zero::compute(used)) + zero::compute(bias)).pow(2).mean();
  }
  at::Tensor used, unused, bias;
};

// Stage-3 unit cases: a unit called twice in one forward, a param shared by
// two units (it moves to the root), a unit with an unused param, and a
// persistent (small) unit.
struct LinImpl : torch::nn::Module {
  LinImpl(at::Tensor weight, bool with_unused) {
    w = register_parameter("w", weight);
    if (with_unused) register_parameter("unused", at::randn({3}));
  }
  at::Tensor forward(const at::Tensor& x) { return at::tanh(at::matmul(x, zero::compute(w))); }
  at::Tensor w;
};
TORCH_MODULE(Lin);

struct ScaleImpl : torch::nn::Module {
  ScaleImpl() { s = register_parameter("s", at::ones({8})); }
  at::Tensor forward(const at::Tensor& x) { return x * zero::compute(s); }
  at::Tensor s;
};
TORCH_MODULE(Scale);

struct UnitNet : torch::nn::Module {
  UnitNet() {
    at::manual_seed(5);
    auto shared = at::randn({8, 8}) * 0.5;
    a = register_module("a", zero::Unit<Lin>(at::randn({8, 8}) * 0.5, true));
    b = register_module("b", zero::Unit<Lin>(shared, false));
    c = register_module("c", zero::Unit<Lin>(shared, false));
    d = register_module("d", zero::Unit<Scale>());
    head = register_parameter("head", at::randn({8, 1}));
  }
  at::Tensor loss(const at::Tensor& x) {
    auto h = a->forward(a->forward(x));  // called twice
    h = d->forward(c->forward(b->forward(h)));
    return at::matmul(h, zero::compute(head)).pow(2).mean();
  }
  zero::Unit<Lin> a{nullptr}, b{nullptr}, c{nullptr};
  zero::Unit<Scale> d{nullptr};
  at::Tensor head;
};

}  // namespace zero::test
