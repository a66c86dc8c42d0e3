// Stages 0/1/2 against their oracles, on real ranks:
// - parity: N ranks x micro-batch b equal one process with batch N*b (each
//   rank runs that reference itself, on a group of one);
// - memory: the bytes of model state each rank holds equal the stage's formula;
// - communication: the dispatcher's counted bytes per step equal the formula;
// - unused params, params larger than a bucket, sizes not divisible by N;
// - fp16/bf16 against fp32, and an injected overflow skipping the step everywhere.
#include <cmath>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "fixtures.h"
#include "train/gpt_trainer.h"
#include "ckpt/checkpoint_dir.h"
#include "zero/init.h"

namespace {

using namespace zero::test;

TEST(Parity, StagesMatchSingleProcess) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    RunSpec s;
    s.stage = stage;
    auto dist = train(s, dp_group());
    auto ref = reference(s);
    EXPECT_LT(max_rel_loss_diff(dist.losses, ref.losses), kLossRelTol);
    EXPECT_LT(max_abs_diff(dist.params, ref.params), kParamAbsTol);
    EXPECT_LT(dist.losses.back(), dist.losses.front() - 0.5) << "the loss falls";
  }
}

TEST(Parity, GradientAccumulationMatchesLargerBatch) {
  for (int stage : {0, 1, 2, 3})
    for (bool contiguous : {true, false}) {
    SCOPED_TRACE("stage " + std::to_string(stage) + " contiguous " + std::to_string(contiguous));
    RunSpec s;
    s.stage = stage;
    s.gas = 2;
    s.contiguous = contiguous;
    auto dist = train(s, dp_group());
    RunSpec big = s;
    big.gas = 1;
    big.micro = s.micro * s.gas;
    auto ref = reference(big);
    EXPECT_LT(max_rel_loss_diff(dist.losses, ref.losses), kLossRelTol);
    EXPECT_LT(max_abs_diff(dist.params, ref.params), kParamAbsTol);
  }
}

TEST(Parity, StagesAgreeWithEachOtherAcrossOptions) {
  // Same ranks, same reduction order: stages and overlap/contiguous options
  // change where grads live and when they move, not the arithmetic.
  RunSpec base;
  base.clip = 0.0;  // the norm is summed per shard in stages 1/2; without clipping it is not used
  auto s0 = train(base, dp_group(), 8);
  for (int stage : {1, 2, 3})
    for (bool overlap : {false, true})
      for (bool contiguous : {false, true}) {
        RunSpec s = base;
        s.stage = stage, s.overlap = overlap, s.contiguous = contiguous;
        SCOPED_TRACE("stage " + std::to_string(stage) + " overlap " + std::to_string(overlap) + " contiguous " +
                     std::to_string(contiguous));
        auto r = train(s, dp_group(), 8);
        EXPECT_EQ(r.losses, s0.losses);
        EXPECT_EQ(max_abs_diff(r.params, s0.params), 0.0);
      }
}

TEST(Parity, OneHugeBucketAndTinyBuckets) {
  // A param larger than the bucket gets a group of its own; one bucket holds everything.
  for (int64_t bucket : {int64_t{100}, int64_t{1} << 30}) {
    SCOPED_TRACE("bucket " + std::to_string(bucket));
    RunSpec s;
    s.stage = 2;
    s.bucket = bucket;
    auto dist = train(s, dp_group(), 10);
    auto ref = reference(s, 10);
    EXPECT_LT(max_rel_loss_diff(dist.losses, ref.losses), kLossRelTol);
    EXPECT_LT(max_abs_diff(dist.params, ref.params), kParamAbsTol);
  }
}

TEST(MixedPrecision, Bf16AndFp16TrackFp32) {
  RunSpec s;
  s.stage = 2;
  auto fp32 = train(s, dp_group());
  for (const char* dt : {"bf16", "fp16"}) {
    SCOPED_TRACE(dt);
    RunSpec m = s;
    m.dtype = dt;
    GptTrainer t(small_gpt(), make_config(m), corpus(), 7, world().comm(), dp_group());
    RunResult r;
    for (int i = 0; i < 20; ++i) r.losses.push_back(t.train_step().loss);
    EXPECT_EQ(t.engine().skipped_steps(), 0);
    // 16-bit params round each update to 8 (bf16) or 11 (fp16) mantissa bits;
    // the loss curve stays within a few hundredths of fp32's over 20 steps.
    double worst = 0;
    for (size_t i = 0; i < r.losses.size(); ++i) worst = std::max(worst, std::fabs(r.losses[i] - fp32.losses[i]));
    EXPECT_LT(worst, 0.05);
    EXPECT_LT(r.losses.back(), r.losses.front() - 0.5);
  }
}

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

