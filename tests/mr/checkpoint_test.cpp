// Checkpoints: exact resume, resharding to another world size and stage, consolidated weights,
// mismatches named on every rank, and resuming with another batching, optimizer or compute dtype.
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

// ---- another compute dtype ------------------------------------------------------

// bf16 params, computing in `compute` (zero_cpp.compute_dtype; "auto" picks
// per machine, so a checkpoint may be saved under one and loaded under the other).
Config bf16_config(const char* compute, int stage) {
  return Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                            {"bf16", {{"enabled", true}}},
                            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                            {"zero_optimization", {{"stage", stage}}},
                            {"zero_cpp", {{"compute_dtype", compute}}}});
}

// Steps [from, to) of FrozenBnNet in training mode (BatchNorm's statistics
// move), each rank on its rows of one global batch per step; the losses.
std::vector<double> train_bn(FrozenBnNet& m, zero::Engine& e, int from, int to) {
  std::vector<double> losses;
  for (int step = from; step < to; ++step) {
    at::manual_seed(900 + step);
    auto x = at::randn({4 * world().size(), 8}).narrow(0, 4 * dp_group()->rank(), 4);
    auto loss = m.loss(x.to(e.compute_dtype()));  // the module computes in that dtype
    losses.push_back(loss.item<double>());
    e.backward(loss);
    e.step();
  }
  return losses;
}

// Frozen params and floating-point buffers follow the compute dtype in the
// module (bf16 compute: bf16). Saved under bf16 compute and loaded under
// fp32, and the reverse: the checkpoint holds them in fp32 (widened, so
// nothing is lost), the load converts them to the loading model's dtype,
// trainable params come back exactly, and training goes on from the saved
// state: its losses are those of the saving run going on within 4% (the two
// compute in different dtypes; they differed by up to 2%), and three steps
// later its params are within 1e-2 of that run's (they were 2.4e-4 apart),
// while a model that had not loaded the checkpoint is more than 0.1 off
// (0.4).
TEST(Checkpoint, LoadsUnderAnotherComputeDtype) {
  const std::vector<std::tuple<const char*, const char*, int>> cases = {{"bf16", "fp32", 3}, {"fp32", "bf16", 1}};
  for (const auto& [from, to, stage] : cases) {
    SCOPED_TRACE(std::string("saved computing in ") + from + ", loaded in " + to + ", stage " + std::to_string(stage));
    const auto dir = ckpt_dir(std::string("compute-") + from);
    FrozenBnNet first(100);
    zero::Engine e1(first, bf16_config(from, stage), world().comm(), dp_group());
    ASSERT_EQ(e1.compute_dtype(), std::string(from) == "bf16" ? at::kBFloat16 : at::kFloat);
    train_bn(first, e1, 0, 3);
    e1.save_checkpoint(dir, "step3");
    const auto saved = module_state(first);
    const auto saved_params = e1.full_parameters();
    if (world().rank() == 0) {
      zero::ckpt::CheckpointReader r(dir, "");
      for (const char* n : {"backbone.weight", "backbone.bias", "bn.running_mean", "bn.running_var"})
        EXPECT_EQ(r.find_replicated(n)->dtype, "F32") << n;
      EXPECT_EQ(r.find_replicated("bn.num_batches_tracked")->dtype, "I64");
    }
    const auto going_on = train_bn(first, e1, 3, 6);

    FrozenBnNet resumed(999);  // other weights, other statistics
    zero::Engine e2(resumed, bf16_config(to, stage), world().comm(), dp_group());
    ASSERT_EQ(e2.compute_dtype(), std::string(to) == "bf16" ? at::kBFloat16 : at::kFloat);
    FrozenBnNet fresh(999);
    zero::Engine e3(fresh, bf16_config(to, stage), world().comm(), dp_group());
    const auto not_loaded = train_bn(fresh, e3, 3, 6);
    try {
      e2.load_checkpoint(dir);
    } catch (const std::exception& err) {
      ADD_FAILURE() << err.what();
      remove_dir(dir);
      continue;
    }
    EXPECT_EQ(e2.global_steps(), 3);
    EXPECT_EQ(max_abs_diff(e2.full_parameters(), saved_params), 0.0);
    const auto got = module_state(resumed);
    for (const char* n : {"backbone.weight", "backbone.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}) {
      const auto& t = got.at(n);
      EXPECT_EQ(t.scalar_type(), std::string(n) == "bn.num_batches_tracked" ? at::kLong : e2.compute_dtype()) << n;
      EXPECT_TRUE(t.equal(saved.at(n).to(t.scalar_type()))) << n;
    }
    const auto losses = train_bn(resumed, e2, 3, 6);
    for (size_t i = 0; i < losses.size(); ++i)
      EXPECT_NEAR(losses[i], going_on[i], 0.04 * std::fabs(going_on[i])) << "step " << i + 4;
    const double d_resumed = max_abs_diff(e2.full_parameters(), e1.full_parameters());
    const double d_fresh = max_abs_diff(e3.full_parameters(), e1.full_parameters());
    EXPECT_LT(d_resumed, 1e-2);
    EXPECT_GT(d_fresh, 0.1);
    remove_dir(dir);
  }
}

}  // namespace
