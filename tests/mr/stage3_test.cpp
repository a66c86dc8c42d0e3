// Stage 3: zero::Unit cases, the prefetch/reuse schedule, zero::Init, diverging unit
// orders, weights shared across a unit, and params used outside their unit's forward
// (gathered scopes, the state dict, the message a released param stops the process with).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "fixtures.h"
#include "memory/page_buffer.h"
#include "memory/shared_arena.h"

namespace {

using namespace zero::test;

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

// The backward's full grad buffers -- one per unit, freed after its
// reduce-scatter -- take the pages the previous ones left
// (memory/shared_arena.h, KeepFreedSharedPages) instead of faulting fresh
// ones in: reused at every step after the first, the same losses and params
// as one process (a reused buffer starts from zeros: stale grads would show
// here). Past the backward only the last freed buffer of each size it
// first asked for stays kept (after the first step, one of what it mapped
// afresh), which the next backward's first buffers take: the same ones every
// step, so from the second step on a backward maps less afresh.
TEST(Stage3, GradBuffersTakeTheFreedOnesPagesWithParity) {
  zero::models::GPTConfig model = small_gpt();
  model.n_layer = 6;  // six units of the same size: more than are ever live at once
  RunSpec s;
  s.stage = 3;
  s.persistence = 0;
  auto run = [&](const RunSpec& spec, std::shared_ptr<zero::comm::Group> g, uint64_t* reuses) {
    GptTrainer t(model, make_config(spec), corpus(), /*seed=*/7, world().comm(), g);
    RunResult r;
    const uint64_t before = zero::memory::shared_arena_stats().kept_reuses;
    size_t first_fresh = 0, later_fresh = 0, first_carried = 0;
    for (int i = 0; i < 4; ++i) {
      r.losses.push_back(t.train_step().loss);
      if (!reuses) continue;  // the reference: stage 0 keeps nothing
      const auto arena = zero::memory::shared_arena_stats();
      (i == 0 ? first_fresh : later_fresh) += arena.fresh_bytes;
      // One buffer of each size a backward first asks for (the root's and a
      // unit's), every step: a size whose first buffer took the carried pages
      // is carried on again, not every other step, and a buffer freed by the
      // lane's thread is freed before the backward ends, not after.
      if (i == 0) {
        EXPECT_LE(arena.kept_bytes, arena.fresh_bytes) << "kept past the first backward";
        first_carried = arena.kept_bytes;
      } else {
        EXPECT_EQ(arena.kept_bytes, first_carried) << "step " << i << ": carried other buffers than step 0";
      }
    }
    // Over the three later steps, not each: how many buffers are live at once,
    // and so mapped afresh, depends on when each reduce-scatter ends.
    if (reuses) {
      EXPECT_LT(later_fresh, 3 * first_fresh) << "the first grad buffers were mapped afresh every step";
      *reuses = zero::memory::shared_arena_stats().kept_reuses - before;
    }
    r.params = t.engine().full_parameters();
    return r;
  };
  uint64_t reuses = 0;
  const RunResult dist = run(s, dp_group(), &reuses);
  RunSpec ref = s;
  ref.stage = 0;
  ref.micro *= world().size();
  const RunResult want = run(ref, solo_group(), nullptr);
  // How many are live at once depends on when each reduce-scatter ends; at
  // least two of the six a backward (12-14 of 24 at 2 ranks when written).
  EXPECT_GE(reuses, 4u * 2) << "units' grad buffers took freed ones' pages";
  EXPECT_LT(max_rel_loss_diff(dist.losses, want.losses), kLossRelTol);
  expect_params_close(dist.params, want.params);
}

// The same with a model as a user writes one: stock torch::nn layers, each
// Linear a zero::Unit, one of them frozen, a LayerNorm and its params
// outside every unit. Parity with one process and reused grad pages.
struct StockUnitsNet : torch::nn::Module {
  StockUnitsNet() {
    at::manual_seed(23);
    frozen = register_module("frozen", zero::Unit<torch::nn::Linear>(16, 16));
    for (auto& p : frozen->parameters()) p.requires_grad_(false);
    for (int i = 0; i < 6; ++i)
      layers.push_back(register_module("l" + std::to_string(i), zero::Unit<torch::nn::Linear>(16, 16)));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})));
  }
  at::Tensor loss(const at::Tensor& x) {
    at::Tensor h = frozen->forward(x);
    for (auto& l : layers) h = at::tanh(l->forward(h));
    return ln->forward(h).pow(2).mean();
  }
  zero::Unit<torch::nn::Linear> frozen{nullptr};
  std::vector<zero::Unit<torch::nn::Linear>> layers;
  torch::nn::LayerNorm ln{nullptr};
};

TEST(Stage3, StockLayerUnitsTakeFreedGradPagesWithParity) {
  StockUnitsNet m, ref;
  zero::Engine e(m, toy_config(3, 4, 20), world().comm(), dp_group());
  zero::Engine er(ref, toy_config(0, 4 * world().size()), world().comm(), solo_group());
  const uint64_t before = zero::memory::shared_arena_stats().kept_reuses;
  for (int step = 0; step < 4; ++step) {
    step_with_reference(e, m, er, ref, 300 + step, 16);
    const auto arena = zero::memory::shared_arena_stats();
    EXPECT_LE(arena.kept_bytes, arena.fresh_bytes) << "step " << step << ": kept past the backward";
  }
  EXPECT_GE(zero::memory::shared_arena_stats().kept_reuses - before, 4u * 2);
  EXPECT_LT(max_abs_diff(e.full_parameters(), er.full_parameters()), 1e-5);
}

