// Checkpoints: exact resume, resharding to another world size and stage, consolidated weights,
// mismatches named on every rank, and resuming with another batching or optimizer.
#include <cstring>

#include <gtest/gtest.h>

#include "fixtures.h"
#include "ckpt/checkpoint_dir.h"

namespace {

using namespace zero::test;

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

// Saved by 2 ranks x 2 micro-batches, resumed on 1 rank x 4 (the same global
// batch of 8): the step boundary falls after 4 micro-batches, training goes
// on as a run on 1 rank from the start, the next save works, and one line
// says what changed.
TEST(Resume, AnotherAccumulationCountResumesAtAStepBoundary) {
  if (world().size() != 2) GTEST_SKIP() << "2 ranks resume as 1";
  const auto dir = ckpt_dir("resume-gas");
  auto spec = [](int64_t gas) {
    RunSpec s;
    s.stage = 2;
    s.micro = 2;
    s.gas = gas;
    return s;
  };
  {
    GptTrainer t(small_gpt(), make_config(spec(2)), corpus(), 7, world().comm(), dp_group());
    for (int i = 0; i < 3; ++i) t.train_step();
    t.save(dir);
  }
  GptTrainer ref(small_gpt(), make_config(spec(4)), corpus(), 7, world().comm(), solo_group());
  std::vector<double> want, got;
  for (int i = 0; i < 6; ++i) {
    const double l = ref.train_step().loss;
    if (i >= 3) want.push_back(l);
  }
  GptTrainer resumed(small_gpt(), make_config(spec(4)), corpus(), 7, world().comm(), solo_group());
  testing::internal::CaptureStderr();
  resumed.resume(dir);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("with 1 rank x 4 micro-batches of 2 per step (saved with 2 ranks x 2 micro-batches of 2 "
                      "per step); global batch 8 unchanged"),
            std::string::npos)
      << said;
  for (int i = 0; i < 3; ++i) got.push_back(resumed.train_step().loss);
  EXPECT_TRUE(resumed.engine().is_gradient_accumulation_boundary() == false);
  EXPECT_EQ(resumed.engine().micro_steps(), 6 * 4);
  EXPECT_LT(max_rel_loss_diff(got, want), kLossRelTol);
  EXPECT_LT(max_abs_diff(resumed.engine().full_parameters(), ref.engine().full_parameters()), kParamAbsTol);
  const auto again = ckpt_dir("resume-gas-again-" + std::to_string(world().rank()));
  EXPECT_NO_THROW(resumed.save(again));
  std::filesystem::remove_all(again);
  remove_dir(dir);
}

// SGD's momentum is not Adam's moments: loading one into the other is an
// error that says so (it used to load exp_avg as momentum silently).
TEST(Resume, AnotherOptimizersStateIsRefused) {
  const auto dir = ckpt_dir("other-optimizer");
  {
    WithUnused m;
    zero::Engine e(m, toy_config(1, 4), world().comm(), dp_group());
    e.backward(m.loss(at::randn({4, 13})));
    e.step();
    e.save_checkpoint(dir, "adamw");
  }
  WithUnused m;
  auto sgd = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.01}, {"momentum", 0.9}}}}},
                                {"zero_optimization", {{"stage", 1}}}});
  zero::Engine e(m, sgd, world().comm(), dp_group());
  expect_error([&] { e.load_checkpoint(dir); }, "holds optimizer state of AdamW; this engine's optimizer is SGD");
  e.backward(m.loss(at::randn({4, 13})));  // refused before anything was read: trains on
  EXPECT_TRUE(e.step());
  remove_dir(dir);
}

}  // namespace
