// A flat group's buffers on this rank: the params laid end to end in one
// flat tensor (the module's params become views of it), the grad buffer, and
// the fp32 optimizer state of this rank's shard. See partition/layout.h for
// the index arithmetic and docs/design.md for which buffers each stage keeps.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>

#include "partition/layout.h"
#include "zero/comm.h"

namespace zero::partition {

// Who writes each field, and when:
// - grouping (engine/grouping.cpp, or zero::Init for a unit it shards)
//   writes layout, params, names, param_flat, param_shard and master once,
//   at construction; the flat optimizer adds exp_avg/exp_avg_sq then.
// - the grad reducer (zero/grad_reducer.cpp) owns grad_flat and grad_shard:
//   allocates, accumulates, reduces and zeroes them every backward and step.
// - the flat optimizer (engine/flat_optimizer.cpp) writes master and the
//   moments at each step, and the params' 16-bit values in the same pass
//   (StagePolicy::update_destination).
// - the stage-3 runtime (zero/stage3.cpp) releases and refills param_flat
//   around each use (release_params / restore_params below).
// - checkpoint loads and gathered-scope write-backs overwrite master and
//   the moments, then the engine publishes the params.
struct FlatGroup {
  GroupLayout layout;
  std::vector<at::Tensor> params;  // the module's params, in layout order
  std::vector<std::string> names;

  // The params' dtype at rest and on the wire (engine/precision.h). param_flat
  // is in it, or in fp32 holding its values when the module computes in fp32
  // (widened); then param_shard holds this rank's part in it (stages 1-3).
  at::ScalarType storage_dtype = at::kFloat;
  at::Tensor param_flat;  // [padded_numel], compute dtype; params are views into it
  at::Tensor param_shard; // [shard_numel], storage dtype: stage 3's params at rest, or a widened
                          // group's updated part before it is gathered (stages 1-2)
  at::Tensor grad_flat;   // [padded_numel], grad dtype; resident or transient by stage
  at::Tensor grad_shard;  // [shard_numel] fp32 reduced grads (stages 1-3); may alias grad_flat
  at::Tensor master;      // fp32 weights the optimizer updates: this rank's shard, or all (stage 0)
  at::Tensor exp_avg;     // optimizer state, same size as master
  at::Tensor exp_avg_sq;

  // This rank's slot of a full-size flat buffer.
  at::Tensor own_slot(const at::Tensor& flat, int rank) const {
    return flat.narrow(0, rank * layout.shard_numel, layout.shard_numel);
  }
  // Point each param's .grad at its slice of grad_flat (grads then
  // accumulate straight into the flat buffer).
  void attach_grads() const;
  // Drop the params' .grad views (so a transient grad_flat can be freed).
  void detach_grads() const;
};

// Params whose values a deferred init (zero::defer_init, zero/init.h)
// writes in place: flattening makes them views of the buffer without
// copying their (never written) originals, and `run` draws them there.
struct InPlaceInit {
  std::unordered_set<const void*> params;  // their TensorImpls
  std::function<void()> run;               // may be empty: nothing deferred
};

// Moves `params` (the module's own tensors) into one new flat fp32 buffer,
// one param at a time, each original freed as soon as it is copied: the
// peak is the model plus this one group, never a second model.
// The buffer is on `device` (default: the params'), pinned when `pinned`
// (a host buffer bound for a device). `init`: params not copied, and the
// draws run once every param views the buffer.
void flatten_into_group(FlatGroup& g, at::ScalarType dtype, std::optional<at::Device> device = std::nullopt,
                        bool pinned = false, const InPlaceInit* init = nullptr);
// flatten_into_group, then every rank takes rank 0's values (as DeepSpeed's
// engine and zero.Init do): whatever each rank's RNG did, all start alike.
void flatten_from_rank0(FlatGroup& g, comm::Comm& comm, const comm::Group& dp,
                        std::optional<at::Device> device = std::nullopt, bool pinned = false,
                        const InPlaceInit* init = nullptr);
// Makes `flat` the group's param buffer, each param a view of its slot (a
// 16-bit copy of the fp32 one, say); the previous buffer goes with its last view.
void view_params_in(FlatGroup& g, at::Tensor flat);

// Stage 3: frees the full param buffer's memory at rest, and makes it usable
// again before a gather fills it (host pages arrive zero-filled; a device
// block is left unwritten, since the gather overwrites all of it). The buffer keeps its address
// and storage throughout, so the params (views of it) and the tensors
// autograd saved see the regathered data, and no version counter moves.
// While released, an access to it stops the process with a message naming
// the param (memory/release_guard.h). param_flat must be page-backed.
void release_params(const FlatGroup& g);
void restore_params(const FlatGroup& g);
bool params_released(const FlatGroup& g);
// The same release keeping the pages for the next gather of a group of the
// same size, which take_held_params gives them to (memory/page_buffer.h
// hold_pages; host pages only: false where the group's buffer cannot be
// held or taken from, and nothing is done). A held group is released.
bool hold_params(const FlatGroup& g);
bool take_held_params(const FlatGroup& to, const FlatGroup& from);

}  // namespace zero::partition