// And the gathers of that user's model: its Linear units released after
// each forward (no reuse distance) with one prefetched ahead, as the
// benchmark's GPT runs, take the pages of the unit released before them.
// The same params bit for bit as stage 3 keeping every unit gathered from
// its forward to its backward (the default schedule, which regathers
// nothing: a byte of another unit's params left in a gathered buffer
// would show), and as one process within its tolerance; 0 hand-overs with
// ZERO_KEEP_FREED_PAGES=off.
TEST(Stage3, StockLayerUnitsGathersTakeReleasedUnitsPagesWithParity) {
  StockUnitsNet m, kept, ref;
  auto j = toy_config(3, 4, 20, /*prefetch=*/300).to_json();  // a Linear(16, 16) is 272 params
  j["zero_optimization"]["stage3_max_reuse_distance"] = 0;
  zero::Engine e(m, Config::from_json(j), world().comm(), dp_group());
  zero::Engine ek(kept, toy_config(3, 4, 20), world().comm(), dp_group());
  zero::Engine er(ref, toy_config(0, 4 * world().size()), world().comm(), solo_group());
  uint64_t handoffs = 0;
  for (int step = 0; step < 4; ++step) {
    const uint64_t before = zero::memory::page_handoffs();
    step_with_reference(e, m, er, ref, 300 + step, 16);
    handoffs += zero::memory::page_handoffs() - before;
    at::manual_seed(300 + step);
    at::Tensor x = at::randn({4 * world().size(), 16});
    ek.backward(kept.loss(x.narrow(0, 4 * dp_group()->rank(), 4)));
    ek.step();
  }
  // 29 at 2 ranks, 35 at 4 when written.
  EXPECT_GE(handoffs, 4u * 4);
  EXPECT_EQ(max_abs_diff(e.full_parameters(), ek.full_parameters()), 0.0);
  EXPECT_LT(max_abs_diff(e.full_parameters(), er.full_parameters()), 1e-5);
}

// A unit's gather takes the pages of the unit released just before it
// (memory/page_buffer.h hold_pages) instead of clearing fresh ones, and
// overwrites them: a byte of the other unit's params left over would show
// as a loss or a param off stage 1's on the same ranks (bit for bit, as
// Parity.StagesAgreeWithEachOtherAcrossOptions holds the stages to), in
// fp32, in bf16 (2-byte params, half the pages), and in bf16 gathering the
// fp32 master (the buffer written by a cast after the gather). Six units of one size,
// one prefetched ahead of use (the benchmark's schedule): most gathers take
// a released unit's pages.
TEST(Stage3, GathersTakeTheReleasedUnitsPagesBitForBit) {
  zero::models::GPTConfig model = small_gpt();
  model.n_layer = 6;
  const int steps = 4;
  for (const auto& [dtype, fp32_master] : {std::pair{"fp32", false}, {"bf16", false}, {"bf16", true}}) {
    SCOPED_TRACE(std::string(dtype) + (fp32_master ? ", gathering the fp32 master" : ""));
    RunSpec s;
    s.dtype = dtype;
    s.gather_fp32_master = fp32_master;
    s.clip = 0.0;  // as in the stages' bit-for-bit test: the norm is summed per shard in stage 1
    s.persistence = 0;
    auto run = [&](int stage, uint64_t* handoffs, uint64_t* gathers) {
      RunSpec spec = s;
      spec.stage = stage;
      // One block is ~50k params: the next unit only is gathered ahead.
      spec.prefetch = 60000;
      GptTrainer t(model, make_config(spec), corpus(), /*seed=*/7, world().comm(), dp_group());
      RunResult r;
      const uint64_t before = zero::memory::page_handoffs();
      for (int i = 0; i < steps; ++i) {
        const auto step = t.train_step();
        r.losses.push_back(step.loss);
        if (gathers && step.comm.count("allgather")) *gathers += step.comm.at("allgather").calls;
      }
      if (handoffs) *handoffs = zero::memory::page_handoffs() - before;
      r.params = t.engine().full_parameters();
      return r;
    };
    uint64_t handoffs = 0, gathers = 0;
    const RunResult got = run(3, &handoffs, &gathers);
    const RunResult want = run(1, nullptr, nullptr);
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_EQ(max_abs_diff(got.params, want.params), 0.0);
    // Each step gathers the root and six units twice; those that follow a
    // release of a unit of their size take its pages, from the second step
    // on in forward too (29 of 55 at 2 and 4 ranks when written; 0 with
    // ZERO_KEEP_FREED_PAGES=off).
    EXPECT_GE(handoffs, gathers / 3) << handoffs << " of " << gathers << " gathers took a released unit's pages";
  }
}

