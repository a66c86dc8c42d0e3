// The parts of a model the flat groups do not hold: frozen params
// (requires_grad false) and buffers (e.g. BatchNorm's running statistics).
// As in DDP they are replicated: every rank holds them whole and rank 0's
// values win -- at engine construction, and for buffers at every step
// boundary unless zero_cpp.broadcast_buffers is false. Checkpoints, the
// consolidated weights and load_weights carry them under their module names.
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "zero/comm.h"

namespace torch::nn {
class Module;
}

namespace zero {

struct ReplicatedTensor {
  std::string name;   // as in model.named_parameters() / named_buffers()
  at::Tensor tensor;  // the module's own tensor (updated in place by training)
  bool buffer = false;
};

// Frozen params, then buffers, in registration order; a tensor registered
// under several names is listed once, under its first.
std::vector<ReplicatedTensor> replicated_tensors(torch::nn::Module& model);

// Every rank must build the same model (as DDP requires): the names, shapes,
// dtypes and trainability of all params and buffers are compared across the
// group, and a difference is a std::invalid_argument on every rank naming
// the first entry that differs and what each side holds.
// `what` opens the message (default: the engine's words for a whole model).
void check_same_model_on_all_ranks(torch::nn::Module& model, comm::Comm& comm, const comm::Group& dp,
                                   const std::string& what = {});

}  // namespace zero