// Formulas in Ψ (unpadded params); padding to 16·N elements per group stays
// well under the 1% tolerance.
TEST(Memory, ModelStateBytesMatchTheStageFormula) {
  const double N = world().size();
  for_each_dtype_and_stage([&](GptTrainer& t, const zero::train::StepRecord&, int stage, double p) {
    const double psi = static_cast<double>(t.engine().num_params());
    // p: param and grad bytes. In fp32 the master weights are the params themselves.
    const double master = p == 4 ? 0 : 4;
    double expect = 0;
    switch (stage) {
      case 0: expect = p * psi + p * psi + master * psi + 8 * psi; break;
      case 1: expect = p * psi + p * psi + (p == 4 ? 0 : 4 * psi / N) + (master + 8) * psi / N; break;
      case 2: expect = p * psi + 4 * psi / N + (master + 8) * psi / N; break;
      // Stage 3: everything sharded, but the persistent groups (root unit)
      // also keep their full params.
      case 3: expect = (p + 4 + master + 8) * psi / N + p * t.engine().persistent_params(); break;
    }
    const double got = static_cast<double>(t.engine().state_bytes().total());
    EXPECT_NEAR(got / expect, 1.0, 0.01) << "got " << got << " expected " << expect;
  });
}

TEST(Communication, BytesPerStepMatchTheFormula) {
  for_each_dtype_and_stage([&](GptTrainer& t, const zero::train::StepRecord& r, int stage, double e) {
    const double psi = static_cast<double>(t.engine().num_params());
    auto near = [&](const char* op, double want) {
      const double got = r.comm.count(op) ? static_cast<double>(r.comm.at(op).bytes) : 0.0;
      EXPECT_NEAR(got / want, 1.0, 0.01) << op << ": " << got << " bytes, formula " << want;
    };
    if (stage == 0) {
      near("all_reduce", e * psi);  // the grads, once
      EXPECT_EQ(r.comm.count("reduce_scatter"), 0u);
    } else if (stage == 3) {
      // Units: gathered for forward and again for backward; the persistent
      // root is refreshed once after the step. Grads reduce-scattered once: ≈3Ψ.
      const double persistent = static_cast<double>(t.engine().persistent_params());
      near("allgather", e * (2 * (psi - persistent) + persistent));
      near("reduce_scatter", e * psi);
    } else {
      near("reduce_scatter", e * psi);  // grads in
      near("allgather", e * psi);       // updated params out
      EXPECT_EQ(r.comm.at("reduce_scatter").calls, r.comm.at("allgather").calls);
    }
  });
}

// The shared-memory fast path serves every collective of a training step
// at every stage (all ranks of these tests share a host): stage 3's many
// per-unit gathers included, not just the big buckets.
TEST(Communication, FastPathServesEveryCollectiveOfAStep) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    RunSpec s;
    s.stage = stage;
    GptTrainer t(small_gpt(), make_config(s), corpus(), /*seed=*/7, world().comm(), dp_group());
    t.train_step();
    const auto r = t.train_step();
    ASSERT_FALSE(r.comm.empty());
    for (const auto& [op, c] : r.comm) {
      const auto shm = c.calls_by_transport.find("shm");
      EXPECT_EQ(shm == c.calls_by_transport.end() ? 0 : shm->second, c.calls) << op;
    }
    if (stage == 3) {
      EXPECT_GE(r.comm.at("allgather").calls, 2 * small_gpt().n_layer);
    }
  }
}

TEST(Robustness, UnusedParamsAndOddSizesTrain) {
  for (int stage : {0, 1, 2, 3}) {  // at stage 3 this unit-less model is one root unit
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                  {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
                                  {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 6}}}});
    WithUnused m, ref;
    zero::Engine e(m, cfg, world().comm(), dp_group());
    zero::Engine er(ref, cfg, world().comm(), solo_group());  // reference: the whole batch here
    const auto unused_before = m.unused.clone();
    for (int step = 0; step < 5; ++step) step_with_reference(e, m, er, ref, 100 + step, 13);
    EXPECT_TRUE(at::allclose(m.used, ref.used, 0, 1e-5));
    EXPECT_TRUE(at::allclose(m.bias, ref.bias, 0, 1e-5));
    // No grad ever reached it: Adam with zero grads and no weight decay leaves it.
    EXPECT_TRUE(m.unused.equal(unused_before));
  }
}

