// What each ZeRO stage does, as named switches built once from the config,
// so the code asks what it needs to know instead of comparing stage
// numbers (as FSDP2 names reshard_after_forward / reduce_grads and Megatron
// use_distributed_optimizer). The stage table (docs/design.md):
//
//   switch                  0  1  2  3
//   shard_optimizer_state   .  x  x  x   fp32 master + optimizer state cover this rank's shard only;
//                                        grads are reduce-scattered, updated params all-gathered
//   shard_grads             .  .  x  x   full grads live only during a backward (each backward
//                                        reduces); the reduced fp32 shard accumulates
//   shard_params            .  .  .  x   params sharded at rest, gathered per unit around their use
//
// The stage number itself stays for messages and the checkpoint manifest.
#pragma once

#include <vector>

#include <ATen/ATen.h>

#include "partition/flat_group.h"
#include "zero/comm.h"

namespace zero {

class Stage3Runtime;

struct StagePolicy {
  int stage = 0;
  bool shard_optimizer_state = false;
  bool shard_grads = false;
  bool shard_params = false;

  static StagePolicy for_stage(int64_t stage);

  // A full grad buffer cannot outlive its backward when grads are sharded.
  bool reduce_every_backward() const { return shard_grads; }
  // Full grads stay resident (stages 0/1)...
  bool keeps_full_grads() const { return !shard_grads; }
  // ... and a sharded optimizer's reductions scatter into a shard beside
  // them, in place in fp32 (stage 1).
  bool reduces_into_resident_shard() const { return shard_optimizer_state && !shard_grads; }

  // Where the optimizer writes group g's updated values, in the params'
  // dtype: the flat params (stage 0), this rank's slot of them (1/2), the
  // shard kept at rest (3). Same size as g.master, which it aliases in fp32
  // wherever the params live in the master's memory.
  at::Tensor update_destination(const partition::FlatGroup& g, int rank) const;

  // After an update (optimizer step, checkpoint load, a gathered scope's
  // write-back): every rank's params show the new values -- all-gathered
  // from the updated slots (stages 1/2), or at stage 3 re-gathered where
  // they stay resident and released elsewhere (gathered on next use).
  void publish_updated_params(std::vector<partition::FlatGroup>& groups, comm::Comm& comm,
                              const comm::Group& dp, Stage3Runtime* stage3) const;
};

}  // namespace zero
