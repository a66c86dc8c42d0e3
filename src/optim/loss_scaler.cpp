#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace zero::optim {

LossScaler::LossScaler(const FP16Config& c)
    : dynamic_(c.enabled && c.loss_scale == 0.0),
      scale_(!c.enabled ? 1.0 : c.loss_scale > 0 ? c.loss_scale : std::ldexp(1.0, static_cast<int>(c.initial_scale_power))),
      min_scale_(c.min_loss_scale),
      window_(c.loss_scale_window),
      hysteresis_(c.hysteresis),
      consecutive_hysteresis_(c.consecutive_hysteresis),
      cur_hysteresis_(c.hysteresis) {}

void LossScaler::update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    if (hysteresis_ == 1 || cur_hysteresis_ == 1) {
      if (scale_ == min_scale_)
        throw std::runtime_error("fp16 loss scale is already at min_loss_scale (" + std::to_string(min_scale_) +
                                 ") and the grads still overflow; stopping (as DeepSpeed does)");
      scale_ = std::max(scale_ / 2.0, min_scale_);
    } else {
      --cur_hysteresis_;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    if (consecutive_hysteresis_) cur_hysteresis_ = hysteresis_;
    const int64_t stable = cur_iter_ - last_overflow_iter_ - 1;
    if (stable > 0 && stable % window_ == 0) {
      if (!consecutive_hysteresis_) cur_hysteresis_ = hysteresis_;
      scale_ *= 2.0;
    }
  }
  ++cur_iter_;
}

}  // namespace zero::optim