TEST(Stage3, UnitCasesTrainWithParity) {
  auto cfg = toy_config(3, 4, 20);
  auto ref_cfg = toy_config(0, 4 * world().size());
  UnitNet m, ref;
  zero::Engine e(m, cfg, world().comm(), dp_group());
  zero::Engine er(ref, ref_cfg, world().comm(), solo_group());
  // a (64 + 3 unused) is its own group; b and c share w (root); d (8 elements) is persistent.
  EXPECT_GT(e.persistent_params(), 64 + 8);
  const auto version = m.a->inner->w._version();
  for (int step = 0; step < 6; ++step) step_with_reference(e, m, er, ref, 200 + step, 8);
  auto got = e.full_parameters(), want = er.full_parameters();
  EXPECT_LT(max_abs_diff(got, want), 1e-5);
  EXPECT_GT(e.peak_live_params(), 0);
  // Gathers and updates write the flat buffers, never through the param.
  EXPECT_EQ(m.a->inner->w._version(), version);
  // Only unit a is ever gathered and released: at most its group (67
  // elements padded to a multiple of 16·N) is live.
  const int64_t pad = 16 * world().size();
  EXPECT_LE(e.peak_live_params(), (67 + pad - 1) / pad * pad);
}

// The schedule from the second step on: prefetch and reuse stay within
// stage3_max_live_parameters in forward, change no result (bit for bit), and
// reuse saves the backward regather.
TEST(Stage3, ScheduleRespectsLimitsAndKeepsParity) {
  RunSpec classic;
  classic.stage = 3;
  auto base = train(classic, dp_group(), 6);
  GptTrainer probe(small_gpt(), make_config(classic), corpus(), 7, world().comm(), dp_group());
  const int64_t unit = (probe.engine().num_params() - probe.engine().persistent_params()) / small_gpt().n_layer;
  for (int64_t max_live : {unit, 2 * unit + 64, int64_t{1} << 30})
    for (int64_t reuse : {int64_t{0}, int64_t{1} << 30}) {
      SCOPED_TRACE("max_live " + std::to_string(max_live) + " reuse " + std::to_string(reuse));
      RunSpec s = classic;
      s.max_live = max_live;
      s.reuse_distance = reuse;
      s.prefetch = 2 * unit + 64;
      GptTrainer t(small_gpt(), make_config(s), corpus(), 7, world().comm(), dp_group());
      for (int i = 0; i < 6; ++i) {
        t.engine().reset_peak_live_params();
        auto r = t.train_step();
        EXPECT_EQ(r.loss, base.losses[i]) << "step " << i;
        EXPECT_LE(t.engine().peak_live_params(), std::max(max_live, unit + 64)) << "step " << i;
        if (i >= 1 && reuse > 0 && max_live > 2 * unit + 64) {
          // Units kept from forward through backward: gathered once per step, not twice.
          const double persistent = static_cast<double>(t.engine().persistent_params());
          const double units = static_cast<double>(t.engine().num_params()) - persistent;
          EXPECT_NEAR(r.comm.at("allgather").bytes, 4 * (units + persistent), 4 * 64 * 4.0);
        }
      }
      EXPECT_EQ(max_abs_diff(t.engine().full_parameters(), base.params), 0.0);
    }
}

// DeepSpeed users' most common hang: ranks running units in different
// orders. Here it is an error on every rank, naming the units. (On a group
// of its own: a shared-memory lane that saw ranks disagree stays failed.)
TEST(Stage3, DivergentUnitOrderIsAnErrorOnAllRanks) {
  auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                {"optimizer", {{"type", "AdamW"}}},
                                {"zero_optimization", {{"stage", 3}, {"stage3_param_persistence_threshold", 0}}}});
  UnitNet m;
  zero::Engine e(m, cfg, world().comm(), fresh_dp_group());
  auto x = at::randn({4, 8});
  try {
    // Rank 1 runs d before a; everyone else a before d.
    auto h = dp_group()->rank() == 1 ? m.a->forward(m.d->forward(x)) : m.d->forward(m.a->forward(x));
    e.backward(h.sum());
    ADD_FAILURE() << "no error";
  } catch (const zero::comm::CollectiveMismatch& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("different orders"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unit 'a'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unit 'd'"), std::string::npos) << msg;
  }
}

