// The C++ side of a Python model: for each Python nn.Module a C++ module
// registering the same tensors (the same TensorImpls: what the engine does
// to them -- flattening them into views of a flat buffer, casting them to
// bf16, releasing them at stage 3 -- the Python model sees) under the same
// names, its children mirrored likewise. So zero::Engine and zero::Init run
// on a Python model unchanged: the engine walks the mirror as it walks a
// C++ model.
//
// A Python module that is a stage-3 unit (DeepSpeed's choice: it owns
// trainable params directly; python/zero_cpp/mirror.py decides) is mirrored
// by a UnitMirror, a zero::UnitBase the module's forward hooks drive:
// enter() before its forward, leave(outputs) after, failed() when it threw.
// Units nest: an outer unit holds only what no unit inside it holds (its
// direct params), as DeepSpeed gathers each module's own params.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "zero/unit.h"

namespace zero::python {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// A Python module that is not a unit (or the root).
class ModuleMirror : public torch::nn::Module {
 public:
  explicit ModuleMirror(const std::string& type_name);
  // Sets the module's own params (not its children's) to these, in order:
  // the Python module's current ones (tied weights and params replaced
  // after construction included; each keeps its own requires_grad), and
  // registers its buffers (one registered already must be the same tensor).
  void set_members(const NamedTensors& params, const NamedTensors& buffers);
  void add_child(const std::string& name, std::shared_ptr<torch::nn::Module> child);
};

// A Python module that is a stage-3 unit.
class UnitMirror : public UnitBase {
 public:
  void set_members(const NamedTensors& params, const NamedTensors& buffers);
  void add_child(const std::string& name, std::shared_ptr<torch::nn::Module> child);
  torch::nn::Module& inner_module() override { return *this; }

  // The module's forward hooks. Below stage 3, or before an engine adopts
  // the unit, they do nothing.
  void enter();
  void leave(const std::vector<at::Tensor>& outputs);
  void failed();
};

}  // namespace zero::python
