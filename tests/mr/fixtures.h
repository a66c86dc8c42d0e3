// What the multi-rank engine tests share: the small GPT and its run specs,
// the data-parallel and single-rank groups, the single-process reference
// run, comparison helpers and their tolerances, checkpoint directories, and
// the toy models and helpers of the feature tests (one file per feature:
// parity, stage 3, several backward calls, checkpoints, model state, bad
// input).
// Every rank runs the same test binary, so these are called in the same
// order everywhere (group creation is collective).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "mr.h"
#include "train/gpt_trainer.h"
#include "zero/activation_checkpoint.h"
#include "zero/init.h"
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
  bool compute_grad_norm = true;  // false needs stage 1/2 and clip 0
  // zero_cpp.compute_dtype; null: the storage dtype (16-bit params in the
  // module, which the byte formulas of these tests assume).
  const char* compute = nullptr;
  bool gather_fp32_master = false;  // zero_cpp.stage3_gather_fp32_master
};

inline Config make_config(const RunSpec& s) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", s.micro},
      {"gradient_accumulation_steps", s.gas},
      {"gradient_clipping", s.clip},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}, {"eps", 1e-6}}}}},
      {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 5}, {"warmup_type", "linear"},
                                                      {"warmup_min_lr", 1e-4}}}}},
      {"zero_optimization", {{"stage", s.stage}, {"overlap_comm", s.overlap},
                             {"contiguous_gradients", s.contiguous}, {"reduce_bucket_size", s.bucket},
                             {"stage3_param_persistence_threshold", s.persistence},
                             {"stage3_max_reuse_distance", s.reuse_distance},
                             {"stage3_max_live_parameters", s.max_live},
                             {"stage3_prefetch_bucket_size", s.prefetch},
                             {"compute_grad_norm", s.compute_grad_norm}}}};
  j["zero_cpp"] = {{"compute_dtype", s.compute ? s.compute : s.dtype},
                   {"stage3_gather_fp32_master", s.gather_fp32_master}};
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

// Compared as fp32 on the host, whatever device or dtype a side is in.
inline double max_abs_diff(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (const auto& [name, t] : a)
    d = std::max(d, (t.to(at::kCPU, at::kFloat) - b.at(name).to(at::kCPU, at::kFloat)).abs().max().item<double>());
  return d;
}

