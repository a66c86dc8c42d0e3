// Bad input gets a clear error on every rank: configs the engine cannot use, models that differ
// between ranks; and what the engine reports (a skipped fp16 step).
#include <chrono>
#include <limits>

#include <gtest/gtest.h>

#include "fixtures.h"
#include "zero/init.h"

namespace {

using namespace zero::test;

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
  // A model on a device zero-cpp does not train on, or on two at once, is
  // named before anything is allocated (the meta device stands in here for
  // any non-CPU device a CPU-only machine can make).
  const Config ok = Config::from_json({{"train_batch_size", 8}, {"optimizer", opt}});
  const auto on_meta = at::TensorOptions().device(at::kMeta);
  expect_msg([&] {
    torch::nn::Module meta;
    meta.register_parameter("weight", at::zeros({4, 4}, on_meta));
    zero::Engine(meta, ok, world().comm(), dp_group());
  }, "the model is on meta; zero-cpp trains on CPU or CUDA");
  expect_msg([&] {
    torch::nn::Linear split(4, 4);
    split->register_buffer("scale", at::ones({4}, on_meta));
    zero::Engine(*split, ok, world().comm(), dp_group());
  }, "the model spans devices: 'weight' is on cpu and 'scale' on meta");
}

TEST(RankMismatch, DifferentModelsAreNamedAtConstruction) {
  if (world().size() < 2) GTEST_SKIP();
  const bool odd = dp_group()->rank() == world().size() - 1;
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    RankDependentNet wider(odd ? 9 : 8, false);
    expect_error([&] { zero::Engine e(wider, toy_config(stage, 4), world().comm(), dp_group()); },
                 "hold different models (every rank must build the same one): entry #1 of the model's params and "
                 "buffers is param 'fc.weight' [8, 8] Float (trainable) on rank 0 but param 'fc.weight' [9, 8] Float");
    RankDependentNet frozen(8, odd);
    expect_error([&] { zero::Engine e(frozen, toy_config(stage, 4), world().comm(), dp_group()); },
                 "param 'head.weight' [1, 8] Float (trainable) on rank 0 but param 'head.weight' [1, 8] Float (frozen)");
  }
  // The group is intact: training goes on.
  WithUnused m;
  zero::Engine e(m, toy_config(2, 4), world().comm(), dp_group());
  e.backward(m.loss(at::randn({4, 13})));
  EXPECT_TRUE(e.step());
}

// The same under zero::Init, where each unit is flattened and broadcast the
// moment it is built: the unit that differs is named, param and shapes, as
// without it -- not a broadcast of two sizes.
struct WideImpl : torch::nn::Module {
  explicit WideImpl(int64_t width) { fc = register_module("fc", torch::nn::Linear(8, width)); }
  at::Tensor forward(const at::Tensor& x) { return fc(x); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Wide);

TEST(RankMismatch, DifferentUnitsUnderZeroInitAreNamed) {
  if (world().size() < 2) GTEST_SKIP();
  const bool odd = dp_group()->rank() == world().size() - 1;
  struct Net : torch::nn::Module {
    explicit Net(int64_t width) {
      a = register_module("a", zero::Unit<Wide>(8));
      b = register_module("b", zero::Unit<Wide>(width));
    }
    zero::Unit<Wide> a{nullptr}, b{nullptr};
  };
  expect_error(
      [&] {
        zero::Init init(world().comm(), dp_group(), toy_config(3, 4));
        Net net(odd ? 9 : 8);
      },
      "zero::Init: the ranks of " + dp_group()->describe() + " build different units (unit #2 built under "
      "zero::Init; every rank must build the same model): entry #1 of the model's params and buffers is param "
      "'fc.weight' [8, 8] Float (trainable) on rank 0 but param 'fc.weight' [9, 8] Float");
  world().comm().barrier(*dp_group())->wait();  // the group is intact
}

TEST(Reporting, SkippedFp16StepSaysSoWithTheNewScale) {
  auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                {"fp16", {{"enabled", true}, {"initial_scale_power", 8}, {"hysteresis", 1}}},
                                {"optimizer", {{"type", "AdamW"}}},
                                {"zero_optimization", {{"stage", 2}}}});
  WithUnused m;
  zero::Engine e(m, cfg, world().comm(), dp_group());
  e.backward(m.loss(at::randn({4, 13})) * std::numeric_limits<float>::infinity());
  testing::internal::CaptureStderr();
  EXPECT_FALSE(e.step());
  const std::string said = testing::internal::GetCapturedStderr();
  if (dp_group()->rank() == 0)
    EXPECT_NE(said.find("OVERFLOW! Skipping step 1. Attempted loss scale: 256, reducing to 128"), std::string::npos)
        << said;
  else
    EXPECT_EQ(said, "") << "one line, from rank 0";
}