// Seed 000's unfused baseline (zero_cpp.stage3_gather_fp32_master) gathers
// the fp32 master and downcasts after: the values the fused path's 16-bit
// gather carries (the optimizer wrote them from the same master, rounded
// to nearest even), so the same losses bit for bit, at twice the bytes.
TEST(Stage3, Fp32MasterGatherIsTheFusedPathsBaseline) {
  auto run = [](bool unfused, int64_t& gather_bytes) {
    RunSpec s;
    s.stage = 3;
    s.dtype = "bf16";
    s.prefetch = 20000;  // from the second step on, gathers run ahead (the ThenWork path)
    s.gather_fp32_master = unfused;
    GptTrainer t(small_gpt(), make_config(s), corpus(), /*seed=*/7, world().comm(), dp_group());
    std::vector<double> losses;
    for (int i = 0; i < 6; ++i) {
      auto r = t.train_step();
      losses.push_back(r.loss);
      gather_bytes = static_cast<int64_t>(r.comm.at("allgather").bytes);
    }
    return std::make_pair(losses, t.engine().full_parameters());
  };
  int64_t fused_bytes = 0, unfused_bytes = 0;
  const auto [fused_losses, fused_params] = run(false, fused_bytes);
  const auto [unfused_losses, unfused_params] = run(true, unfused_bytes);
  EXPECT_EQ(fused_losses, unfused_losses);
  EXPECT_EQ(max_abs_diff(fused_params, unfused_params), 0.0);
  EXPECT_EQ(unfused_bytes, 2 * fused_bytes);
}

// ZeRO++ hpZ on one host: a partition of the whole group changes nothing
// (every gather stays on the host already); any other size is named. (On
// several hosts, multihost_test.sh checks its bytes and losses.)
TEST(Stage3, HpzOnOneHostIsTheGroupSizeOrNamed) {
  if (world().size() < 2) GTEST_SKIP();
  auto with_hpz = [](int64_t size) {
    auto j = toy_config(3, 4, 20).to_json();
    j["zero_optimization"]["zero_hpz_partition_size"] = size;
    return Config::from_json(j);
  };
  UnitNet a, b;
  zero::Engine plain(a, toy_config(3, 4, 20), world().comm(), dp_group());
  zero::Engine hpz(b, with_hpz(world().size()), world().comm(), dp_group());
  for (int step = 0; step < 3; ++step) {
    at::manual_seed(300 + step);
    at::Tensor x = at::randn({4 * world().size(), 8}).narrow(0, 4 * dp_group()->rank(), 4);
    plain.backward(a.loss(x));
    plain.step();
    hpz.backward(b.loss(x));
    hpz.step();
  }
  EXPECT_EQ(max_abs_diff(plain.full_parameters(), hpz.full_parameters()), 0.0);
  UnitNet c;
  expect_error<zero::ConfigError>([&] { zero::Engine e(c, with_hpz(world().size() + 1), world().comm(), dp_group()); },
                                  "zero_hpz_partition_size = " + std::to_string(world().size() + 1) +
                                      ", but group 'dp0'");
}

