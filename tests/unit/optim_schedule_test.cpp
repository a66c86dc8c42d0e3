// The loss scaler replays DeepSpeed's traces; LR schedules match DeepSpeed's
// formulas at chosen points; flat-group layout arithmetic.
#include <cmath>

#include <gtest/gtest.h>

#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "partition/layout.h"

namespace {

using zero::optim::LossScaler;

LossScaler scaler(int power, int window, int hyst, bool consecutive = false, double min_scale = 1) {
  zero::FP16Config c;
  c.enabled = true;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hyst;
  c.consecutive_hysteresis = consecutive;
  c.min_loss_scale = min_scale;
  return LossScaler(c);
}

// Traces from DeepSpeed's DynamicLossScaler.update_scale ("O" = overflow).
TEST(LossScaler, DeepSpeedTraceA_HysteresisThenRegrowth) {
  auto s = scaler(4, 4, 2);  // 16
  const std::vector<std::pair<bool, double>> trace{{true, 16}, {true, 8}, {true, 4}, {false, 4}, {false, 4},
                                                   {false, 4}, {false, 4}, {false, 8}, {false, 8}, {false, 8},
                                                   {false, 8}, {false, 16}};
  for (size_t i = 0; i < trace.size(); ++i) {
    s.update(trace[i].first);
    EXPECT_EQ(s.scale(), trace[i].second) << "iteration " << i;
  }
}

TEST(LossScaler, DeepSpeedTraceB_GrowsEveryWindow) {
  auto s = scaler(4, 3, 2);
  const double want[] = {16, 16, 16, 32, 32, 32, 64};
  for (double w : want) {
    s.update(false);
    EXPECT_EQ(s.scale(), w);
  }
}

TEST(LossScaler, DeepSpeedTraceCD_ConsecutiveHysteresis) {
  auto c = scaler(4, 1000, 2, false);
  auto d = scaler(4, 1000, 2, true);
  const bool pattern[] = {true, false, true, false, true};
  const double want_c[] = {16, 16, 8, 8, 4}, want_d[] = {16, 16, 16, 16, 16};
  for (int i = 0; i < 5; ++i) {
    c.update(pattern[i]);
    d.update(pattern[i]);
    EXPECT_EQ(c.scale(), want_c[i]) << i;
    EXPECT_EQ(d.scale(), want_d[i]) << i;
  }
}

TEST(LossScaler, DeepSpeedTraceE_OverflowAtMinimumStops) {
  auto s = scaler(1, 1000, 1);
  s.update(true);
  EXPECT_EQ(s.scale(), 1);
  EXPECT_THROW(s.update(true), std::runtime_error);
}

TEST(LossScaler, DeepSpeedTraceF) {
  auto s = scaler(4, 2, 1);
  const bool pattern[] = {true, false, false, true, false, false, false, false};
  const double want[] = {8, 8, 8, 4, 4, 4, 8, 8};
  for (int i = 0; i < 8; ++i) {
    s.update(pattern[i]);
    EXPECT_EQ(s.scale(), want[i]) << i;
  }
}

TEST(LossScaler, StaticAndDisabled) {
  zero::FP16Config c;
  EXPECT_EQ(LossScaler(c).scale(), 1.0);
  c.enabled = true;
  c.loss_scale = 128;
  LossScaler s(c);
  s.update(true);
  EXPECT_EQ(s.scale(), 128);
  EXPECT_FALSE(s.dynamic());
}

TEST(LrSchedule, DeepSpeedFormulas) {
  using zero::optim::scheduled_lr;
  zero::SchedulerConfig w;
  w.type = zero::SchedulerType::WarmupLR;
  w.warmup_min_lr = 0.0;
  w.warmup_max_lr = 0.01;
  w.warmup_num_steps = 100;
  EXPECT_EQ(scheduled_lr(w, 1, -1), 0.0);  // before the first scheduler step
  EXPECT_DOUBLE_EQ(scheduled_lr(w, 1, 9), 0.01 * std::log(10.0) / std::log(100.0));
  EXPECT_DOUBLE_EQ(scheduled_lr(w, 1, 100), 0.01);
  w.warmup_type = zero::WarmupType::Linear;
  EXPECT_DOUBLE_EQ(scheduled_lr(w, 1, 25), 0.0025);

  zero::SchedulerConfig d = w;
  d.type = zero::SchedulerType::WarmupDecayLR;
  d.total_num_steps = 1100;
  EXPECT_DOUBLE_EQ(scheduled_lr(d, 1, 600), 0.01 * 500.0 / 1000.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(d, 1, 2000), 0.0);

  zero::SchedulerConfig c;
  c.type = zero::SchedulerType::WarmupCosineLR;
  c.total_num_steps = 110;
  c.warmup_num_steps = 10;
  c.warmup_type = zero::WarmupType::Linear;
  c.cos_min_ratio = 0.1;
  EXPECT_EQ(scheduled_lr(c, 2.0, -1), 0.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 2.0, 5), 2.0 * 0.5);
  // Halfway through the decay: ratio = min + (1 - min) * (1 + cos(pi/2)) / 2.
  // cos(M_PI / 2) is 6e-17 (M_PI is rounded), under an ulp of 0.55, and the
  // few roundings after it stay within DOUBLE_EQ's 4 ulps on any libm.
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 2.0, 59), 2.0 * (0.1 + 0.9 * 0.5));
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 2.0, 500), 2.0 * 0.1);

  zero::SchedulerConfig none;
  EXPECT_EQ(scheduled_lr(none, 0.3, 7), 0.3);
}

