// Muon over the flat shards (docs/design.md, "Muon over flat shards"):
// DeepSpeed's MuonWithAuxAdam rule -- Muon for 2-D (and wider) weights whose
// name holds neither "embed" nor "lm_head", AdamW for every other param --
// run over FlatOptimizer's groups. Newton-Schulz needs each whole matrix,
// whose elements may lie on several ranks' shards: each matrix has an owner
// rank; the momentum stays with the shard holders (it is element-wise),
// the Nesterov inputs go to the owners in one all-gather, the owners
// orthogonalise, and the updates come back in a second all-gather, applied
// by the holders with the weight decay and the 16-bit write in one pass.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "partition/flat_group.h"
#include "zero/comm.h"
#include "zero/config.h"
#include "zero/stage_policy.h"

namespace zero {

// DeepSpeed's set_optimizer_flags: whether a param of this name and rank
// (number of dims) is a Muon param.
bool muon_uses(const std::string& name, int64_t ndim);

// The orthogonalised update of one matrix (or a batch of them, over the
// leading dims; a 4-D conv weight as [out, in * kh * kw]): 5 steps of the
// quintic Newton-Schulz iteration in fp32, scaled by sqrt(max(1, rows /
// cols)) of the param's last two dims, as DeepSpeed's muon_update.
at::Tensor muon_orthogonalize(const at::Tensor& nesterov, at::IntArrayRef param_shape);

struct MuonStep {
  const OptimizerConfig& optimizer;
  const StagePolicy& policy;
  comm::Comm& comm;
  const comm::Group& dp;
  double lr;         // the schedule's lr for the Muon params (config lr 1)
  float grad_scale;  // loss unscale times the clip coefficient
  int64_t step;      // 1-based: Adam's bias correction
  // A param's (lr scale, weight decay): its param group's.
  std::function<std::pair<double, double>(const at::Tensor& param)> hyper;
};

// One optimizer step of every group. Offloading a device model's optimizer
// or params to the host is refused (a ConfigError-like invalid_argument).
void muon_update(std::vector<partition::FlatGroup>& groups, const std::vector<at::Tensor>& grads, const MuonStep& s);

}  // namespace zero
