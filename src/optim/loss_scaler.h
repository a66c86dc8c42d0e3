// fp16 loss scaling with DeepSpeed's dynamic algorithm (hysteresis,
// consecutive_hysteresis, scale window), or a static scale.
#pragma once

#include <cstdint>

#include "zero/config.h"

namespace zero::optim {

class LossScaler {
 public:
  // fp16 disabled -> a constant scale of 1.
  explicit LossScaler(const FP16Config& c);

  double scale() const { return scale_; }
  // Called once per optimizer step with whether any grad overflowed.
  // Throws std::runtime_error when an overflow happens at the minimum scale
  // (DeepSpeed stops the run there too).
  void update(bool overflow);

  bool dynamic() const { return dynamic_; }

  // What changes while training (for checkpoints); the rest comes from the config.
  struct State {
    double scale;
    int64_t cur_hysteresis, cur_iter, last_overflow_iter;
  };
  State state() const { return {scale_, cur_hysteresis_, cur_iter_, last_overflow_iter_}; }
  void restore(const State& s) {
    scale_ = s.scale;
    cur_hysteresis_ = s.cur_hysteresis;
    cur_iter_ = s.cur_iter;
    last_overflow_iter_ = s.last_overflow_iter;
  }

 private:
  bool dynamic_;
  double scale_;
  double min_scale_;
  int64_t window_;
  int64_t hysteresis_;
  bool consecutive_hysteresis_;
  int64_t cur_hysteresis_;
  int64_t cur_iter_ = 0;
  int64_t last_overflow_iter_ = -1;
};

}  // namespace zero::optim
