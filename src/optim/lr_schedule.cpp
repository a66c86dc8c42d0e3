#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace zero::optim {

namespace {

// Fraction of warmup done at `it` (< warmup steps), log or linear.
double warmup_gamma(const SchedulerConfig& s, int64_t it) {
  const double n = static_cast<double>(std::max<int64_t>(2, s.warmup_num_steps));
  if (s.warmup_type == WarmupType::Log) return std::log(static_cast<double>(it + 1)) / std::log(n);
  return static_cast<double>(it) / n;
}

}  // namespace

double scheduled_lr(const SchedulerConfig& s, double base_lr, int64_t it) {
  const int64_t n = std::max<int64_t>(2, s.warmup_num_steps);
  switch (s.type) {
    case SchedulerType::None:
      return base_lr;
    case SchedulerType::WarmupLR:
    case SchedulerType::WarmupDecayLR: {
      if (it < 0) return s.warmup_min_lr;
      double gamma;
      if (it < n) gamma = warmup_gamma(s, it);
      else if (s.type == SchedulerType::WarmupLR) gamma = 1.0;
      else
        gamma = std::max(0.0, static_cast<double>(s.total_num_steps - it) /
                                  std::max(1.0, static_cast<double>(s.total_num_steps - n)));
      return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
    }
    case SchedulerType::LRRangeTest: {
      const double interval = static_cast<double>(it + 1) / static_cast<double>(s.lr_range_test_step_size);
      return s.lr_range_test_min_lr *
             (1.0 + s.lr_range_test_step_rate * (s.lr_range_test_staircase ? std::floor(interval) : interval));
    }
    case SchedulerType::WarmupCosineLR: {
      if (it < 0) return 0.0;
      double ratio;
      if (it < n) {
        ratio = s.warmup_min_ratio + warmup_gamma(s, it) * (1.0 - s.warmup_min_ratio);
      } else {
        const double real_last = static_cast<double>(it - n + 1);
        const double real_total = std::max<double>(1.0, static_cast<double>(s.total_num_steps - n));
        const double progress = std::min(1.0, real_last / real_total);
        ratio = std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * (1.0 + std::cos(M_PI * progress)) / 2.0);
      }
      return base_lr * ratio;
    }
  }
  return base_lr;
}

}  // namespace zero::optim