// The schedule from the second step on: prefetch and reuse stay within
// stage3_max_live_parameters in forward, change no result (bit for bit), and
// reuse saves the backward regather.
TEST(Stage3, ScheduleRespectsLimitsAndKeepsParity) {
  RunSpec classic;
  classic.stage = 3;
  auto base = train(classic, dp_group(), 6);
  GptTrainer probe(small_gpt(), make_config(classic), corpus(), 7, world().comm(), dp_group());
  // Before its first engine.forward() only the root is persistent. The
  // trainer's forward runs inside engine.forward(), so the root is then a
  // unit gathered throughout each forward, on top of what the limits allow.
  const int64_t root = probe.engine().persistent_params();
  const int64_t unit = (probe.engine().num_params() - root) / small_gpt().n_layer;
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
        EXPECT_LE(t.engine().peak_live_params(), std::max(max_live, unit + 64) + root) << "step " << i;
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

// stage3_max_live_parameters counts the root once engine.forward() makes it
// a unit: inside forward, the elements gathered -- the root's and the units'
// (measured from the buffers themselves: those not released) -- never
// exceed the limit, with a root larger than a unit, prefetch asking for
// more; and peak_live_params() reports at least what was there.
struct BigRootNet : torch::nn::Module {
  BigRootNet() {
    at::manual_seed(41);
    for (int i = 0; i < 6; ++i)
      units.push_back(register_module("u" + std::to_string(i), zero::Unit<Lin>(at::randn({8, 8}) * 0.3, false)));
    root = register_parameter("root", at::randn({8, 64}) * 0.1);  // 512 elements: eight units' worth
  }
  at::Tensor loss(const at::Tensor& x, const std::function<void()>& probe) {
    auto h = at::matmul(at::matmul(x, zero::compute(root)), zero::compute(root).t());
    for (auto& u : units) {
      h = u->forward(h);
      probe();  // after each unit, the prefetches behind it already issued
    }
    return h.pow(2).mean();
  }
  std::vector<zero::Unit<Lin>> units;
  at::Tensor root;
};

TEST(Stage3, LiveLimitCountsTheRootOnceItIsAUnit) {
  BigRootNet net;
  const int64_t unit = 64, root = 512, pad = 16 * world().size();
  auto padded = [&](int64_t n) { return (n + pad - 1) / pad * pad; };
  const int64_t limit = padded(root) + 2 * padded(unit);
  Config c = toy_config(3, 4, /*persistence=*/0, /*prefetch=*/1'000'000);
  c.zero.max_live_parameters = limit;
  zero::Engine e(net, c, world().comm(), dp_group());
  // What is gathered now: every flat buffer of the model whose memory is back.
  auto gathered_now = [&] {
    std::set<const void*> seen;
    int64_t n = 0;
    for (const auto& p : net.parameters()) {
      if (!seen.insert(p.storage().unsafeGetStorageImpl()).second) continue;
      n += zero::memory::resident_bytes(p) / p.element_size();
    }
    return n;
  };
  int64_t most = 0;
  for (int step = 0; step < 3; ++step) {
    at::manual_seed(60 + step);
    const at::Tensor x = at::randn({4, 8});
    e.reset_peak_live_params();
    const at::Tensor loss = e.forward([&] { return net.loss(x, [&] { most = std::max(most, gathered_now()); }); });
    e.backward(loss);
    e.step();
    if (step > 0) {  // the schedule (and its prefetch) runs from the second step
      EXPECT_LE(most, limit) << "step " << step << ": gathered in forward beyond stage3_max_live_parameters";
      EXPECT_GE(e.peak_live_params(), most) << "step " << step << ": peak_live_params() under-reports";
    }
    most = 0;
  }
}

// Evaluation once engine.forward() has made a large root a unit: through
// engine.forward() under torch::NoGradGuard, as the docs show, it gives the
// full model's values and leaves training as it was; the moment the root
// became a unit was said once, with why (its size against
// stage3_param_persistence_threshold).
TEST(Stage3, EvaluationThroughEngineForwardOnceTheRootIsAUnit) {
  BigRootNet net, ref;
  zero::Engine e(net, toy_config(3, 4, /*persistence=*/0), world().comm(), dp_group());
  zero::Engine er(ref, toy_config(0, 4 * world().size()), world().comm(), solo_group());
  const auto noop = [] {};
  for (int step = 0; step < 3; ++step) {
    at::manual_seed(80 + step);
    const at::Tensor x = at::randn({4 * world().size(), 8});
    const at::Tensor mine = x.narrow(0, 4 * dp_group()->rank(), 4);
    if (step == 0) testing::internal::CaptureStderr();
    e.backward(e.forward([&] { return net.loss(mine, noop); }));
    if (step == 0) {
      const std::string said = testing::internal::GetCapturedStderr();
      if (dp_group()->rank() == 0) {
        EXPECT_NE(said.find("the root's 512 params"), std::string::npos) << said;
        EXPECT_NE(said.find("stage3_param_persistence_threshold 0"), std::string::npos) << said;
        EXPECT_NE(said.find("torch::NoGradGuard"), std::string::npos) << said;
      }
    }
    e.step();
    er.backward(ref.loss(x, noop));
    er.step();
    at::NoGradGuard eval;
    const double got = e.forward([&] { return net.loss(x, noop); }).item<double>();
    EXPECT_NEAR(got, ref.loss(x, noop).item<double>(), 1e-5) << "step " << step;
  }
  EXPECT_LT(max_abs_diff(e.full_parameters(), er.full_parameters()), 1e-5);
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

  // Below stage 3 the scope builds the model whole: the same program runs
  // at every stage, and trains as without it.
  RunSpec s2;
  s2.stage = 2;
  const zero::Config stage2 = make_config(s2);
  GptTrainer with2(small_gpt(), stage2, corpus(), 7, world().comm(), dp_group(), /*zero_init=*/true);
  GptTrainer without2(small_gpt(), stage2, corpus(), 7, world().comm(), dp_group(), /*zero_init=*/false);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(with2.train_step().loss, without2.train_step().loss);
}

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

// Units nest, as nested FSDP2 fully_shard calls (and DeepSpeed's units,
// every module owning params of its own, which the Python front end maps
// onto zero::Unit): an outer unit holds only what no unit inside it does.
// Here an outer unit with a plain Linear of its own and an inner unit
// (itself holding a Linear), whose forward runs inside the outer's. Parity
// with one process, built with and without zero::Init; the outer unit's
// gathers move its own Linear only (counted by the bytes its gathers
// carry: labelled with its name, they must not hold the inner one's).
struct OuterBlockImpl : torch::nn::Module {
  OuterBlockImpl() {
    own = register_module("own", torch::nn::Linear(16, 16));
    inner = register_module("inner", zero::Unit<torch::nn::Linear>(16, 16));
  }
  at::Tensor forward(const at::Tensor& x) { return inner->forward(at::tanh(own->forward(x))); }
  torch::nn::Linear own{nullptr};
  zero::Unit<torch::nn::Linear> inner{nullptr};
};
TORCH_MODULE(OuterBlock);

struct NestedUnitsNet : torch::nn::Module {
  NestedUnitsNet() {
    at::manual_seed(29);
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("b" + std::to_string(i), zero::Unit<OuterBlock>()));
    head = register_module("head", torch::nn::Linear(16, 4));
  }
  at::Tensor loss(const at::Tensor& x) {
    at::Tensor h = x;
    for (auto& b : blocks) h = b->forward(h);
    return head->forward(h).pow(2).mean();
  }
  std::vector<zero::Unit<OuterBlock>> blocks;
  torch::nn::Linear head{nullptr};
};

TEST(Stage3, NestedUnitsHoldWhatTheirInnerUnitsDoNot) {
  for (bool zero_init : {false, true}) {
    SCOPED_TRACE(zero_init ? "zero::Init" : "built whole");
    std::optional<NestedUnitsNet> m;
    {
      std::optional<zero::Init> init;
      if (zero_init) init.emplace(world().comm(), dp_group(), toy_config(3, 4, 0));
      m.emplace();
      if (zero_init) {
        EXPECT_EQ(init->units_sharded(), 6);  // 3 outer + 3 inner, inner first
      }
    }
    NestedUnitsNet ref;
    zero::Engine e(*m, toy_config(3, 4, 0), world().comm(), dp_group());
    zero::Engine er(ref, toy_config(0, 4 * world().size()), world().comm(), solo_group());
    EXPECT_LT(max_abs_diff(e.full_parameters(), er.full_parameters()), 1e-7);
    auto& counters = world().comm().counters();
    for (int step = 0; step < 3; ++step) {
      const int64_t before = counters.totals()["allgather"].bytes;
      step_with_reference(e, *m, er, ref, 400 + step, 16);
      // Every gather is of one unit's own params, 272 fp32 (a Linear(16,
      // 16)) plus padding, never the 544 of an outer unit holding its inner
      // one's too: 6 units gathered twice a step, and the root's small head
      // refreshed after the step.
      const int64_t gathered = counters.totals()["allgather"].bytes - before;
      EXPECT_LE(gathered, 13 * (272 + 16 * world().size()) * 4) << "step " << step;
    }
    EXPECT_LT(max_abs_diff(e.full_parameters(), er.full_parameters()), 1e-5);
  }
}