// A small stock-layer model (Linear, LayerNorm, Linear) with the same
// weights on every rank and in every run of a given shape.
struct StockMlpImpl : torch::nn::Module {
  StockMlpImpl(int64_t in, int64_t hidden) {
    at::manual_seed(17);
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 1));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(ln(at::tanh(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::LayerNorm ln{nullptr};
};
TORCH_MODULE(StockMlp);

// The whole batch of each step through `model`, squared error, torch's own
// optimizer `opt` (before_step(s, opt) first: a schedule's lr, say), in one
// process: the oracle for the engine's optimizer paths. Returns the params.
template <typename Optimizer>
std::map<std::string, at::Tensor> train_in_one_process(
    StockMlp& model, Optimizer& opt, int steps, const std::function<std::pair<at::Tensor, at::Tensor>(int)>& batch,
    const std::function<void(int, Optimizer&)>& before_step = {}) {
  for (int s = 0; s < steps; ++s) {
    if (before_step) before_step(s, opt);
    auto [x, y] = batch(s);
    opt.zero_grad();
    (model->forward(x) - y).pow(2).mean().backward();
    opt.step();
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model->named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

// Elements of all params that differ by more than `tol`.
inline int64_t count_over(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b,
                          double tol) {
  int64_t n = 0;
  for (const auto& [name, t] : a)
    if (b.count(name)) n += (t - b.at(name)).abs().gt(tol).sum().item<int64_t>();
  return n;
}

// The param that differs most, for failure messages.
inline std::string worst_param(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  std::string worst;
  double d = -1;
  for (const auto& [name, t] : a)
    if (b.count(name))
      if (double e = (t - b.at(name)).abs().max().item<double>(); e > d) {
        d = e;
        worst = name;
      }
  return worst;
}

// Params of a run against the single-process reference's. Splitting the
// batch over ranks or micro-batches sums each grad in another order, and
// Adam's normalized update turns a relative difference of ~1e-7 into an
// absolute one of up to lr where an element's grad is near zero (in the
// small GPT: key-projection weights, whose grads nearly cancel under
// near-uniform attention; fused attention leaves them a rounding-noise
// floor where the naive one cancelled exactly, e.g. the first position's).
// make_config's eps (1e-6, not 1e-8) keeps such noise from being scaled up
// to a full step. So: no element off by more than a tenth of one lr step
// (3e-3), and fewer than 1 in 200 beyond the fp32 tolerance below, while a
// real error (a shard or micro-batch lost or counted twice) moves every
// element by ~lr.
inline void expect_params_close(const std::map<std::string, at::Tensor>& got,
                                const std::map<std::string, at::Tensor>& ref);

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

inline void expect_params_close(const std::map<std::string, at::Tensor>& got,
                                const std::map<std::string, at::Tensor>& ref) {
  EXPECT_LT(max_abs_diff(got, ref), 3e-4) << worst_param(got, ref);
  int64_t elements = 0;
  for (const auto& [name, t] : ref) elements += t.numel();
  EXPECT_LT(count_over(got, ref, kParamAbsTol), elements / 200) << "elements beyond " << kParamAbsTol;
}

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


// ---- the models and helpers of the feature tests ---------------------------------

// Trains the small GPT for two steps at fp32 and bf16, stages 0/1/2, and
// hands `check` the trainer, the last step's record and the 16/32-bit width.
template <typename Check>
void for_each_dtype_and_stage(Check&& check) {
  for (const char* dt : {"fp32", "bf16"})
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE(std::string(dt) + " stage " + std::to_string(stage));
      RunSpec s;
      s.stage = stage;
      s.dtype = dt;
      GptTrainer t(small_gpt(), make_config(s), corpus(), 7, world().comm(), dp_group());
      t.train_step();
      const auto last = t.train_step();
      check(t, last, stage, std::string(dt) == "fp32" ? 4.0 : 2.0);
    }
}

// Peak resident memory (VmHWM, reset through /proc/self/clear_refs) grown
// while building a model.
inline int64_t build_peak_growth(const std::function<void()>& build) {
  auto hwm = []() -> int64_t {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
    return 0;
  };
  std::ofstream("/proc/self/clear_refs") << "5";
  const int64_t before = hwm();
  build();
  return hwm() - before;
}

// Evaluation forwards (no grad) between steps, in-place ops on unit
// outputs, and a param-less unit change nothing at stage 3.
struct PlusOneImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) { return x + 1; }
};

TORCH_MODULE(PlusOne);

// No activation: matmul's backward does not need its output, so the
// output may be changed in place.
struct LinearImpl : torch::nn::Module {
  explicit LinearImpl(at::Tensor weight) { w = register_parameter("w", weight); }
  at::Tensor forward(const at::Tensor& x) { return at::matmul(x, zero::compute(w)); }
  at::Tensor w;
};

TORCH_MODULE(Linear);

struct InPlaceNet : torch::nn::Module {
  InPlaceNet() {
    at::manual_seed(9);
    a = register_module("a", zero::Unit<Lin>(at::randn({8, 8}) * 0.5, false));
    b = register_module("b", zero::Unit<Linear>(at::randn({8, 8}) * 0.5));
    p = register_module("p", zero::Unit<PlusOne>());
    head = register_parameter("head", at::randn({8, 1}));
  }
  at::Tensor loss(const at::Tensor& x) {
    auto h = b->forward(a->forward(x));
    h.mul_(0.5);  // in place on a unit's (hooked) output
    h = p->forward(h);
    return at::matmul(h, zero::compute(head)).pow(2).mean();
  }
  zero::Unit<Lin> a{nullptr};
  zero::Unit<Linear> b{nullptr};
  zero::Unit<PlusOne> p{nullptr};
  at::Tensor head;
};

// A param one rank uses and another does not: its unit's grads complete at
// different moments on the two ranks, so its reduce-scatter is launched at
// a different point among the backward regathers (reductions run on their
// own lane for this). It must train with parity. (This run also passes with
// one shared lane, so it guards the behaviour, not the lane itself.)
struct GatedImpl : torch::nn::Module {
  explicit GatedImpl(at::Tensor weight) {
    w = register_parameter("w", weight);
    gate = register_parameter("gate", at::ones({8}) * 0.9);
  }
  at::Tensor forward(const at::Tensor& x, bool use_gate) {
    auto h = at::tanh(at::matmul(x, zero::compute(w)));
    return use_gate ? h * zero::compute(gate) : h;
  }
  at::Tensor w, gate;
};

TORCH_MODULE(Gated);

struct GatedNet : torch::nn::Module {
  GatedNet() {
    at::manual_seed(11);
    for (int i = 0; i < 4; ++i)
      units.push_back(register_module("u" + std::to_string(i), zero::Unit<Gated>(at::randn({8, 8}) * 0.5)));
    head = register_parameter("head", at::randn({8, 1}));
  }
  at::Tensor loss(const at::Tensor& x, bool use_gate) {
    auto h = x;
    for (size_t i = 0; i < units.size(); ++i) h = units[i]->forward(h, use_gate && i == 1);
    return at::matmul(h, zero::compute(head)).pow(2).mean();
  }
  std::vector<zero::Unit<Gated>> units;
  at::Tensor head;
};

// coalesce_grad_reduction(): N backward calls, one reduction pass.
inline Config coalesce_config(int stage, int64_t gas, bool overlap, bool contiguous, const char* dtype = "fp32") {
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", 4},
                      {"gradient_accumulation_steps", gas},
                      // No clipping: the global norm is summed per group, so
                      // with it the bits would depend on how stages group params.
                      {"gradient_clipping", 0.0},
                      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                      {"zero_optimization", {{"stage", stage}, {"overlap_comm", overlap},
                                             {"contiguous_gradients", contiguous}, {"reduce_bucket_size", 40},
                                             {"stage3_param_persistence_threshold", 0}}}};
  if (std::string(dtype) == "fp16") j["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}, {"hysteresis", 1}};
  return Config::from_json(j);
}

enum class Backwards { Coalesced, Separate, Accumulated };

// Two optimizer steps of UnitNet, each over N chunks of 4 rows per rank:
// Coalesced: N backward calls (loss / N) inside the guard, then step();
// Separate: the same N calls without it (N reductions);
// Accumulated: gradient_accumulation_steps = N, one backward + step() per chunk.
// Returns the params and the reduce-scatter calls of the second step.
inline std::pair<std::map<std::string, at::Tensor>, int64_t> run_chunks(int stage, int n, bool overlap, bool contiguous,
                                                                 Backwards how) {
  UnitNet m;
  zero::Engine e(m, coalesce_config(stage, how == Backwards::Accumulated ? n : 1, overlap, contiguous),
                 world().comm(), dp_group());
  const int r = dp_group()->rank();
  int64_t rs_calls = 0;
  for (int step = 0; step < 2; ++step) {
    at::manual_seed(900 + step);
    std::vector<at::Tensor> chunks;
    for (int k = 0; k < n; ++k) chunks.push_back(at::randn({4 * world().size(), 8}).narrow(0, 4 * r, 4));
    const auto before = world().comm().counters().totals();
    if (how == Backwards::Accumulated) {
      for (auto& x : chunks) {
        e.backward(m.loss(x));
        e.step();
      }
    } else {
      std::optional<zero::Engine::CoalesceGradReduction> guard;
      if (how == Backwards::Coalesced) guard.emplace(e);
      for (auto& x : chunks) {
        e.backward(m.loss(x) / n);
        if (guard) {
          EXPECT_EQ(zero::comm::diff(world().comm().counters().totals(), before).count("reduce_scatter"), 0u)
              << "a backward inside the guard reduced";
        }
      }
      guard.reset();
      EXPECT_TRUE(e.step());
    }
    const auto d = zero::comm::diff(world().comm().counters().totals(), before);
    rs_calls = d.count("reduce_scatter") ? d.at("reduce_scatter").calls : 0;
  }
  return {e.full_parameters(), rs_calls};
}

// Saved by `from` at stage_from, loaded by `to` at stage_to (groups may be
// null on ranks outside them): training goes on as a run that was on `to`
// from the start, to the parity tests' round-off. The global batch is 4
// sequences at every size, so the runs see the same data. `adjust_from` and
// `adjust_to`, if given, change either side's config (offload, say).
using ConfigChange = std::function<zero::Config(const zero::Config&)>;
inline void expect_reshard(std::shared_ptr<zero::comm::Group> from, int stage_from, std::shared_ptr<zero::comm::Group> to,
                           int stage_to, const std::string& name, const ConfigChange& adjust_from = {},
                           const ConfigChange& adjust_to = {}) {
  const auto dir = ckpt_dir(name);
  auto config = [](int stage, const zero::comm::Group& g, const ConfigChange& adjust) {
    RunSpec s;
    s.stage = stage;
    s.micro = 4 / g.size();
    const zero::Config c = make_config(s);
    return adjust ? adjust(c) : c;
  };
  if (from) {
    GptTrainer t(small_gpt(), config(stage_from, *from, adjust_from), corpus(), 7, world().comm(), from);
    for (int i = 0; i < 3; ++i) t.train_step();
    t.save(dir);
  }
  world().comm().barrier(world().group())->wait();
  if (to) {
    GptTrainer ref(small_gpt(), config(stage_to, *to, {}), corpus(), 7, world().comm(), to);
    GptTrainer resumed(small_gpt(), config(stage_to, *to, adjust_to), corpus(), 7, world().comm(), to);
    std::vector<double> want, got;
    for (int i = 0; i < 6; ++i) {
      const double l = ref.train_step().loss;
      if (i >= 3) want.push_back(l);
    }
    resumed.resume(dir);
    for (int i = 0; i < 3; ++i) got.push_back(resumed.train_step().loss);
    EXPECT_LT(max_rel_loss_diff(got, want), kLossRelTol);
    EXPECT_LT(max_abs_diff(resumed.engine().full_parameters(), ref.engine().full_parameters()), kParamAbsTol);
  }
  remove_dir(dir);
}

// Every rank's copy of `t`, stacked: row q is rank q's.
inline at::Tensor gather_from_all(const at::Tensor& t) {
  const auto& g = *dp_group();
  auto flat = t.detach().reshape(-1).contiguous();
  auto all = at::empty({g.size() * flat.numel()}, flat.options());
  world().comm().all_gather(g, all, flat)->wait();
  return all.view({g.size(), flat.numel()});
}

inline bool same_on_all_ranks(const at::Tensor& t) {
  auto all = gather_from_all(t);
  for (int q = 1; q < all.size(0); ++q)
    if (!all[q].equal(all[0])) return false;
  return true;
}

// Every registered tensor (params, frozen or not, and buffers) by name.
inline std::map<std::string, at::Tensor> module_state(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  for (const auto& b : m.named_buffers()) out[b.key()] = b.value().detach().clone();
  return out;
}

// Stock layers: a frozen Linear backbone, a BatchNorm, a trainable head.
// `seed` differs per rank in the tests, as it does in users' programs that
// forget to seed alike; BatchNorm's running mean is set from it too.
struct FrozenBnNet : torch::nn::Module {
  explicit FrozenBnNet(uint64_t seed) {
    at::manual_seed(seed);
    backbone = register_module("backbone", torch::nn::Linear(8, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    head = register_module("head", torch::nn::Linear(16, 1));
    for (auto& p : backbone->parameters()) p.set_requires_grad(false);
    bn->running_mean.fill_(0.01 * static_cast<double>(seed % 100));
  }
  at::Tensor features(const at::Tensor& x) { return backbone->forward(x); }
  at::Tensor loss(const at::Tensor& x) { return head->forward(torch::relu(bn->forward(features(x)))).pow(2).mean(); }
  torch::nn::Linear backbone{nullptr}, head{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

inline uint64_t rank_seed() { return 100 + static_cast<uint64_t>(dp_group()->rank()); }

// A unit built under zero::Init with a frozen part and a BatchNorm: its
// frozen params and buffers are rank 0's as soon as the unit is built.
struct BnBlockImpl : torch::nn::Module {
  BnBlockImpl() {
    frozen = register_module("frozen", torch::nn::Linear(8, 8));
    for (auto& p : frozen->parameters()) p.set_requires_grad(false);
    fc = register_module("fc", torch::nn::Linear(8, 8));
    bn = register_module("bn", torch::nn::BatchNorm1d(8));
    bn->running_var.fill_(1.0 + dp_group()->rank());
  }
  at::Tensor forward(const at::Tensor& x) { return bn->forward(fc->forward(frozen->forward(x))); }
  torch::nn::Linear frozen{nullptr}, fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

TORCH_MODULE(BnBlock);

struct InitNet : torch::nn::Module {
  InitNet() {
    block = register_module("block", zero::Unit<BnBlock>());
    head = register_parameter("head", at::randn({8, 1}));
  }
  at::Tensor loss(const at::Tensor& x) { return at::matmul(block->forward(x), head).pow(2).mean(); }
  zero::Unit<BnBlock> block{nullptr};
  at::Tensor head;
};

using Piece = std::function<at::Tensor(const at::Tensor&)>;

// `shared` is used in both checkpointed pieces (at stage 3 it is a unit of
// its own, gathered again for each recompute); the rest is plain.
struct RecomputeNet : torch::nn::Module {
  explicit RecomputeNet(bool checkpoint) : checkpoint(checkpoint) {
    at::manual_seed(21);
    in = register_module("in", torch::nn::Linear(8, 8));
    shared = register_module("shared", zero::Unit<torch::nn::Linear>(8, 8));
    b = register_module("b", torch::nn::Linear(8, 8));
    head = register_module("head", torch::nn::Linear(8, 1));
    first = [this](const at::Tensor& h) { return at::tanh(shared->forward(h)); };
    second = [this](const at::Tensor& h) { return at::tanh(b->forward(shared->forward(h))); };
  }
  at::Tensor run(const Piece& p, const at::Tensor& h) {
    return checkpoint ? zero::checkpoint_activations(p, h) : p(h);
  }
  at::Tensor loss(const at::Tensor& x) { return head->forward(run(second, run(first, in->forward(x)))).pow(2).mean(); }
  bool checkpoint;
  torch::nn::Linear in{nullptr}, b{nullptr}, head{nullptr};
  zero::Unit<torch::nn::Linear> shared{nullptr};
  Piece first, second;
};

// An embedding in a unit whose weight the LM head, outside every unit, also
// uses (registered there as "head", as tied weights are).
struct TiedUnitNet : torch::nn::Module {
  TiedUnitNet() {
    at::manual_seed(41);
    emb = register_module("emb", zero::Unit<torch::nn::Embedding>(16, 8));
    block = register_module("block", zero::Unit<Lin>(at::randn({8, 8}) * 0.5, false));
    head = register_parameter("head", emb->inner->weight);
  }
  at::Tensor loss(const at::Tensor& tokens) {
    auto logits = at::linear(block->forward(emb->forward(tokens)), head);
    return at::cross_entropy_loss(logits.view({-1, 16}), tokens.roll(1, 1).reshape(-1));
  }
  zero::Unit<torch::nn::Embedding> emb{nullptr};
  zero::Unit<Lin> block{nullptr};
  at::Tensor head;
};

// A model whose shape depends on the rank (or which params are frozen) is
// refused at construction on every rank, naming the first difference --
// before it could train garbage with mismatched shards.
struct RankDependentNet : torch::nn::Module {
  RankDependentNet(int64_t width, bool freeze_head) {
    fc = register_module("fc", torch::nn::Linear(8, width));
    head = register_module("head", torch::nn::Linear(width, 1));
    if (freeze_head) head->weight.set_requires_grad(false);
  }
  torch::nn::Linear fc{nullptr}, head{nullptr};
};

// Four units of one size, so only the unit a gather is for tells them apart.
struct SameUnitsNet : torch::nn::Module {
  SameUnitsNet() {
    at::manual_seed(31);
    for (int i = 0; i < 4; ++i)
      units.push_back(register_module("u" + std::to_string(i), zero::Unit<Lin>(at::randn({8, 8}) * 0.5, false)));
    head = register_parameter("head", at::randn({8, 1}));
  }
  at::Tensor loss(const at::Tensor& x, bool swap_middle) {
    auto h = units[0]->forward(x);
    h = swap_middle ? units[1]->forward(units[2]->forward(h)) : units[2]->forward(units[1]->forward(h));
    return at::matmul(units[3]->forward(h), zero::compute(head)).pow(2).mean();
  }
  std::vector<zero::Unit<Lin>> units;
  at::Tensor head;
};

// A plain backward that fails inside autograd never reaches its end; the
// retry (or the next step()) drops what it left, and training goes on as if
// it had not happened.
struct FailOnce : torch::autograd::Function<FailOnce> {
  static at::Tensor forward(torch::autograd::AutogradContext*, at::Tensor x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list g) {
    if (armed) {
      armed = false;
      throw std::runtime_error("injected failure in backward");
    }
    return {g[0]};
  }
  static inline bool armed = false;
};

}  // namespace zero::test
