// Stage 3: params sharded at rest and gathered per unit around its use.
//
// Each unit is one flat group. At rest a rank holds only its shard
// (param_shard); the full buffer (param_flat) is one storage that is freed
// (resized to 0 bytes) on release and reallocated on gather, never
// replaced, so the params -- views of it -- and the tensors autograd saved
// in forward see the regathered data in backward. The allgather writes the
// storage through its own tensor, so no param's version counter moves.
//
// Gathers happen before a unit's forward and again before its backward (a
// hook on the unit's output); the release follows its forward, and its
// backward once all its grads are accumulated (the grad reducer reports
// that). Persistent groups -- the root unit (params outside every unit, or
// shared between units) and units under stage3_param_persistence_threshold
// -- stay gathered and are refreshed from their shards after each step.
#pragma once

#include <vector>

#include "partition/flat_group.h"
#include "zero/comm.h"
#include "zero/unit.h"

namespace zero {

class Stage3Runtime : public detail::UnitRuntime {
 public:
  // Non-persistent groups must already be released (release_storage).
  Stage3Runtime(std::vector<partition::FlatGroup>& groups, std::vector<bool> persistent,
                std::vector<size_t> unit_to_group, comm::Comm& comm, const comm::Group& dp);

  // Frees a group's full param buffer (its storage keeps its identity).
  static void release_storage(partition::FlatGroup& g);

  void before_forward(size_t unit) override;
  at::Tensor after_forward(size_t unit, const at::Tensor& out) override;
  void before_backward(size_t unit);

  // The reducer saw all of the group's grads: its params can go.
  void on_grads_complete(size_t group);
  // End of backward: release what unused params kept gathered.
  void after_backward();
  // After an optimizer step: persistent groups take their updated shards.
  void after_step();

  void gather(size_t group);   // synchronous; no-op when gathered
  void release(size_t group);  // no-op for persistent groups
  bool gathered(size_t group) const { return gathered_[group]; }
  bool persistent(size_t group) const { return persistent_[group]; }

  int64_t live_elements() const { return live_; }
  int64_t peak_live_elements() const { return peak_live_; }  // since construction (or reset)
  void reset_peak() { peak_live_ = live_; }

 private:
  void materialize(size_t group);  // reallocate the storage and allgather into it

  std::vector<partition::FlatGroup>& groups_;
  std::vector<bool> persistent_;
  std::vector<size_t> unit_to_group_;
  comm::Comm& comm_;
  const comm::Group& dp_;
  std::vector<bool> gathered_;
  int64_t live_ = 0;       // elements of non-persistent groups now gathered
  int64_t peak_live_ = 0;
};

}  // namespace zero
