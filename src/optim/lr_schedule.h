// DeepSpeed's LR schedules (WarmupLR, WarmupDecayLR, WarmupCosineLR,
// LRRangeTest, OneCycle) as a pure function of the scheduler iteration.
//
// DeepSpeed's timing is kept: the scheduler starts at iteration -1 (its
// constructor writes lr(-1)), and steps after each optimizer step that was
// not skipped, so optimizer step k uses lr(k - 2) (step 1 uses lr(-1)).
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "zero/config.h"

namespace zero::optim {

// `base_lr` is the optimizer's lr (WarmupCosineLR scales it; no scheduler returns it).
double scheduled_lr(const SchedulerConfig& s, double base_lr, int64_t iteration);

// OneCycle with cycle_momentum: Adam's (beta1, beta2) at `iteration`;
// nullopt for every other schedule (the optimizer's own betas hold).
std::optional<std::array<double, 2>> scheduled_betas(const SchedulerConfig& s, int64_t iteration);

}  // namespace zero::optim