// Two engines on one group, the older destroyed after the newer began, at a
// point that differs between ranks (a Python engine is freed whenever its
// garbage collector gets to it): the older leaves the newer's step tag
// alone, so the newer's collectives keep agreeing. Before, the older reset
// the group's tag on the rank that destroyed it late, and the next
// collective failed with "the ranks disagree" (found by the Python front
// end's parity test).
TEST(RankMismatch, AnEngineDestroyedLateLeavesTheNextEnginesStepTag) {
  RunSpec s;
  s.stage = 3;
  s.persistence = 0;
  auto g = fresh_dp_group();
  auto older = std::make_unique<GptTrainer>(small_gpt(), make_config(s), corpus(), 7, world().comm(), g);
  older->train_step();
  GptTrainer newer(small_gpt(), make_config(s), corpus(), 7, world().comm(), g);
  auto& engine = newer.engine();
  const int64_t micro = engine.batch().micro_batch_per_gpu, seq = small_gpt().seq_len;
  for (int it = 0; it < 3; ++it) {
    at::manual_seed(800 + it);
    const at::Tensor ids = at::randint(0, 256, {micro, seq + 1}, at::kLong);
    const at::Tensor loss =
        engine.forward([&] { return newer.model()->loss(ids.narrow(1, 0, seq), ids.narrow(1, 1, seq)); });
    // Rank 0 frees the older engine inside the newer's step (between its
    // forward and its backward's reductions); the other ranks a step later.
    if (it == static_cast<int>(g->rank() != 0)) older.reset();
    EXPECT_NO_THROW(engine.backward(loss)) << "step " << it;
    EXPECT_NO_THROW(engine.step()) << "step " << it;
  }
}

// A rank whose loop skips a batch -- it catches a bad sample's exception in
// its forward and goes on to the next -- is out of step with its peers from
// then on. Its next collective carries another step tag (comm Group::
// set_step), so the first shifted collective fails on every rank within a
// second, naming both steps, instead of pairing one step's grads with the
// next step's (silently wrong) until the last step waits out the collective
// timeout.
TEST(RankMismatch, ARankThatSkipsABatchFailsEveryRankNamingBothSteps) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    RunSpec s;
    s.stage = stage;
    s.persistence = 0;
    auto g = fresh_dp_group();  // its lanes stay failed after the disagreement
    GptTrainer t(small_gpt(), make_config(s), corpus(), 7, world().comm(), g);
    auto& engine = t.engine();
    auto& model = t.model();
    const bool skipper = g->rank() == 0;
    const int64_t micro = engine.batch().micro_batch_per_gpu, seq = small_gpt().seq_len;
    const auto t0 = std::chrono::steady_clock::now();
    std::string error;
    try {
      for (int it = 0; it < 5; ++it) {
        at::manual_seed(700 + it);
        const at::Tensor ids = at::randint(0, 256, {micro, seq + 1}, at::kLong);
        at::Tensor loss;
        try {
          loss = engine.forward([&] {
            if (skipper && it == 2) throw std::runtime_error("a bad sample");
            return model->loss(ids.narrow(1, 0, seq), ids.narrow(1, 1, seq));
          });
        } catch (const std::runtime_error& e) {
          if (std::string(e.what()) != "a bad sample") throw;
          continue;  // skip the batch, as user code does
        }
        engine.backward(loss);
        engine.step();
      }
    } catch (const zero::comm::CommError& e) {
      error = e.what();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(error.empty()) << "the shifted steps trained on without an error";
    EXPECT_NE(error.find("disagree"), std::string::npos) << error;
    EXPECT_NE(error.find("step 2.1"), std::string::npos) << error;  // the peers' third step
    EXPECT_NE(error.find("step 2.2"), std::string::npos) << error;  // the skipper's next batch in it
    EXPECT_LT(seconds, 10.0);
  }
  world().comm().barrier(world().group())->wait();
}

}  // namespace