// A forward with several outputs (forward_each, the Python front end's
// path; a unit's leave_forward with several outputs): each output that
// requires grad is hooked, and backward starting from any of them
// regathers the root (sharded here: it is a unit inside engine.forward)
// and the units it runs through. The model returns (logits, an auxiliary
// loss through a root layer of its own); backward starts from the second
// output alone, then the first alone, then both -- a root hooked on one
// output only would be read released in one of those steps. Parity with
// one process.
struct TwoOutputNet : torch::nn::Module {
  TwoOutputNet() {
    at::manual_seed(31);
    a = register_module("a", zero::Unit<torch::nn::Linear>(16, 16));
    b = register_module("b", zero::Unit<torch::nn::Linear>(16, 16));
    head = register_module("head", torch::nn::Linear(16, 4));
    aux = register_module("aux", torch::nn::Linear(16, 4));
  }
  std::vector<at::Tensor> outputs(const at::Tensor& x) {
    at::Tensor h = at::tanh(a->forward(x));
    return {head->forward(at::tanh(b->forward(h))), aux->forward(h).pow(2).mean()};
  }
  zero::Unit<torch::nn::Linear> a{nullptr}, b{nullptr};
  torch::nn::Linear head{nullptr}, aux{nullptr};
};

TEST(Stage3, ForwardWithSeveralOutputsRegathersFromAnyOfThem) {
  TwoOutputNet m, ref;
  zero::Engine e(m, toy_config(3, 4, 0), world().comm(), dp_group());
  zero::Engine er(ref, toy_config(0, 4 * world().size()), world().comm(), solo_group());
  for (int step = 0; step < 6; ++step) {
    at::manual_seed(500 + step);
    const at::Tensor x = at::randn({4 * world().size(), 16});
    auto loss_of = [&](const std::vector<at::Tensor>& out) {
      switch (step % 3) {
        case 0: return out[1];
        case 1: return out[0].pow(2).mean();
        default: return out[0].pow(2).mean() + out[1];
      }
    };
    std::vector<at::Tensor> outs;
    e.forward_each([&] { return outs = m.outputs(x.narrow(0, 4 * dp_group()->rank(), 4)); });
    e.backward(loss_of(outs));
    e.step();
    std::vector<at::Tensor> ref_outs;
    er.forward_each([&] { return ref_outs = ref.outputs(x); });
    er.backward(loss_of(ref_outs));
    er.step();
  }
  EXPECT_LT(max_abs_diff(e.full_parameters(), er.full_parameters()), 1e-5);
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

// A block that defers its draws (zero::defer_init): its Linear children's
// resets run once the unit is built -- under zero::Init, into the unit's
// flat buffer -- and it records what the first weight's storage was then.
struct DeferringBlockImpl : torch::nn::Module {
  explicit DeferringBlockImpl(bool register_helper = true) {
    a = register_module("a", torch::nn::Linear(8, 16));
    b = register_module("b", torch::nn::Linear(16, 8));
    zero::defer_init(*this, [this] {
      storage_bytes_at_init = static_cast<int64_t>(a->weight.storage().nbytes());
      a->reset_parameters();
      b->reset_parameters();
    });
    if (!register_helper) {
      // A module this block builds and drops: its deferred init must not outlive it.
      torch::nn::Linear helper(2, 2);
      zero::defer_init(*helper, [raw = helper.get()] { raw->reset_parameters(); });
    }
  }
  at::Tensor forward(const at::Tensor& x) { return b(at::relu(a(x))); }
  torch::nn::Linear a{nullptr}, b{nullptr};
  int64_t storage_bytes_at_init = -1;
};
TORCH_MODULE(DeferringBlock);

struct DeferringNetImpl : torch::nn::Module {
  DeferringNetImpl() {
    h0 = register_module("h0", zero::Unit<DeferringBlock>());
    h1 = register_module("h1", zero::Unit<DeferringBlock>());
  }
  at::Tensor forward(const at::Tensor& x) { return h1->forward(h0->forward(x)); }
  zero::Unit<DeferringBlock> h0{nullptr}, h1{nullptr};
};
TORCH_MODULE(DeferringNet);

// A block built inside another unit and handed to its own unit as the
// argument (its draws deferred before that unit's frame opened), beside a
// layer of the outer unit that defers too.
struct NestingBlockImpl : torch::nn::Module {
  NestingBlockImpl() {
    inner = register_module("inner", zero::Unit<DeferringBlock>(DeferringBlock()));
    c = register_module("c", torch::nn::Linear(8, 8));
    zero::defer_init(*this, [this] { c->reset_parameters(); });  // not the nested unit's: those are drawn
  }
  at::Tensor forward(const at::Tensor& x) { return c(inner->forward(x)); }
  zero::Unit<DeferringBlock> inner{nullptr};
  torch::nn::Linear c{nullptr};
};
TORCH_MODULE(NestingBlock);

// A head whose weight is an embedding's (drawn at once) and whose own init
// only zeroes its bias.
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(const at::Tensor& w) {
    weight = register_parameter("weight", w);
    bias = register_parameter("bias", at::empty({w.size(0)}));
    zero::defer_init(*this, [this] { bias.zero_(); });
  }
  at::Tensor weight, bias;
};
TORCH_MODULE(TiedHead);

