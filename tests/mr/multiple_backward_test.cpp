// Several backward calls per step: no_sync and the manual boundary, coalesce_grad_reduction,
// a grad that arrives twice in one backward (recompute-style checkpointing), and a plain
// loss.backward() in place of engine.backward().
#include <gtest/gtest.h>

#include "fixtures.h"

namespace {

using namespace zero::test;

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

// Engine::set_batch (DeepSpeed's set_train_batch_size): from 1 to 2
// micro-batches per step after 3 micro-steps, the count kept as DeepSpeed
// keeps it -- the next step ends after one micro-batch (3 + 1 divides by 2),
// the ones after it take two; the global batch follows.
TEST(MultipleBackward, AnotherAccumulationCountMidRun) {
  WithUnused m;
  zero::Engine e(m, toy_config(2, 4), world().comm(), dp_group());
  std::vector<bool> stepped;
  for (int micro = 0; micro < 8; ++micro) {
    if (micro == 3) {
      e.set_batch(4, 2);
      EXPECT_EQ(e.batch().train_batch_size, 4 * 2 * world().size());
    }
    e.backward(m.loss(at::randn({4, 13})));
    stepped.push_back(e.step());
  }
  EXPECT_EQ(stepped, (std::vector<bool>{true, true, true, true, false, true, false, true}));
  EXPECT_EQ(e.global_steps(), 6);
  EXPECT_THROW(e.set_batch(0, 2), std::invalid_argument);
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

// Grads equal the same model's without checkpointing, at every stage, with
// overlap on and off. The first backward learns that `shared` gets two
// arrivals (its group was reduced at the first and is reduced again);
// later steps issue exactly the plain model's collectives.
TEST(RepeatedGrads, RecomputedPiecesSharingAWeightMatchThePlainModel) {
  for (int stage : {0, 1, 2, 3})
    for (bool overlap : {false, true}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + (overlap ? " overlap" : ""));
      auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                    {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                                    {"zero_optimization", {{"stage", stage}, {"overlap_comm", overlap},
                                                           {"reduce_bucket_size", 100},
                                                           {"stage3_param_persistence_threshold", 0}}}});
      std::map<std::string, at::Tensor> params[2];
      zero::comm::OpCounts first_step[2], later_steps[2];
      for (bool checkpoint : {false, true}) {
        RecomputeNet m(checkpoint);
        zero::Engine e(m, cfg, world().comm(), dp_group());
        for (int step = 0; step < 4; ++step) {
          at::manual_seed(1000 + step);
          auto x = at::randn({4 * world().size(), 8}).narrow(0, 4 * dp_group()->rank(), 4);
          const auto before = world().comm().counters().totals();
          e.backward(m.loss(x));
          e.step();
          for (auto& [op, c] : zero::comm::diff(world().comm().counters().totals(), before))
            (step == 0 ? first_step : later_steps)[checkpoint][op] += c;
        }
        params[checkpoint] = e.full_parameters();
      }
      EXPECT_LT(max_abs_diff(params[1], params[0]), 1e-6);
      // With overlap, the first step reduced `shared`'s group at its first
      // arrival and again after the second: the late path ran.
      const char* reduce_op = stage == 0 ? "all_reduce" : "reduce_scatter";
      if (overlap) {
        EXPECT_GT(first_step[1].at(reduce_op).calls, first_step[0].at(reduce_op).calls);
      }
      for (const char* op : {"all_reduce", "reduce_scatter", "allgather"}) {
        const auto calls = [&](int k) {
          return later_steps[k].count(op) ? later_steps[k].at(op).calls : int64_t{0};
        };
        // Stage 3 gathers `shared` again for each recompute: more allgathers, by design.
        if (!(stage == 3 && std::string(op) == "allgather")) {
          EXPECT_EQ(calls(1), calls(0)) << op;
        }
      }
    }
}

// loss.backward() instead of engine.backward(loss): the engine notices the
// first grad, scales grads by 1 / gradient_accumulation_steps on their way
// in (what engine.backward does to the loss) and reduces as usual -- bit for
// bit the same as engine.backward with 2 accumulation steps (a power of two:
// the scaling is exact either way).
TEST(PlainBackward, EqualsEngineBackwardAtEveryStage) {
  for (const char* dtype : {"fp32", "bf16"})
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE(std::string(dtype) + " stage " + std::to_string(stage));
      nlohmann::json j = {{"train_micro_batch_size_per_gpu", 4},
                          {"gradient_accumulation_steps", 2},
                          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                          {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 0}}}};
      if (std::string(dtype) == "bf16") j["bf16"] = {{"enabled", true}};
      std::map<std::string, at::Tensor> params[2];
      for (bool plain : {false, true}) {
        UnitNet m;
        zero::Engine e(m, Config::from_json(j), world().comm(), dp_group());
        for (int micro = 0; micro < 6; ++micro) {
          at::manual_seed(1100 + micro);
          auto loss = m.loss(at::randn({4 * world().size(), 8}).narrow(0, 4 * dp_group()->rank(), 4));
          if (plain) loss.backward();
          else e.backward(loss);
          e.step();
        }
        EXPECT_EQ(e.global_steps(), 3);
        params[plain] = e.full_parameters();
      }
      EXPECT_EQ(max_abs_diff(params[1], params[0]), 0.0);
    }
}