TEST(Stage3, ZeroInitStartsEveryRankFromRankZerosWeights) {
  RunSpec s;
  s.stage = 3;
  const auto cfg = make_config(s);
  // Each rank's RNG differs; the model built under zero::Init must still
  // equal the one rank 0 builds (seed 7) without it.
  at::manual_seed(7 + 1000 * dp_group()->rank());
  zero::models::GPT built{nullptr};
  {
    zero::Init init(world().comm(), dp_group(), cfg);
    built = zero::models::GPT(small_gpt());
    EXPECT_EQ(init.units_sharded(), small_gpt().n_layer);
  }
  zero::Engine e(*built, cfg, world().comm(), dp_group());
  at::manual_seed(7);
  zero::models::GPT plain(small_gpt());
  std::map<std::string, at::Tensor> want;
  for (const auto& item : plain->named_parameters()) want[item.key()] = item.value().detach().clone();
  EXPECT_EQ(max_abs_diff(e.full_parameters(), want), 0.0);

  // And training from it matches training without zero::Init, bit for bit.
  GptTrainer with(small_gpt(), cfg, corpus(), 7, world().comm(), dp_group(), /*zero_init=*/true);
  GptTrainer without(small_gpt(), cfg, corpus(), 7, world().comm(), dp_group(), /*zero_init=*/false);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(with.train_step().loss, without.train_step().loss);
  EXPECT_EQ(max_abs_diff(with.engine().full_parameters(), without.engine().full_parameters()), 0.0);

  zero::Config stage2 = make_config(RunSpec{});
  EXPECT_THROW(zero::Init(world().comm(), dp_group(), stage2), zero::ConfigError);
}

// Peak resident memory (VmHWM, reset through /proc/self/clear_refs) grown
// while building a model.
int64_t build_peak_growth(const std::function<void()>& build) {
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

TEST(Stage3, EvalForwardsInPlaceOpsAndParamlessUnits) {
  auto cfg = toy_config(3, 4, 0);
  auto ref_cfg = toy_config(0, 4 * world().size());
  InPlaceNet m, ref;
  zero::Engine e(m, cfg, world().comm(), dp_group());
  zero::Engine er(ref, ref_cfg, world().comm(), solo_group());
  for (int step = 0; step < 5; ++step) {
    at::manual_seed(300 + step);
    auto x = at::randn({4 * world().size(), 8});
    {
      at::NoGradGuard eval;
      EXPECT_NEAR(m.loss(x).item<double>(), ref.loss(x).item<double>(), 1e-5);
    }
    e.backward(m.loss(x.narrow(0, 4 * dp_group()->rank(), 4)));
    e.step();
    er.backward(ref.loss(x));
    er.step();
  }
  EXPECT_LT(max_abs_diff(e.full_parameters(), er.full_parameters()), 1e-5);
}

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

// On both transports: issuing a collective never waits for the peers (a
// rank whose unit completes early launches its reduce-scatter while its
// peer still gathers the next unit).
TEST(Stage3, ParamUnusedOnSomeRanksOnly) {
  const int N = world().size();
  for (bool fast_path : {true, false}) {
    SCOPED_TRACE(fast_path ? "shared memory" : "gloo");
    // No prefetch: each backward gather is issued when its unit is reached,
    // between the reduce-scatters the grad hooks launch.
    auto j = nlohmann::json{{"train_micro_batch_size_per_gpu", 4},
                            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                            {"zero_optimization", {{"stage", 3}, {"stage3_param_persistence_threshold", 0},
                                                   {"stage3_prefetch_bucket_size", 1}}},
                            {"zero_cpp", {{"comm_fast_path", fast_path}}}};
    GatedNet m, ref;
    zero::Engine e(m, Config::from_json(j), world().comm(), dp_group());
    zero::Engine er(ref, toy_config(0, 4 * N), world().comm(), solo_group());
    for (int step = 0; step < 5; ++step) {
      at::manual_seed(400 + step);
      auto x = at::randn({4 * N, 8});
      const int r = dp_group()->rank();
      e.backward(m.loss(x.narrow(0, 4 * r, 4), /*use_gate=*/r == 0));
      e.step();
      // The same math in one process: rank 0's rows use the gate, the rest do not.
      at::Tensor total = ref.loss(x.narrow(0, 0, 4), true);
      for (int k = 1; k < N; ++k) total = total + ref.loss(x.narrow(0, 4 * k, 4), false);
      er.backward(total / N);
      er.step();
    }
    EXPECT_LT(max_abs_diff(e.full_parameters(), er.full_parameters()), 1e-5);
    world().comm().set_fast_paths_enabled(true);
  }
}

TEST(Stage3, ZeroInitRejectsParamsSharedBetweenUnits) {
  RunSpec s;
  s.stage = 3;
  try {
    zero::Init init(world().comm(), dp_group(), make_config(s));
    UnitNet m;  // b and c share one weight
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("already sharded by another unit"), std::string::npos) << e.what();
  }
}