struct TiedBlockImpl : torch::nn::Module {
  TiedBlockImpl() {
    emb = register_module("emb", torch::nn::Embedding(16, 8));
    head = register_module("head", TiedHead(emb->weight));
  }
  at::Tensor forward(const at::Tensor& x) { return at::linear(x, head->weight, head->bias); }
  torch::nn::Embedding emb{nullptr};
  TiedHead head{nullptr};
};
TORCH_MODULE(TiedBlock);

struct DeferringCasesImpl : torch::nn::Module {
  DeferringCasesImpl() {
    nested = register_module("nested", zero::Unit<NestingBlock>());
    tied = register_module("tied", zero::Unit<TiedBlock>());
  }
  zero::Unit<NestingBlock> nested{nullptr};
  zero::Unit<TiedBlock> tied{nullptr};
};
TORCH_MODULE(DeferringCases);

// zero::defer_init (issue 36 item 4): under zero::Init a unit's deferred
// draws run into its flat buffer (the weight's storage is then the whole
// unit's, not the weight's own), in the order they would have run at once
// -- so the model equals rank 0's plain build bit for bit, whatever the
// other ranks' seeds -- and outside a scope they run at once. A deferring
// module the unit does not hold is named on every rank; a unit whose
// build throws leaves no deferred init behind.
TEST(ZeroInit, DeferredInitsDrawIntoTheUnitsFlatBufferAsAtOnce) {
  RunSpec s;
  s.stage = 3;
  const auto cfg = make_config(s);
  const int64_t weight_bytes = 16 * 8 * 4;
  at::manual_seed(11 + 1000 * dp_group()->rank());
  DeferringNet built{nullptr};
  {
    zero::Init init(world().comm(), dp_group(), cfg);
    built = DeferringNet();
    EXPECT_EQ(init.units_sharded(), 2);
  }
  EXPECT_GT(built->h0->inner->storage_bytes_at_init, weight_bytes) << "the draws ran before the flatten";
  zero::Engine e(*built, cfg, world().comm(), dp_group());
  at::manual_seed(11);
  DeferringNet plain;
  EXPECT_EQ(plain->h0->inner->storage_bytes_at_init, weight_bytes) << "outside zero::Init the draws run at once";
  std::map<std::string, at::Tensor> want;
  for (const auto& item : plain->named_parameters()) want[item.key()] = item.value().detach().clone();
  EXPECT_EQ(max_abs_diff(e.full_parameters(), want), 0.0);

  std::string error;
  try {
    zero::Init init(world().comm(), dp_group(), cfg);
    zero::Unit<DeferringBlock> unit(/*register_helper=*/false);
  } catch (const std::invalid_argument& err) {
    error = err.what();
  }
  EXPECT_NE(error.find("deferred its init, but"), std::string::npos) << error;

  struct Throwing : torch::nn::Module {
    Throwing() {
      register_parameter("w", at::empty({2}));
      zero::defer_init(*this, [] { ADD_FAILURE() << "a deferred init of a unit whose build threw ran"; });
      throw std::runtime_error("build failed");
    }
    at::Tensor forward(const at::Tensor& x) { return x; }
  };
  {
    zero::Init init(world().comm(), dp_group(), cfg);
    EXPECT_THROW(zero::Unit<torch::nn::ModuleHolder<Throwing>>(), std::runtime_error);
    DeferringNet after;  // its units' frames are their own, not the failed one's
    EXPECT_EQ(init.units_sharded(), 2);
  }

  // A unit built from an argument inside another unit takes the argument's
  // draws; a weight tied into a deferring module keeps its drawn value.
  at::manual_seed(12 + 1000 * dp_group()->rank());
  DeferringCases cases{nullptr};
  {
    zero::Init init(world().comm(), dp_group(), cfg);
    cases = DeferringCases();
    EXPECT_EQ(init.units_sharded(), 3);
  }
  zero::Engine ec(*cases, cfg, world().comm(), dp_group());
  at::manual_seed(12);
  DeferringCases plain_cases;
  const auto got_cases = ec.full_parameters();  // (the tied weight under one of its names)
  std::map<std::string, at::Tensor> want_cases;
  for (const auto& item : plain_cases->named_parameters())
    if (got_cases.count(item.key())) want_cases[item.key()] = item.value().detach().clone();
  EXPECT_EQ(max_abs_diff(got_cases, want_cases), 0.0);
  EXPECT_EQ(got_cases.size(), 8u);
  const at::Tensor tied = got_cases.count("tied.emb.weight") ? got_cases.at("tied.emb.weight")
                                                            : got_cases.at("tied.head.weight");
  EXPECT_GT(tied.abs().sum().item<double>(), 0.0) << "the tied weight lost its draw";
}