TEST(Layout, PadsToAlignedEqualShardsAndFragmentsCoverEveryElement) {
  using namespace zero::partition;
  for (int dp : {1, 2, 3, 4, 8})
    for (int64_t align : {1, 16}) {
      const std::vector<int64_t> numels{5, 1, 300, 17, 64};
      auto g = make_group_layout(numels, {4, 3, 2, 1, 0}, dp, align);
      EXPECT_EQ(g.numel, 387);
      EXPECT_EQ(g.padded_numel % (dp * align), 0);
      EXPECT_GE(g.padded_numel, g.numel);
      EXPECT_LT(g.padded_numel - g.numel, dp * align);
      EXPECT_EQ(g.shard_numel * dp, g.padded_numel);
      // Every element of every param is owned by exactly one rank.
      std::vector<std::vector<int>> owned(5);
      for (size_t i = 0; i < numels.size(); ++i) owned[4 - i].assign(numels[i], 0);
      for (int r = 0; r < dp; ++r)
        for (const auto& f : g.fragments(r)) {
          EXPECT_LE(f.shard_offset + f.numel, g.shard_numel);
          for (int64_t k = 0; k < f.numel; ++k) owned[f.param_index][f.param_offset + k]++;
          // The fragment's flat position is consistent with the param's slot.
          const auto& slot = *std::find_if(g.params.begin(), g.params.end(),
                                           [&](const ParamSlot& s) { return s.param_index == f.param_index; });
          EXPECT_EQ(slot.offset + f.param_offset, r * g.shard_numel + f.shard_offset);
        }
      for (const auto& p : owned)
        for (int c : p) EXPECT_EQ(c, 1);
    }
}

TEST(Layout, BucketsCloseAtTheSizeAndBigParamsStandAlone) {
  using zero::partition::bucket_params;
  auto b = bucket_params({10, 10, 10, 100, 5}, {4, 3, 2, 1, 0}, 20);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0], (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(b[1], (std::vector<int64_t>{2, 1}));  // closes once it reaches 20 (here 110)
  EXPECT_EQ(b[2], (std::vector<int64_t>{0}));
  EXPECT_EQ(bucket_params({1000}, {0}, 1).size(), 1u);
}

}  // namespace
