// Stage 3: params sharded at rest and gathered per unit around its use.
//
// Each unit is one flat group. At rest a rank holds only its shard
// (param_shard); the full buffer (param_flat) keeps its address but its
// memory is released (partition::release_params) and restored before the
// next gather, so the params -- views of it -- and the tensors autograd saved
// in forward see the regathered data in backward, and no param's version
// counter moves. Each group is Released, Gathering (its allgather in
// flight) or Gathered. In training, a released group's host pages go to the
// next gather of a group of their size rather than back to the OS
// (release(group, to_next_gather), below).
//
// Gathers happen before a unit's forward and again before its backward (a
// hook on the unit's output); the release follows its forward, and its
// backward once all its grads are accumulated (the grad reducer reports
// that). Persistent groups -- units under stage3_param_persistence_threshold,
// and the root unit (params outside every unit, or shared between units)
// while the model's forward runs outside engine.forward() -- stay gathered
// and are refreshed from their shards after each step. Inside
// engine.forward() the root is one more unit, its forward being the whole
// model's (as FSDP2's fully_shard on the root module): gathered around it
// and again for backward, so between steps a rank holds only shards.
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
// A released group's buffer is inaccessible: code that reads a unit's param
// outside its forward and backward stops with a message naming the param;
// engine.gathered_parameters() pins groups gathered for such code.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "partition/flat_group.h"
#include "zero/comm.h"
#include "zero/unit_runtime.h"

namespace zero {

namespace offload {
class ParamSwap;
}

struct Stage3Options {
  int64_t prefetch_bucket_size = 50'000'000;
  int64_t max_live_parameters = 1'000'000'000;
  int64_t max_reuse_distance = 1'000'000'000;
  // zero_cpp.stage3_gather_fp32_master: gather the fp32 master and downcast
  // after (seed 000's unfused baseline) where the unit computes in 16 bits.
  bool gather_fp32_master = false;
  // stage3_param_persistence_threshold: the root unit is sharded only above
  // it, which messages about the root say.
  int64_t param_persistence_threshold = 100'000;
  // ZeRO++ hpZ: the group of this host's data-parallel ranks and this
  // rank's index in it; null when off. Each unit's forward gather leaves a
  // secondary shard (1/L of the unit) on every rank, and that backward's
  // gather takes the unit from the host's secondary shards alone.
  const comm::Group* secondary_group = nullptr;
  int secondary_rank = 0;
  // offload_param.device "nvme": the shards are read in for each gather
  // (read ahead along the recorded order) and their pages released after it.
  offload::ParamSwap* param_swap = nullptr;
};

// Stage3Options' hpZ fields for zero_hpz_partition_size `size` on the
// data-parallel group `dp`; a ConfigError when the size is not its ranks
// per host (one host holding all of them needs none: left off).
void configure_hpz(Stage3Options& o, int64_t size, const comm::Group& dp);

// Restores a group's full param buffer and fills it from every rank's
// param_shard (blocking; read in from `param_swap`'s file first if it is there).
void gather_params(const partition::FlatGroup& g, comm::Comm& comm, const comm::Group& dp, const std::string& label,
                   offload::ParamSwap* param_swap = nullptr);
// The group's shard where its full buffer is (a copy when offload_param
// keeps it in host memory), for a gather.
at::Tensor shard_for_gather(const partition::FlatGroup& g);

// The recorded order of a step's unit uses, and where gathers may run
// ahead of it (pure bookkeeping: no tensors, no collectives).
class UnitSchedule {
 public:
  enum class Phase { Forward, Backward };
  struct Use {
    size_t unit;
    Phase phase;
  };