// The tied weight belongs to the root (which outlives all its uses): stage 3
// trains with parity to a single process, with or without zero::Init.
// Inside engine.forward() the root (here: the tied head, and the embedding
// unit whose only param it is) is gathered around the forward and released
// after the step, and evaluation through it matches the reference.
TEST(SharedWeights, TiedAcrossAUnitTrainsWithParity) {
  for (int stage : {0, 1, 2, 3})
    for (bool zero_init : {false, true})
      for (bool via_forward : {false, true}) {
      if (zero_init && stage != 3) continue;
      SCOPED_TRACE("stage " + std::to_string(stage) + (zero_init ? " zero::Init" : "") +
                   (via_forward ? " engine.forward" : ""));
      const auto cfg = toy_config(stage, 4, 0);
      std::shared_ptr<TiedUnitNet> m;
      if (zero_init) {
        zero::Init init(world().comm(), dp_group(), cfg);
        m = std::make_shared<TiedUnitNet>();
      } else {
        m = std::make_shared<TiedUnitNet>();
      }
      TiedUnitNet ref;
      zero::Engine e(*m, cfg, world().comm(), dp_group());
      zero::Engine er(ref, toy_config(0, 4 * world().size()), world().comm(), solo_group());
      for (int step = 0; step < 4; ++step) {
        at::manual_seed(1200 + step);
        auto tokens = at::randint(16, {4 * world().size(), 6}, at::kLong);
        auto mine = tokens.narrow(0, 4 * dp_group()->rank(), 4);
        e.backward(via_forward ? e.forward([&] { return m->loss(mine); }) : m->loss(mine));
        e.step();
        er.backward(ref.loss(tokens));
        er.step();
      }
      // The root is sharded at rest exactly when the forward ran inside engine.forward().
      if (stage == 3) {
        EXPECT_EQ(e.persistent_params() == 0, via_forward);
      }
      if (via_forward) {
        at::NoGradGuard no_grad;
        auto tokens = at::randint(16, {8, 6}, at::kLong);
        EXPECT_NEAR(e.forward([&] { return m->loss(tokens); }).item<double>(), ref.loss(tokens).item<double>(), 1e-5);
      }
      EXPECT_LT(max_abs_diff(e.full_parameters(), er.full_parameters()), 1e-5);
    }
}

// With engine.forward() and no persistent units, a rank holds exactly its
// share of the model state between steps: 16 bytes per param / N in fp32
// (params, grads, Adam's two moments), the root's too. Before the first
// engine.forward() the root is still whole.
TEST(RootUnit, ShardedAtRestInsideEngineForward) {
  RunSpec s;
  s.stage = 3;
  s.persistence = 0;
  GptTrainer t(small_gpt(), make_config(s), corpus(), /*seed=*/7, world().comm(), dp_group());
  EXPECT_GT(t.engine().persistent_params(), 0);  // the root, before engine.forward()
  t.train_step();
  t.train_step();
  EXPECT_EQ(t.engine().persistent_params(), 0);
  const double psi = static_cast<double>(t.engine().num_params());
  const double got = static_cast<double>(t.engine().state_bytes().total());
  EXPECT_NEAR(got / (16 * psi / world().size()), 1.0, 0.01) << got << " bytes";
}

TEST(GatheredParametersDeathTest, ARootParamOutsideEngineForwardNamesIt) {
  GTEST_FLAG_SET(death_test_style, "fast");
  TiedUnitNet m;
  zero::Engine e(m, toy_config(3, 4, 0), world().comm(), dp_group());
  auto tokens = at::randint(16, {4, 6}, at::kLong);
  e.backward(e.forward([&] { return m.loss(tokens); }));
  e.step();
  EXPECT_DEATH(std::printf("%f\n", m.head.sum().item<double>()),
               "param 'head' \\(the root unit\\) was read or written while released.*engine.forward");
}

// Read, modify and write back: the modifier rank's values land in every
// rank's params and in the fp32 masters (16-bit params: only the elements
// that changed, so the others keep their fp32 bits), and training goes on
// as in a single process given the same change.
TEST(GatheredParameters, ReadModifyAndWriteBackAtEveryStage) {
  for (const char* dtype : {"fp32", "bf16"})
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE(std::string(dtype) + " stage " + std::to_string(stage));
      auto config = [&](int st, int64_t micro) {
        nlohmann::json j = {{"train_micro_batch_size_per_gpu", micro},
                            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                            {"zero_optimization", {{"stage", st}, {"stage3_param_persistence_threshold", 0}}}};
        if (std::string(dtype) == "bf16") j["bf16"] = {{"enabled", true}};
        return Config::from_json(j);
      };
      UnitNet m, ref;
      zero::Engine e(m, config(stage, 4), world().comm(), dp_group());
      zero::Engine er(ref, config(0, 4 * world().size()), world().comm(), solo_group());
      step_with_reference(e, m, er, ref, 1300, 8);
      const auto before = e.state_dict();
      const int modifier = world().size() - 1;
      {
        auto full = e.gathered_parameters({m.a->inner->w, m.d->inner->s}, modifier);
        // Full values on every rank, equal to the reference's.
        EXPECT_LT((m.a->inner->w.to(at::kFloat) - ref.a->inner->w.to(at::kFloat)).abs().max().item<double>(), 1e-5);
        at::NoGradGuard no_grad;
        m.a->inner->w.fill_(dp_group()->rank() == modifier ? 0.25 : -7.0);  // only the modifier's survives
        m.d->inner->s[0] = dp_group()->rank() == modifier ? 2.0 : -7.0;
        full.finish();
      }
      {
        auto full = er.gathered_parameters({ref.a->inner->w, ref.d->inner->s}, 0);
        at::NoGradGuard no_grad;
        ref.a->inner->w.fill_(0.25);
        ref.d->inner->s[0] = 2.0;
      }
      const auto after = e.state_dict();
      EXPECT_TRUE(after.at("a.w").eq(0.25).all().item<bool>());
      EXPECT_EQ(after.at("d.s")[0].item<float>(), 2.0f);
      EXPECT_TRUE(after.at("d.s").narrow(0, 1, 7).equal(before.at("d.s").narrow(0, 1, 7)))
          << "untouched elements keep their fp32 master bits";
      EXPECT_TRUE(after.at("head").equal(before.at("head")));
      for (int step = 0; step < 3; ++step) step_with_reference(e, m, er, ref, 1301 + step, 8);
      EXPECT_LT(max_abs_diff(e.state_dict(), er.state_dict()), std::string(dtype) == "bf16" ? 2e-2 : 1e-5);
    }
}

