// What zero-train's progress line says about time: the wall time per step
// since the previous line (whoever printed it: the engine's report or
// zero-train's own first and last lines), and the time left at the mean
// pace so far. A pure function of the times it is given, so a test checks
// the arithmetic on given times instead of how long a loaded machine took.
// No torch.
#pragma once

#include <algorithm>
#include <cstdint>

namespace zero::train {

class ProgressTimer {
 public:
  // `start_ms`: when the first step of this run began; `steps_before`: the
  // steps done before it (a resumed run's).
  ProgressTimer(double start_ms, int64_t steps_before)
      : start_ms_(start_ms), last_ms_(start_ms), first_step_(steps_before + 1), last_step_(steps_before) {}

  struct Reading {
    double ms_per_step;  // since the previous line, per step
    double eta_s;        // the steps left at this run's mean step time so far
  };

  // A line at `now_ms` after step `step` of `total_steps`.
  Reading line(double now_ms, int64_t step, int64_t total_steps) {
    const double per_step = (now_ms - last_ms_) / static_cast<double>(std::max<int64_t>(1, step - last_step_));
    const double mean_s = (now_ms - start_ms_) / 1000.0 / static_cast<double>(std::max<int64_t>(1, step - first_step_ + 1));
    last_ms_ = now_ms;
    last_step_ = step;
    return {per_step, mean_s * static_cast<double>(std::max<int64_t>(0, total_steps - step))};
  }

 private:
  double start_ms_, last_ms_;
  int64_t first_step_, last_step_;
};

}  // namespace zero::train
