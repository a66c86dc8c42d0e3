// Frozen params and buffers (BatchNorm): synced from rank 0, re-broadcast at each step
// boundary, and carried by checkpoints, consolidated weights and load_weights.
#include <cstring>

#include <gtest/gtest.h>

#include "fixtures.h"
#include "ckpt/checkpoint_dir.h"

namespace {

using namespace zero::test;

// Ranks seeded differently train rank 0's model: frozen params and buffers
// are broadcast at construction, as trainable ones always were. (BatchNorm
// in eval mode, so the single-process reference sees the same statistics.)
TEST(FrozenAndBuffers, StartFromRankZeroAndTrainWithParity) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    FrozenBnNet m(rank_seed()), ref(100);
    m.bn->eval();
    ref.bn->eval();
    zero::Engine e(m, toy_config(stage, 4), world().comm(), dp_group());
    zero::Engine er(ref, toy_config(0, 4 * world().size()), world().comm(), solo_group());
    const auto frozen_before = module_state(ref);
    for (int step = 0; step < 5; ++step) step_with_reference(e, m, er, ref, 600 + step, 8);
    const auto got = module_state(m), want = module_state(ref);
    EXPECT_TRUE(got.at("backbone.weight").equal(frozen_before.at("backbone.weight")));
    EXPECT_TRUE(got.at("bn.running_mean").equal(want.at("bn.running_mean")));
    EXPECT_LT(max_abs_diff(got, want), 1e-5);
  }
}

// In training mode each rank's BatchNorm updates its statistics from its own
// rows; at each step boundary they become rank 0's (DDP's broadcast_buffers).
// The oracle replays rank 0's rows (or, with the switch off, this rank's)
// through a BatchNorm of its own.
TEST(FrozenAndBuffers, BuffersFollowRankZeroAtEachStep) {
  for (bool broadcast : {true, false}) {
    SCOPED_TRACE(broadcast ? "broadcast_buffers" : "broadcast_buffers off");
    auto j = nlohmann::json{{"train_micro_batch_size_per_gpu", 4},
                            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                            {"zero_optimization", {{"stage", 2}}},
                            {"zero_cpp", {{"broadcast_buffers", broadcast}}}};
    FrozenBnNet m(100);
    zero::Engine e(m, Config::from_json(j), world().comm(), dp_group());
    torch::nn::BatchNorm1d shadow(16);
    {
      at::NoGradGuard no_grad;
      shadow->running_mean.copy_(m.bn->running_mean);
    }
    const int r = dp_group()->rank();
    for (int step = 0; step < 3; ++step) {
      at::manual_seed(700 + step);
      auto x = at::randn({4 * world().size(), 8});
      e.backward(m.loss(x.narrow(0, 4 * r, 4)));
      e.step();
      at::NoGradGuard no_grad;
      shadow->forward(m.features(x.narrow(0, broadcast ? 0 : 4 * r, 4)));
      EXPECT_TRUE(m.bn->running_mean.equal(shadow->running_mean)) << "step " << step;
      EXPECT_TRUE(m.bn->running_var.equal(shadow->running_var)) << "step " << step;
      EXPECT_EQ(m.bn->num_batches_tracked.item<int64_t>(), step + 1);
      if (world().size() > 1) {
        EXPECT_EQ(same_on_all_ranks(m.bn->running_mean), broadcast);
      }
    }
  }
}

// A resumed run keeps its BatchNorm statistics and frozen params (saved by
// rank 0, restored on every rank) and goes on bit for bit; the consolidated
// file holds every tensor of the plain model under its name, and
// load_weights puts them all back.
TEST(FrozenAndBuffers, CheckpointsConsolidationAndLoadWeightsCarryThem) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const auto dir = ckpt_dir("frozen-bn-" + std::to_string(stage));
    auto run = [&](FrozenBnNet& m, zero::Engine& e, int from, int to) {
      std::vector<double> losses;
      for (int step = from; step < to; ++step) {
        at::manual_seed(800 + step);
        auto x = at::randn({4 * world().size(), 8}).narrow(0, 4 * dp_group()->rank(), 4);
        auto loss = m.loss(x);
        losses.push_back(loss.item<double>());
        e.backward(loss);
        e.step();
      }
      return losses;
    };
    FrozenBnNet full(100);
    zero::Engine ef(full, toy_config(stage, 4), world().comm(), dp_group());
    const auto want = run(full, ef, 0, 6);
    {
      FrozenBnNet first(100);
      zero::Engine e1(first, toy_config(stage, 4), world().comm(), dp_group());
      run(first, e1, 0, 3);
      e1.save_checkpoint(dir, "step3");
    }
    FrozenBnNet resumed(999);  // other weights, other statistics
    zero::Engine er(resumed, toy_config(stage, 4), world().comm(), dp_group());
    er.load_checkpoint(dir);
    EXPECT_EQ(run(resumed, er, 3, 6), std::vector<double>(want.begin() + 3, want.end()));
    const auto state = module_state(resumed);
    EXPECT_EQ(max_abs_diff(state, module_state(full)), 0.0);

    const std::string out = dir + "-weights.safetensors";
    er.save_checkpoint(dir, "final");
    if (world().rank() == 0) zero::ckpt::consolidate(dir, "", out, "fp32");
    world().comm().barrier(world().group())->wait();
    {
      zero::ckpt::SafetensorsFile f(out);
      EXPECT_EQ(f.entries().size(), state.size());
      for (const auto& [name, t] : state) {
        ASSERT_TRUE(f.has(name)) << name;
        EXPECT_EQ(f.entry(name).shape, t.sizes().vec()) << name;
        EXPECT_EQ(std::memcmp(f.data(name), t.contiguous().data_ptr(), t.nbytes()), 0) << name;
      }
      EXPECT_EQ(f.entry("bn.num_batches_tracked").dtype, "I64");
    }
    FrozenBnNet fresh(555);
    zero::Engine ew(fresh, toy_config(stage, 4), world().comm(), dp_group());
    ew.load_weights(out);
    EXPECT_EQ(max_abs_diff(module_state(fresh), state), 0.0);
    world().comm().barrier(world().group())->wait();
    if (world().rank() == 0) std::filesystem::remove(out);
    remove_dir(dir);
  }
}

TEST(FrozenAndBuffers, ZeroInitSyncsThemFromRankZero) {
  const auto cfg = toy_config(3, 4, 0);
  at::manual_seed(rank_seed());
  std::shared_ptr<InitNet> m;
  {
    zero::Init init(world().comm(), dp_group(), cfg);
    m = std::make_shared<InitNet>();
  }
  auto& inner = m->block->inner;
  EXPECT_TRUE(same_on_all_ranks(inner->frozen->weight));
  EXPECT_TRUE(same_on_all_ranks(inner->bn->running_var));
  zero::Engine e(*m, cfg, world().comm(), dp_group());
  e.backward(m->loss(at::randn({4, 8})));
  e.step();
  EXPECT_TRUE(same_on_all_ranks(inner->bn->running_mean));
}

}  // namespace
