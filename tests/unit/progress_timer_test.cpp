// zero-train's progress line, from given times (train/progress_timer.h):
// the step time is the wall time since the previous line over the steps
// since it, and the ETA the steps left at the run's mean pace.
#include <gtest/gtest.h>

#include "train/progress_timer.h"

using zero::train::ProgressTimer;

// No steps_per_print: lines at the first and the last of 12 steps. The
// first step took 100 ms, the 11 after it 10 ms each: the last line says
// 10 ms/step (it was the 11 steps' total, divided by one, before a fix).
TEST(ProgressTimer, TheLastLineIsPerStepSinceTheFirst) {
  ProgressTimer t(0.0, 0);
  const auto first = t.line(100.0, 1, 12);
  EXPECT_DOUBLE_EQ(first.ms_per_step, 100.0);
  EXPECT_DOUBLE_EQ(first.eta_s, 0.1 * 11);  // the mean so far (100 ms) times the 11 steps left
  const auto last = t.line(210.0, 12, 12);
  EXPECT_DOUBLE_EQ(last.ms_per_step, 10.0);
  EXPECT_DOUBLE_EQ(last.eta_s, 0.0);
}

// Every 5 steps (the engine's reports), after resuming at step 20.
TEST(ProgressTimer, ReportsEveryFewStepsAfterAResume) {
  ProgressTimer t(1000.0, 20);
  const auto a = t.line(1250.0, 25, 40);  // 5 steps in 250 ms
  EXPECT_DOUBLE_EQ(a.ms_per_step, 50.0);
  EXPECT_DOUBLE_EQ(a.eta_s, 0.05 * 15);
  const auto b = t.line(1600.0, 30, 40);  // 5 more in 350 ms
  EXPECT_DOUBLE_EQ(b.ms_per_step, 70.0);
  EXPECT_DOUBLE_EQ(b.eta_s, 0.06 * 10);  // 600 ms over 10 steps, 10 left
}
