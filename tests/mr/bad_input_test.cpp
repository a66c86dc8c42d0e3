// Bad input gets a clear error on every rank: configs the engine cannot use, models that differ
// between ranks; and what the engine reports (a skipped fp16 step).
#include <limits>

#include <gtest/gtest.h>

#include "fixtures.h"

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

}  // namespace