TEST(Stage3, ZeroInitNeverHoldsTheWholeModel) {
  RunSpec s;
  s.stage = 3;
  const auto cfg = make_config(s);
  zero::models::GPTConfig big = small_gpt();
  big.n_layer = 48;
  big.d_model = 256;  // 48 units of 0.79M params: 151 MB of fp32 in all
  const double model_bytes = 4.0 * big.num_params();
  const double unit_bytes = 4.0 * 12 * 256 * 256;
  const int64_t plain = build_peak_growth([&] { zero::models::GPT m(big); });
  const int64_t sharded = build_peak_growth([&] {
    zero::Init init(world().comm(), dp_group(), cfg);
    zero::models::GPT m(big);
  });
  EXPECT_GE(plain, 0.8 * model_bytes);  // (less: the heap reuses what earlier tests freed)
  // This rank's shards, plus about one unit being built and flattened (and
  // the small root and allocator slack).
  EXPECT_LT(sharded, model_bytes / world().size() + 4 * unit_bytes + (12 << 20))
      << "plain build grew " << plain << " bytes";
}

TEST(MixedPrecision, Fp16OverflowSkipsTheStepOnAllRanks) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                  {"fp16", {{"enabled", true}, {"initial_scale_power", 8}, {"hysteresis", 1}}},
                                  {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                                  {"zero_optimization", {{"stage", stage}}}});
    WithUnused m;
    zero::Engine e(m, cfg, world().comm(), dp_group());
    auto x = at::randn({4, 13});
    e.backward(m.loss(x));
    EXPECT_TRUE(e.step());
    const auto before = m.used.clone();
    // Only rank 0's grads overflow; every rank must skip.
    auto loss = m.loss(x);
    if (dp_group()->rank() == 0) loss = loss * std::numeric_limits<float>::infinity();
    e.backward(loss);
    EXPECT_FALSE(e.step());
    EXPECT_EQ(e.skipped_steps(), 1);
    EXPECT_EQ(e.loss_scale(), 128.0);  // 2^8 halved
    EXPECT_TRUE(m.used.equal(before));
    e.backward(m.loss(x));
    EXPECT_TRUE(e.step());
    EXPECT_EQ(e.global_steps(), 2);
  }
}

// Several backward calls per step at stages 0/1: inside no_sync() and with
// a manual boundary they communicate nothing until the boundary backward,
// which reduces all of it once.
TEST(MultipleBackward, NoSyncAndManualBoundary) {
  const int N = world().size();
  for (int stage : {0, 1}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    WithUnused m, ref;
    zero::Engine e(m, toy_config(stage, 4), world().comm(), dp_group());
    zero::Engine er(ref, toy_config(0, 4 * N * 3), world().comm(), solo_group());
    at::manual_seed(500);
    std::vector<at::Tensor> chunks;
    for (int k = 0; k < 3; ++k) chunks.push_back(at::randn({4 * N, 13}));
    const int r = dp_group()->rank();
    const auto before = world().comm().counters().totals();
    {
      auto guard = e.no_sync();
      e.set_gradient_accumulation_boundary(false);
      for (int k = 0; k < 2; ++k) e.backward(m.loss(chunks[k].narrow(0, 4 * r, 4)) / 3);
      EXPECT_TRUE(zero::comm::diff(world().comm().counters().totals(), before).empty()) << "no_sync communicates";
      EXPECT_THROW(
          {
            e.set_gradient_accumulation_boundary(true);
            e.step();
          },
          std::logic_error);
    }
    e.set_gradient_accumulation_boundary(true);
    e.backward(m.loss(chunks[2].narrow(0, 4 * r, 4)) / 3);
    EXPECT_TRUE(e.step());
    e.clear_gradient_accumulation_boundary();
    er.backward(ref.loss(at::cat(chunks)));
    er.step();
    EXPECT_TRUE(at::allclose(m.used, ref.used, 0, 1e-5));
  }
  WithUnused m2;
  zero::Engine e2(m2, toy_config(2, 4), world().comm(), dp_group());
  try {
    auto guard = e2.no_sync();
    ADD_FAILURE() << "no error";
  } catch (const std::logic_error& err) {
    EXPECT_NE(std::string(err.what()).find("stages 0 and 1"), std::string::npos) << err.what();
  }
}