// The whole model by name -- tied params under each name, frozen params and
// buffers -- as the plain model registers it; rank0_only leaves the others
// empty; save_weights writes what zero-ckpt consolidate would, and
// load_weights reads it back.
TEST(GatheredParameters, StateDictAndSaveWeightsHoldTheWholeModel) {
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TiedUnitNet m, plain;
    zero::Engine e(m, toy_config(stage, 4, 0), world().comm(), dp_group());
    const auto sd = e.state_dict();
    std::set<std::string> want;
    for (const auto& p : plain.named_parameters()) want.insert(p.key());
    std::set<std::string> got;
    for (const auto& [name, t] : sd) got.insert(name);
    EXPECT_EQ(got, want);
    EXPECT_TRUE(sd.at("head").equal(sd.at("emb.weight")));
    EXPECT_TRUE(sd.at("head").equal(plain.head));
    const auto r0 = e.state_dict(/*rank0_only=*/true);
    EXPECT_EQ(r0.empty(), dp_group()->rank() != 0);
    const std::string path = ckpt_dir("save-weights-" + std::to_string(stage)) + ".safetensors";
    e.save_weights(path);
    TiedUnitNet other;
    {
      at::NoGradGuard no_grad;
      other.head.mul_(2);
    }
    zero::Engine eo(other, toy_config(stage, 4, 0), world().comm(), dp_group());
    eo.load_weights(path);
    EXPECT_EQ(max_abs_diff(eo.state_dict(), sd), 0.0);
    world().comm().barrier(world().group())->wait();
    if (world().rank() == 0) std::filesystem::remove(path);
  }
}

// A guard's destructor may not throw: when its write-back fails (here each
// rank names itself the modifier, so the write-back broadcasts disagree on
// every rank), the error is kept and the engine's next call reports it, once.
TEST(GatheredParameters, AFailingWriteBackIsReportedByTheNextCall) {
  if (world().size() < 2) GTEST_SKIP();
  UnitNet m;
  zero::Engine e(m, toy_config(3, 4, 0), world().comm(), fresh_dp_group());
  {
    auto full = e.gathered_parameters({m.a->inner->w}, dp_group()->rank());
  }  // no exception here
  expect_error([&] { e.step(); }, "the write-back ending gathered_parameters() failed");
  world().comm().barrier(world().group())->wait();
}

// Outside a gathered scope a released param cannot be read: the process
// stops with a message naming it and the way out, instead of a
// segmentation fault or garbage.
TEST(GatheredParametersDeathTest, ReadingAReleasedParamNamesIt) {
  GTEST_FLAG_SET(death_test_style, "fast");
  UnitNet m;
  zero::Engine e(m, toy_config(3, 4, 0), world().comm(), dp_group());
  EXPECT_DEATH(std::printf("%f\n", m.a->inner->w.sum().item<double>()),
               "param 'a.w' \\(unit 'a'\\) was read or written while released.*gathered_parameters");
}

// Two steps in the same order (the second prefetching along the first's
// record), then the last rank swaps two units: every rank fails within
// seconds, naming the units, on shared memory and on Gloo -- not a generic
// timeout after ZERO_COLLECTIVE_TIMEOUT_S.
TEST(UnitOrder, DivergingInALaterStepIsNamedOnEveryRankWithinSeconds) {
  if (world().size() < 2) GTEST_SKIP();
  for (bool fast_path : {true, false}) {
    SCOPED_TRACE(fast_path ? "shared memory" : "gloo");
    const int64_t unit = 64 + 16 * world().size();  // a unit's padded size
    auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                  {"optimizer", {{"type", "AdamW"}}},
                                  {"zero_optimization", {{"stage", 3}, {"stage3_param_persistence_threshold", 0},
                                                         {"stage3_max_reuse_distance", 0},
                                                         {"stage3_prefetch_bucket_size", 2 * unit},
                                                         {"stage3_max_live_parameters", 3 * unit}}},
                                  {"zero_cpp", {{"comm_fast_path", fast_path}}}});
    SameUnitsNet m;
    zero::Engine e(m, cfg, world().comm(), fresh_dp_group());
    const bool odd = dp_group()->rank() == world().size() - 1;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      for (int step = 0; step < 3; ++step) {
        auto x = at::randn({4, 8});
        e.backward(m.loss(x, step == 2 && odd));
        e.step();
      }
      ADD_FAILURE() << "no error";
    } catch (const zero::comm::CollectiveMismatch& err) {
      const std::string msg = err.what();
      EXPECT_NE(msg.find("different orders"), std::string::npos) << msg;
      EXPECT_NE(msg.find("unit 'u"), std::string::npos) << msg;
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    world().comm().set_fast_paths_enabled(true);
  }
}

}  // namespace
