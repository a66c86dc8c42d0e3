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
//
// Schedule. The first step records the order units run in (forward and
// backward). From the second step on, gathers run ahead of use along the
// recorded order: at most stage3_prefetch_bucket_size elements in flight and
// stage3_max_live_parameters gathered; a unit whose next use is within
// stage3_max_reuse_distance elements stays gathered after its forward.
//
// Every gather is labelled with its unit (comm::Signature), so ranks whose
// unit orders diverge -- in any step, prefetching or not -- fail at the
// first gather that differs, on every rank, with an error naming both
// units, instead of pairing one unit's shards with another's or hanging.
//
// A released group's buffer is inaccessible (partition::release_params):
// code that reads a unit's param outside its forward and backward stops
// with a message naming the param; engine.gathered_parameters() pins groups
// gathered for such code.
#pragma once

#include <string>
#include <vector>

#include "partition/flat_group.h"
#include "zero/comm.h"
#include "zero/unit.h"

namespace zero {

struct Stage3Options {
  int64_t prefetch_bucket_size = 50'000'000;
  int64_t max_live_parameters = 1'000'000'000;
  int64_t max_reuse_distance = 1'000'000'000;
};

// Restores a group's full param buffer and fills it from every rank's
// param_shard (blocking).
void gather_params(const partition::FlatGroup& g, comm::Comm& comm, const comm::Group& dp, const std::string& label);

class Stage3Runtime : public detail::UnitRuntime {
 public:
  // Non-persistent groups must already be released (partition::release_params).
  Stage3Runtime(std::vector<partition::FlatGroup>& groups, std::vector<bool> persistent,
                std::vector<size_t> unit_to_group, std::vector<std::string> unit_names, comm::Comm& comm,
                const comm::Group& dp, Stage3Options opts);


  void before_forward(size_t unit) override;
  at::Tensor after_forward(size_t unit, const at::Tensor& out) override;
  void forward_failed(size_t unit) override;
  void before_backward(size_t unit);

  // The reducer saw all of the group's grads: its params can go.
  void on_grads_complete(size_t group);
  // End of backward: release what is still gathered (unused params, prefetch
  // ahead of an order change) and close the first step's recording. With
  // keep_awaited, units whose grads have not all arrived stay gathered (the
  // end of a plain loss.backward() seen from a nested backward).
  void after_backward(bool keep_awaited = false);
  bool in_backward() const { return in_backward_; }
  // After an optimizer step: persistent groups take their updated shards;
  // every other group is released (its gathered copy is stale now).
  void after_step();
  // After an exception in forward/backward: release what is gathered and
  // forget this step's position (no collectives are issued).
  void reset_after_error();

  void gather(size_t group);   // synchronous; waits for a prefetch in flight
  void release(size_t group);  // no-op for persistent and pinned groups
  // Gathered and kept until unpinned (engine.gathered_parameters()); pins nest.
  void pin(size_t group);
  void unpin(size_t group);
  bool any_pinned() const;
  bool gathered(size_t group) const { return gathered_[group]; }
  bool persistent(size_t group) const { return persistent_[group]; }

  // The most elements gathered at once during forward passes since the last
  // reset (what stage3_max_live_parameters bounds).
  int64_t peak_live_in_forward() const { return peak_live_forward_; }
  void reset_peak() { peak_live_forward_ = live_; }

 private:
  enum class Phase { Forward, Backward };
  struct Use {
    size_t unit;
    Phase phase;
  };

  void start_gather(size_t group);  // reallocate the storage and launch the allgather
  // Releases units kept for reuse (gathered, not in use) until `need` more
  // elements fit under stage3_max_live_parameters, or none is left.
  void evict_for(int64_t need);
  void use(size_t unit, Phase phase);
  // Runs `gathers`; a CollectiveMismatch from them (ranks gathering other
  // units) is rethrown naming this rank's unit and position.
  template <typename F>
  void naming_divergence(size_t unit, Phase phase, F&& gathers);
  void name_released_contents(size_t group);
  void prefetch_after(size_t position);
  bool reused_soon(size_t unit, size_t position) const;
  size_t group_of(size_t unit) const { return unit_to_group_[unit]; }
  int64_t numel_of_unit(size_t unit) const { return groups_[group_of(unit)].layout.padded_numel; }

  std::vector<partition::FlatGroup>& groups_;
  std::vector<bool> persistent_;
  std::vector<size_t> unit_to_group_;
  std::vector<std::string> unit_names_;
  comm::Comm& comm_;
  const comm::Group& dp_;
  Stage3Options opts_;
  std::vector<bool> gathered_;           // storage allocated (gather done or in flight)
  std::vector<comm::WorkHandle> inflight_;
  std::vector<int> in_forward_;           // forward calls of the group running now
  std::vector<bool> awaiting_grads_;      // gathered for backward, grads not all in yet
  std::vector<bool> prefetched_;          // gathered ahead of use, not used yet
  std::vector<int> pinned_;               // gathered_parameters() scopes holding it
  std::vector<std::string> labels_;       // "params of unit 'h3'": every gather's label
  int64_t live_ = 0;       // elements of non-persistent groups gathered or in flight
  int64_t peak_live_forward_ = 0;
  bool in_backward_ = false;

  bool recording_ = true;  // the first step: learn the order, check it across ranks
  std::vector<Use> trace_; // the recorded uses, forward then backward
  size_t position_ = 0;    // uses seen this step
  bool on_trace_ = true;   // this step follows the recorded order so far
};

}  // namespace zero