// coalesce_grad_reduction(): N backward calls, one reduction pass.
Config coalesce_config(int stage, int64_t gas, bool overlap, bool contiguous, const char* dtype = "fp32") {
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
std::pair<std::map<std::string, at::Tensor>, int64_t> run_chunks(int stage, int n, bool overlap, bool contiguous,
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

TEST(MultipleBackward, CoalescedReductionMatchesSeparateOnes) {
  for (int stage : {1, 2, 3})
    for (bool overlap : {true, false})
      for (bool contiguous : {true, false}) {
        if (stage == 1 && !contiguous) continue;  // stage 1 keeps full grads: nothing to vary
        // One backward per step: the reduce-scatters of one reduction pass.
        const int64_t one_pass = run_chunks(stage, 1, overlap, contiguous, Backwards::Separate).second;
        ASSERT_GT(one_pass, 0);
        for (int n : {2, 4, 8}) {
          SCOPED_TRACE("stage " + std::to_string(stage) + " overlap " + std::to_string(overlap) + " contiguous " +
                       std::to_string(contiguous) + " N " + std::to_string(n));
          auto [coalesced, coalesced_rs] = run_chunks(stage, n, overlap, contiguous, Backwards::Coalesced);
          auto [separate, separate_rs] = run_chunks(stage, n, overlap, contiguous, Backwards::Separate);
          EXPECT_EQ(coalesced_rs, one_pass);
          EXPECT_EQ(separate_rs, n * one_pass);
          // Bit-exact against stage 1's own accumulation over N micro-batches,
          // which also sums the chunks' grads locally and reduces once. Against
          // N separate reductions only to round-off: they average each chunk
          // across ranks and then add the averages, another order of float sums.
          auto accumulated = run_chunks(1, n, overlap, true, Backwards::Accumulated).first;
          EXPECT_EQ(max_abs_diff(coalesced, accumulated), 0.0);
          EXPECT_LT(max_abs_diff(coalesced, separate), 1e-6);
        }
      }
}

TEST(MultipleBackward, CoalescedMatchesOneBackwardOverTheWholeBatch) {
  const int N = world().size();
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    UnitNet m, ref;
    zero::Engine e(m, coalesce_config(stage, 1, true, true), world().comm(), dp_group());
    zero::Engine er(ref, toy_config(0, 4 * N * 4), world().comm(), solo_group());
    at::manual_seed(950);
    std::vector<at::Tensor> chunks;
    for (int k = 0; k < 4; ++k) chunks.push_back(at::randn({4 * N, 8}));
    zero::StateBytes inside;
    {
      auto guard = e.coalesce_grad_reduction();
      for (auto& x : chunks) e.backward(m.loss(x.narrow(0, 4 * dp_group()->rank(), 4)) / 4);
      inside = e.state_bytes();
    }
    // The guard's cost: full grads held until it ends (stage 1 always holds them).
    EXPECT_GE(inside.grads, e.num_params() * 4);
    EXPECT_TRUE(e.step());
    er.backward(ref.loss(at::cat(chunks)));
    er.step();
    auto got = e.full_parameters(), want = er.full_parameters();
    EXPECT_LT(max_abs_diff(got, want), 1e-5);
  }
}

TEST(MultipleBackward, Fp16OverflowInsideTheGuardSkipsTheStepEverywhere) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    UnitNet m;
    zero::Engine e(m, coalesce_config(stage, 1, true, true, "fp16"), world().comm(), dp_group());
    auto x = at::randn({4, 8});
    const auto before = e.full_parameters();
    {
      auto guard = e.coalesce_grad_reduction();
      e.backward(m.loss(x) / 2);
      auto loss = m.loss(x) / 2;
      if (dp_group()->rank() == 0) loss = loss * std::numeric_limits<float>::infinity();  // one rank overflows
      e.backward(loss);
    }
    EXPECT_FALSE(e.step());
    EXPECT_EQ(e.skipped_steps(), 1);
    EXPECT_EQ(e.loss_scale(), 128.0);
    EXPECT_EQ(max_abs_diff(e.full_parameters(), before), 0.0);
    {
      auto guard = e.coalesce_grad_reduction();
      for (int k = 0; k < 2; ++k) e.backward(m.loss(x) / 2);
    }
    EXPECT_TRUE(e.step());
    EXPECT_GT(max_abs_diff(e.full_parameters(), before), 0.0);
  }
}

