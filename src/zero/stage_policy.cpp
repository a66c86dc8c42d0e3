#include "zero/stage_policy.h"

#include <stdexcept>
#include <string>

#include "zero/stage3.h"

namespace zero {

StagePolicy StagePolicy::for_stage(int64_t stage) {
  if (stage < 0 || stage > 3) throw std::invalid_argument("ZeRO stage " + std::to_string(stage) + " (0-3 expected)");
  StagePolicy p;
  p.stage = static_cast<int>(stage);
  p.shard_optimizer_state = stage >= 1;
  p.shard_grads = stage >= 2;
  p.shard_params = stage >= 3;
  return p;
}

at::Tensor StagePolicy::update_destination(const partition::FlatGroup& g, int rank) const {
  if (shard_params || g.param_shard.defined()) return g.param_shard;  // stage 3, or widened at 1-2
  return shard_optimizer_state ? g.own_slot(g.param_flat, rank) : g.param_flat;
}

void StagePolicy::publish_updated_params(std::vector<partition::FlatGroup>& groups, comm::Comm& comm,
                                         const comm::Group& dp, Stage3Runtime* stage3) const {
  if (shard_params) {
    if (!stage3) throw std::logic_error("publish_updated_params: stage 3 without its runtime");
    stage3->after_step();
    return;
  }
  if (!shard_optimizer_state) return;  // every rank updated all of it
  std::vector<comm::WorkHandle> works;
  for (auto& g : groups)
    works.push_back(comm.all_gather(dp, g.param_flat, update_destination(g, dp.rank()), "updated params"));
  for (auto& w : works) w->wait();
}

}  // namespace zero