// fp16 needs its loss scaled before backward, which engine.backward or
// engine.scale does: a plain backward from the loss itself is refused on
// every rank, naming the fix, and the engine trains on (at stage 3 too,
// whose unit hooks ran first).
TEST(PlainBackward, Fp16IsRefusedWithTheFix) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                  {"fp16", {{"enabled", true}, {"initial_scale_power", 8}}},
                                  {"optimizer", {{"type", "AdamW"}}},
                                  {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 0}}}});
    UnitNet m;
    zero::Engine e(m, cfg, world().comm(), dp_group());
    auto x = at::randn({4, 8});
    expect_error([&] { m.loss(x).backward(); }, "call engine.backward(loss)");
    for (int step = 0; step < 2; ++step) {
      e.backward(m.loss(x));
      EXPECT_TRUE(e.step());
    }
  }
}

// DeepSpeed's manual backward, engine.scale(loss).backward(), with fp16:
// bit for bit engine.backward(loss), two micro-batches a step.
TEST(PlainBackward, Fp16ThroughScaleEqualsEngineBackward) {
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                  {"gradient_accumulation_steps", 2},
                                  {"fp16", {{"enabled", true}, {"initial_scale_power", 8}}},
                                  {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                                  {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 0}}}});
    std::map<std::string, at::Tensor> params[2];
    for (bool manual : {false, true}) {
      UnitNet m;
      zero::Engine e(m, cfg, world().comm(), dp_group());
      for (int micro = 0; micro < 6; ++micro) {
        at::manual_seed(1300 + micro);
        auto loss = m.loss(at::randn({4 * world().size(), 8}).narrow(0, 4 * dp_group()->rank(), 4));
        if (manual) e.scale(loss).backward();
        else e.backward(loss);
        e.step();
      }
      EXPECT_EQ(e.global_steps(), 3);
      params[manual] = e.full_parameters();
    }
    EXPECT_EQ(max_abs_diff(params[1], params[0]), 0.0);
  }
}

// Recompute-style checkpointing under a plain loss.backward(): the grads of
// nested backwards belong to the enclosing one, which ends when the
// outermost graph task does -- also when the first grad arrives inside a
// nested one (`first_in_nested`: the checkpointed piece is the last op
// before the loss). Same values, and the same collectives by count and bytes
// as engine.backward: one reduction per step, not one per nested backward.
TEST(PlainBackward, NestedBackwardsOfRecomputationEqualEngineBackward) {
  for (bool first_in_nested : {false, true})
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + (first_in_nested ? ", first grad in a nested backward" : ""));
      auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                    {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                                    {"zero_optimization", {{"stage", stage}, {"overlap_comm", true},
                                                           {"reduce_bucket_size", 100},
                                                           {"stage3_param_persistence_threshold", 0}}}});
      std::map<std::string, at::Tensor> params[2];
      zero::comm::OpCounts collectives[2];
      for (bool plain : {false, true}) {
        RecomputeNet m(true);
        zero::Engine e(m, cfg, world().comm(), dp_group());
        const auto before = world().comm().counters().totals();
        for (int step = 0; step < 3; ++step) {
          at::manual_seed(1400 + step);
          auto x = at::randn({4 * world().size(), 8}).narrow(0, 4 * dp_group()->rank(), 4);
          auto loss = first_in_nested ? m.run(m.second, m.run(m.first, m.in->forward(x))).pow(2).mean() : m.loss(x);
          if (plain) loss.backward();
          else e.backward(loss);
          e.step();
        }
        collectives[plain] = zero::comm::diff(world().comm().counters().totals(), before);
        params[plain] = e.full_parameters();
      }
      EXPECT_LT(max_abs_diff(params[1], params[0]), 1e-6);
      for (const auto& [op, counted] : collectives[0]) {
        const auto plain = collectives[1].find(op);
        ASSERT_NE(plain, collectives[1].end()) << op;
        EXPECT_EQ(plain->second.calls, counted.calls) << op;
        EXPECT_EQ(plain->second.bytes, counted.bytes) << op;
      }
      EXPECT_EQ(collectives[1].size(), collectives[0].size());
    }
}

TEST(PlainBackward, RetryAfterAFailedBackward) {
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    UnitNet m, ref;
    zero::Engine e(m, toy_config(stage, 4, 0), world().comm(), dp_group());
    zero::Engine er(ref, toy_config(stage, 4, 0), world().comm(), dp_group());
    for (int step = 0; step < 3; ++step) {
      at::manual_seed(1500 + step);
      auto x = at::randn({4, 8});
      // A loss whose backward first reaches some params (the head), then fails.
      auto loss = [&](UnitNet& net) {
        auto h = FailOnce::apply(net.a->forward(x));
        return at::matmul(net.d->forward(net.c->forward(net.b->forward(h))), zero::compute(net.head)).pow(2).mean();
      };
      FailOnce::armed = step == 1;
      if (step == 1) expect_error([&] { loss(m).backward(); }, "injected failure");
      loss(m).backward();
      e.step();
      loss(ref).backward();
      er.step();
    }
    EXPECT_EQ(max_abs_diff(e.full_parameters(), er.full_parameters()), 0.0);
  }
}

}  // namespace