TEST(MultipleBackward, CoalesceMisuseIsAnError) {
  auto expect_msg = [](auto&& fn, const std::string& part) { expect_error<std::logic_error>(fn, part); };
  UnitNet m0, m1;
  zero::Engine e0(m0, coalesce_config(0, 1, true, true), world().comm(), dp_group());
  zero::Engine e1(m1, coalesce_config(1, 1, true, true), world().comm(), dp_group());
  expect_msg([&] { auto g = e0.coalesce_grad_reduction(); }, "stages 1-3");
  expect_msg([&] {
    auto g = e1.coalesce_grad_reduction();
    auto h = e1.coalesce_grad_reduction();
  }, "cannot be nested");
  expect_msg([&] {
    auto g = e1.no_sync();
    auto h = e1.coalesce_grad_reduction();
  }, "use one or the other");
  expect_msg([&] {
    auto g = e1.coalesce_grad_reduction();
    auto h = e1.no_sync();
  }, "use one or the other");
  expect_msg([&] {
    auto g = e1.coalesce_grad_reduction();
    e1.backward(m1.loss(at::randn({4, 8})));
    e1.step();
  }, "inside coalesce_grad_reduction");
  // After the misuse the engine still trains (the guard above reduced on exit).
  EXPECT_TRUE(e1.step());
}

// ---- checkpoints ---------------------------------------------------------------

// Save at step 3, load into a fresh engine, steps 4..6: losses and params
// bit for bit those of an uninterrupted run (data order, LR schedule, Adam
// moments, loss scale all restored).
TEST(Checkpoint, ResumeIsExact) {
  for (const char* dtype : {"fp32", "bf16"})
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE(std::string(dtype) + " stage " + std::to_string(stage));
      RunSpec s;
      s.stage = stage;
      s.dtype = dtype;
      const auto dir = ckpt_dir(std::string("exact-") + dtype + std::to_string(stage));
      GptTrainer full(small_gpt(), make_config(s), corpus(), 7, world().comm(), dp_group());
      std::vector<double> want;
      for (int i = 0; i < 6; ++i) want.push_back(full.train_step().loss);
      {
        GptTrainer first(small_gpt(), make_config(s), corpus(), 7, world().comm(), dp_group());
        for (int i = 0; i < 3; ++i) first.train_step();
        first.save(dir);
      }
      GptTrainer resumed(small_gpt(), make_config(s), corpus(), 7, world().comm(), dp_group());
      resumed.resume(dir);
      EXPECT_EQ(resumed.steps_done(), 3);
      EXPECT_EQ(resumed.engine().global_steps(), 3);
      for (int i = 3; i < 6; ++i) EXPECT_EQ(resumed.train_step().loss, want[i]) << "step " << i + 1;
      EXPECT_EQ(max_abs_diff(resumed.engine().full_parameters(), full.engine().full_parameters()), 0.0);
      remove_dir(dir);
    }
}