  // A unit is used: recorded in the first step, compared with the record after.
  void use(size_t unit, Phase phase);
  // The end of a step's backward: the first step's record is complete.
  void end_step();
  void reset_position() { position_ = 0, on_trace_ = true; }
  bool recording() const { return recording_; }
  // Later steps: whether this step has followed the record so far.
  bool following() const { return !recording_ && on_trace_; }
  size_t position() const { return position_; }
  const std::vector<Use>& trace() const { return trace_; }
  // Elements gathered from `position` on before `unit` is used again
  // (`numel_of(unit)` per use), or -1 if it is not used again this step.
  template <typename NumelOf>
  int64_t reuse_distance(size_t unit, size_t position, NumelOf&& numel_of) const;

 private:
  bool recording_ = true;  // the first step: learn the order
  std::vector<Use> trace_;  // the recorded uses, forward then backward
  size_t position_ = 0;     // uses seen this step
  bool on_trace_ = true;    // this step follows the recorded order so far
};

class Stage3Runtime : public detail::UnitRuntime {
 public:
  // Non-persistent groups must already be released (partition::release_params).
  // A unit mapped to a group index past the end has no params (never gathered).
  Stage3Runtime(std::vector<partition::FlatGroup>& groups, std::vector<bool> persistent,
                std::vector<size_t> unit_to_group, std::vector<std::string> unit_names, size_t root_group,
                comm::Comm& comm, const comm::Group& dp, Stage3Options opts);
  ~Stage3Runtime() override;
  Stage3Runtime(const Stage3Runtime&) = delete;
  Stage3Runtime& operator=(const Stage3Runtime&) = delete;

  void before_forward(size_t unit) override;
  at::Tensor after_forward(size_t unit, const at::Tensor& out) override;
  void after_forward(size_t unit, const std::vector<at::Tensor>& outs) override;
  void forward_failed(size_t unit) override;
  void before_backward(size_t unit);

  // The root's group as a unit used by engine.forward(), when it may be
  // sharded (kNoGroup: it always stays gathered). The first
  // begin_root_forward() shards it from then on (and starts the recorded
  // order afresh, so the root's uses are part of it).
  void set_shardable_root(size_t group);
  // Whether engine.forward() has made the root a unit (it is sharded
  // between forwards from then on), and its size.
  bool root_sharded() const { return root_sharded_; }
  int64_t root_numel() const;
  void begin_root_forward();
  at::Tensor end_root_forward(const at::Tensor& out);
  void end_root_forward(const std::vector<at::Tensor>& outs);
  void root_forward_failed();

  // The reducer saw all of the group's grads: its params can go.
  void on_grads_complete(size_t group);
  // End of backward: release what is still gathered (unused params, prefetch
  // ahead of an order change) and close the first step's recording. With
  // keep_awaited, units whose grads have not all arrived stay gathered (the
  // end of a plain loss.backward() seen from a nested backward).
  void after_backward(bool keep_awaited = false);
  bool in_backward() const { return in_backward_; }
  // After an optimizer step: persistent (and pinned) groups take their
  // updated shards; every other group is released (its copy is stale now).
  void after_step();
  // After an exception in forward/backward: release what is gathered and
  // forget this step's position (no collectives are issued).
  void reset_after_error();

  void gather(size_t group);   // synchronous; waits for a prefetch in flight
  // No-op for persistent and pinned groups. to_next_gather: in training,
  // where a gather follows at once -- the unit after next in forward (where
  // the recorded order has another forward next), the one before in
  // backward -- its pages go to that gather (held_; memory/page_buffer.h
  // hold_pages: no fresh page to clear for it). Where none follows -- a
  // forward whose backward never comes -- they wait for the next gather,
  // step, or the engine's end.
  void release(size_t group, bool to_next_gather = false);
  // Gathered and kept until unpinned (engine.gathered_parameters()); pins nest.
  void pin(size_t group);
  void unpin(size_t group);
  bool gathered(size_t group) const { return state_[group].residency != Residency::Released; }
  bool persistent(size_t group) const { return state_[group].persistent; }

  // The most elements gathered at once during forward passes since the last
  // reset (what stage3_max_live_parameters bounds).
  int64_t peak_live_in_forward() const { return peak_live_forward_; }
  void reset_peak() { peak_live_forward_ = live_; }

