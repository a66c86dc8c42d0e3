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

// OneCycle's position in its cycle at `it`, 0 at either end and 1 at the
// peak; stair counts hold it flat over that many steps of each half
// (counted from the integer offset, as DeepSpeed does, so a float just
// under a stair does not drop a whole stair).
double one_cycle_scale(const SchedulerConfig& s, int64_t it) {
  const double first = static_cast<double>(s.cycle_first_step_size);
  const double second = static_cast<double>(s.cycle_second_step_size);
  const double total = first + second, ratio = first / total;
  const double batch = static_cast<double>(it + 1);
  const double x = 1.0 + batch / total - std::floor(1.0 + batch / total);
  double scale;
  int64_t stairs;
  if (x <= ratio) {
    scale = x / ratio;
    stairs = s.cycle_first_stair_count;
  } else {
    scale = (x - 1.0) / (ratio - 1.0);
    stairs = s.cycle_second_stair_count;
  }
  if (stairs > 0) {
    const double in_cycle = std::fmod(batch, total);
    const double position = in_cycle <= first ? in_cycle * static_cast<double>(stairs) / first
                                              : (total - in_cycle) * static_cast<double>(stairs) / second;
    scale = std::floor(position) / static_cast<double>(stairs);
  }
  return scale;
}

// Steps into the decay that follows the cycle, or -1 while cycling.
double one_cycle_decay_interval(const SchedulerConfig& s, int64_t it) {
  const int64_t total = s.cycle_first_step_size + s.cycle_second_step_size;
  if (it < total || s.decay_step_size == 0) return -1.0;
  return static_cast<double>(it - total + 1) / static_cast<double>(s.decay_step_size);
}

}  // namespace

std::optional<std::array<double, 2>> scheduled_betas(const SchedulerConfig& s, int64_t it) {
  if (s.type != SchedulerType::OneCycle || !s.cycle_momentum) return std::nullopt;
  constexpr double kBeta2 = 0.99;  // DeepSpeed's OneCycle sets it so
  if (it < 0) return std::array<double, 2>{s.cycle_min_mom, kBeta2};  // its constructor's
  const int64_t total = s.cycle_first_step_size + s.cycle_second_step_size;
  if (it < total)
    return std::array<double, 2>{s.cycle_max_mom - (s.cycle_max_mom - s.cycle_min_mom) * one_cycle_scale(s, it), kBeta2};
  const double interval = one_cycle_decay_interval(s, it);
  const double factor = interval < 0 || s.decay_mom_rate == 0.0 ? 1.0 : 1.0 + s.decay_mom_rate * interval;
  return std::array<double, 2>{s.cycle_max_mom * factor, kBeta2};
}

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
    case SchedulerType::OneCycle: {
      if (it < s.cycle_first_step_size + s.cycle_second_step_size)
        return s.cycle_min_lr + (s.cycle_max_lr - s.cycle_min_lr) * one_cycle_scale(s, it);
      const double interval = one_cycle_decay_interval(s, it);
      return interval < 0 || s.decay_lr_rate == 0.0 ? s.cycle_min_lr
                                                     : s.cycle_min_lr / (1.0 + s.decay_lr_rate * interval);
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
