// A flat group's buffers on this rank: the params laid end to end in one
// flat tensor (the module's params become views of it), the grad buffer, and
// the fp32 optimizer state of this rank's shard. See partition/layout.h for
// the index arithmetic and DESIGN.md §2 for which buffers each stage keeps.
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "partition/layout.h"

namespace zero::partition {

struct FlatGroup {
  GroupLayout layout;
  std::vector<at::Tensor> params;  // the module's params, in layout order
  std::vector<std::string> names;

  at::Tensor param_flat;  // [padded_numel], param dtype; params are views into it
  at::Tensor param_shard; // stage 3: [shard_numel], param dtype, this rank's params at rest
  at::Tensor grad_flat;   // [padded_numel], grad dtype; resident or transient by stage
  at::Tensor grad_shard;  // [shard_numel] fp32 reduced grads (stages 1/2); may alias grad_flat
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

// Stage 3: frees the full param buffer's memory at rest, and makes it usable
// again (zero-filled) before a gather fills it. The buffer keeps its address
// and storage throughout, so the params (views of it) and the tensors
// autograd saved see the regathered data, and no version counter moves.
// While released, an access to it stops the process with a message naming
// the param (memory/release_guard.h). param_flat must be page-backed.
void release_params(const FlatGroup& g);
void restore_params(const FlatGroup& g);
bool params_released(const FlatGroup& g);

// Moves `params` (the module's own tensors) into one new flat fp32 buffer,
// one param at a time, each original freed as soon as it is copied: the
// peak is the model plus this one group, never a second model.
void flatten_into_group(FlatGroup& g, at::ScalarType dtype);

}  // namespace zero::partition