// Saved by `from` at stage_from, loaded by `to` at stage_to (groups may be
// null on ranks outside them): training goes on as a run that was on `to`
// from the start, to the parity tests' round-off. The global batch is 4
// sequences at every size, so the runs see the same data.
void expect_reshard(std::shared_ptr<zero::comm::Group> from, int stage_from, std::shared_ptr<zero::comm::Group> to,
                    int stage_to, const std::string& name) {
  const auto dir = ckpt_dir(name);
  auto spec = [](int stage, const zero::comm::Group& g) {
    RunSpec s;
    s.stage = stage;
    s.micro = 4 / g.size();
    return s;
  };
  if (from) {
    GptTrainer t(small_gpt(), make_config(spec(stage_from, *from)), corpus(), 7, world().comm(), from);
    for (int i = 0; i < 3; ++i) t.train_step();
    t.save(dir);
  }
  world().comm().barrier(world().group())->wait();
  if (to) {
    GptTrainer ref(small_gpt(), make_config(spec(stage_to, *to)), corpus(), 7, world().comm(), to);
    GptTrainer resumed(small_gpt(), make_config(spec(stage_to, *to)), corpus(), 7, world().comm(), to);
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

TEST(Checkpoint, ReshardsToAnotherWorldSizeAndStage) {
  const int n = world().size();
  if (n == 2) {
    expect_reshard(dp_group(), 2, solo_group(), 0, "2to1");
    expect_reshard(dp_group(), 3, dp_group(), 1, "stage3to1");
  } else if (n == 4) {
    expect_reshard(first_ranks(2), 1, dp_group(), 3, "2to4");
    expect_reshard(dp_group(), 3, first_ranks(2), 2, "4to2");
  }
}

// The consolidated file of a stage-3 bf16 run holds its fp32 master weights
// by name; of a stage-3 fp32 run, exactly a stage-0 run's params (the stages
// are bit-identical at 2 ranks); load_weights() puts them back.
TEST(Checkpoint, ConsolidatedWeightsAreTheParams) {
  if (world().size() != 2) GTEST_SKIP() << "the stage-0 identity is exact at 2 ranks";
  RunSpec s0, s3;
  s0.clip = s3.clip = 0.0;  // with clipping the norm's per-group sums differ in the last bit
  s3.stage = 3;
  GptTrainer t0(small_gpt(), make_config(s0), corpus(), 7, world().comm(), dp_group());
  GptTrainer t3(small_gpt(), make_config(s3), corpus(), 7, world().comm(), dp_group());
  for (int i = 0; i < 3; ++i) t0.train_step(), t3.train_step();
  const auto dir = ckpt_dir("consolidate");
  t3.save(dir);
  const std::string out = dir + "-weights.safetensors";
  if (world().rank() == 0) zero::ckpt::consolidate(dir, "", out, "fp32");
  world().comm().barrier(world().group())->wait();
  {
    zero::ckpt::SafetensorsFile f(out);
    const auto want = t0.engine().full_parameters();
    EXPECT_EQ(f.entries().size(), want.size());
    for (const auto& [name, t] : want) {
      ASSERT_TRUE(f.has(name)) << name;
      EXPECT_EQ(f.entry(name).shape, t.sizes().vec()) << name;
      EXPECT_EQ(std::memcmp(f.data(name), t.data_ptr<float>(), t.numel() * 4), 0) << name;
    }
  }
  GptTrainer fresh(small_gpt(), make_config(s3), corpus(), 99, world().comm(), dp_group());
  fresh.engine().load_weights(out);
  EXPECT_EQ(max_abs_diff(fresh.engine().full_parameters(), t0.engine().full_parameters()), 0.0);
  world().comm().barrier(world().group())->wait();
  if (world().rank() == 0) std::filesystem::remove(out);
  remove_dir(dir);
}

TEST(Checkpoint, MismatchesAreNamedOnEveryRank) {
  RunSpec s;
  s.stage = 2;
  const auto dir = ckpt_dir("mismatch");
  {
    GptTrainer t(small_gpt(), make_config(s), corpus(), 7, world().comm(), dp_group());
    t.train_step();
    t.save(dir);
  }
  auto other = small_gpt();
  other.d_model = 32;
  GptTrainer t(other, make_config(s), corpus(), 7, world().comm(), dp_group());
  try {
    t.resume(dir);
    ADD_FAILURE() << "loaded a checkpoint of another model";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("different model"), std::string::npos) << e.what();
  }
  t.train_step();  // refused before anything was written: the engine trains on
  // Truncate one rank's file: every rank fails (none hangs), naming it.
  world().comm().barrier(world().group())->wait();
  const std::string victim = dir + "/step1/rank_1.safetensors";
  if (world().rank() == 0) std::filesystem::resize_file(victim, std::filesystem::file_size(victim) - 100);
  world().comm().barrier(world().group())->wait();
  GptTrainer same(small_gpt(), make_config(s), corpus(), 7, world().comm(), dp_group());
  try {
    same.resume(dir);
    ADD_FAILURE() << "loaded a truncated checkpoint";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("rank_1.safetensors") != std::string::npos || msg.find("another rank") != std::string::npos)
        << msg;
  }
  // Rank 0 had already loaded its shards: the ranks disagree, so training is refused.
  try {
    same.train_step();
    ADD_FAILURE() << "trained on after a load that failed part way";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("load again"), std::string::npos) << e.what();
  }
  remove_dir(dir);
}

TEST(BadInput, ClearErrors) {
  auto expect_msg = [](auto&& fn, const std::string& part) { expect_error(fn, part); };
  WithUnused m;
  auto opt = nlohmann::json{{"type", "AdamW"}};
  expect_msg([&] {
    zero::Engine(m, Config::from_json({{"train_batch_size", world().size() + 1}, {"optimizer", opt}}), world().comm(),
                 dp_group());
  }, "not divisible by the data-parallel size");
  expect_msg([&] {
    torch::nn::Module empty;
    zero::Engine(empty, Config::from_json({{"train_batch_size", 8}, {"optimizer", opt}}), world().comm(), dp_group());
  }, "no trainable parameters");
  expect_msg([&] { zero::Engine(m, Config::from_json({{"train_batch_size", 8}}), world().comm(), dp_group()); },
             "\"optimizer\" block is required");
}

}  // namespace
