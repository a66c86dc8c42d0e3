// The loss scaler replays DeepSpeed's traces; LR schedules match DeepSpeed's
// formulas at chosen points.
#include <array>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"

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

  // LRRangeTest: min_lr at construction (iteration -1), then growing by
  // step_rate per step_size iterations, continuously or in stairs.
  zero::SchedulerConfig r;
  r.type = zero::SchedulerType::LRRangeTest;
  r.lr_range_test_min_lr = 1e-4;
  r.lr_range_test_step_size = 10;
  r.lr_range_test_step_rate = 2.0;
  EXPECT_DOUBLE_EQ(scheduled_lr(r, 1, -1), 1e-4);
  EXPECT_DOUBLE_EQ(scheduled_lr(r, 1, 4), 1e-4 * (1 + 2.0 * 0.5));
  r.lr_range_test_staircase = true;
  EXPECT_DOUBLE_EQ(scheduled_lr(r, 1, 4), 1e-4);
  EXPECT_DOUBLE_EQ(scheduled_lr(r, 1, 9), 1e-4 * 3);
}

// OneCycle, values worked by hand from DeepSpeed's definition: the lr
// climbs from min to max over the first step size (scale = x / ratio with
// x the position in the cycle after iteration + 1 batches) and back over
// the second, then decays as min / (1 + rate * steps / decay_step_size);
// beta1 moves against it, starts at cycle_min_mom (the constructor's) and
// beta2 is 0.99 throughout.
TEST(LrSchedule, OneCycleAsDeepSpeedDefinesIt) {
  using zero::optim::scheduled_betas;
  using zero::optim::scheduled_lr;
  zero::SchedulerConfig c;
  c.type = zero::SchedulerType::OneCycle;
  c.cycle_min_lr = 0.001;
  c.cycle_max_lr = 0.01;
  c.cycle_first_step_size = 4;
  c.cycle_second_step_size = 4;
  c.decay_step_size = 2;
  c.decay_lr_rate = 0.5;
  c.decay_mom_rate = 0.1;
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 9.0, -1), 0.001);
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 9.0, 0), 0.001 + 0.009 * 0.25);  // 1 batch of 8: x = 1/8, scale 1/4
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 9.0, 3), 0.01);                  // the peak
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 9.0, 5), 0.001 + 0.009 * 0.5);   // x = 6/8 on the way down
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 9.0, 7), 0.001);                 // the cycle's end
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 9.0, 8), 0.001 / 1.25);          // decay: 1 step of 2 at rate 0.5
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 9.0, 11), 0.001 / 2.0);

  using Betas = std::array<double, 2>;
  EXPECT_EQ(scheduled_betas(c, -1), (Betas{0.8, 0.99}));
  EXPECT_DOUBLE_EQ((*scheduled_betas(c, 0))[0], 0.9 - 0.1 * 0.25);
  EXPECT_DOUBLE_EQ((*scheduled_betas(c, 3))[0], 0.8);
  EXPECT_DOUBLE_EQ((*scheduled_betas(c, 8))[0], 0.9 * 1.05);
  EXPECT_EQ((*scheduled_betas(c, 8))[1], 0.99);
  c.cycle_momentum = false;
  EXPECT_FALSE(scheduled_betas(c, 3).has_value());
  c.type = zero::SchedulerType::WarmupLR;
  EXPECT_FALSE(scheduled_betas(c, 3).has_value());

  // Stairs: 2 per half of 4 steps, the lr held over each.
  zero::SchedulerConfig st = c;
  st.type = zero::SchedulerType::OneCycle;
  st.cycle_first_stair_count = st.cycle_second_stair_count = 2;
  EXPECT_DOUBLE_EQ(scheduled_lr(st, 9.0, 0), 0.001);
  EXPECT_DOUBLE_EQ(scheduled_lr(st, 9.0, 1), 0.001 + 0.009 * 0.5);
  EXPECT_DOUBLE_EQ(scheduled_lr(st, 9.0, 2), 0.001 + 0.009 * 0.5);
  EXPECT_DOUBLE_EQ(scheduled_lr(st, 9.0, 3), 0.01);
  EXPECT_DOUBLE_EQ(scheduled_lr(st, 9.0, 4), 0.001 + 0.009 * 0.5);  // 3 steps left of 4: floor(1.5) / 2

  // No decay unless both its size and its rate are set.
  c.type = zero::SchedulerType::OneCycle;
  c.decay_step_size = 0;
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 9.0, 20), 0.001);
}

}  // namespace