 private:
  using Phase = UnitSchedule::Phase;
  enum class Residency { Released, Gathering, Gathered };
  struct GroupState {
    Residency residency = Residency::Released;
    bool persistent = false;       // the root, or a unit under the persistence threshold
    comm::WorkHandle gather;       // the allgather in flight while Gathering
    int in_forward = 0;            // forward calls of the group running now
    bool awaiting_grads = false;   // gathered for backward, grads not all in yet
    bool prefetched = false;       // gathered ahead of use, not used yet
    int pinned = 0;                // gathered_parameters() scopes holding it
    std::string label;             // "params of unit 'h3'": every gather's label
    bool from_secondary = false;   // the gather in flight reads the hpZ secondary shards
    at::Tensor secondary;          // hpZ: this rank's 1/L of the unit, taken at its forward gather
    bool secondary_valid = false;  // until the end of this backward (or an error, a step, a write)
    bool shard_acquired = false;   // offload_param nvme: the gather in flight holds the shard in memory
  };

  void start_gather(size_t group);  // restore the buffer and launch the allgather
  void drop_held();  // the held pages go back to the OS
  // The allgather into the group's (restored) buffer of this rank's shard:
  // `uploaded` (offload_param nvme's copy on the device) or the group's own;
  // or of the fp32 master, cast after (gathers_fp32_master: seed 000's "before").
  comm::WorkHandle launch_gather(size_t group, std::optional<at::Tensor> uploaded);
  bool gathers_fp32_master(size_t group) const;
  void keep_secondary(size_t group);             // hpZ: this rank's part of a freshly gathered unit
  void drop_secondaries();
  // Releases units kept for reuse (gathered, not in use) until `need` more
  // elements fit under stage3_max_live_parameters, or none is left.
  void evict_for(int64_t need);
  void use(size_t unit, Phase phase);
  void prefetch_after(size_t position);
  // offload_param nvme: starts reading the shards of the units used next
  // (within offload_param.buffer_count).
  void read_ahead(size_t position);
  bool reused_soon(size_t unit, size_t position) const;
  // Runs `gathers`; a CollectiveMismatch from them (ranks gathering other
  // units) is rethrown naming this rank's unit and position.
  template <typename F>
  void naming_divergence(size_t unit, Phase phase, F&& gathers);
  void name_released_contents(size_t group);
  size_t group_of(size_t unit) const { return unit_to_group_[unit]; }
  int64_t numel_of_unit(size_t unit) const { return groups_[group_of(unit)].layout.padded_numel; }

  std::vector<partition::FlatGroup>& groups_;
  std::vector<GroupState> state_;
  std::vector<size_t> unit_to_group_;
  std::vector<std::string> unit_names_;
  comm::Comm& comm_;
  const comm::Group& dp_;
  Stage3Options opts_;
  UnitSchedule schedule_;
  int64_t live_ = 0;  // elements of non-persistent groups gathered or in flight
  // A released group whose pages the next gather takes: at most one, and
  // never past that gather (a group of another size drops it first), the
  // backward, the step or the engine, so no more memory is held than while
  // it was gathered. Not in live_: it is not gathered (what
  // stage3_max_live_parameters bounds is unchanged; a gather that takes it
  // adds no memory, one that does not lets it go first).
  std::optional<size_t> held_;
  int64_t peak_live_forward_ = 0;
  bool in_backward_ = false;
  static constexpr size_t kNoUnit = static_cast<size_t>(-1);
  size_t root_unit_ = kNoUnit;  // the root's unit index (engine.forward), if shardable
  bool root_sharded_ = false;   // engine.forward() has run: the root is a unit like the others
};

template <typename NumelOf>
int64_t UnitSchedule::reuse_distance(size_t unit, size_t position, NumelOf&& numel_of) const {
  int64_t distance = 0;
  for (size_t p = position; p < trace_.size(); ++p) {
    if (trace_[p].unit == unit) return distance;
    distance += numel_of(trace_[p].unit);
  }
  return -1;
}

}  // namespace zero
