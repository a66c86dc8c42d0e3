#include "python/module_mirror.h"

#include <stdexcept>

namespace zero::python {

namespace {

// torch::nn::Module keeps its params in an ordered dict subclasses may
// change: a mirror's are replaced whole, so they follow the Python module
// (a param replaced after construction, or tied to another module's).
void replace(torch::OrderedDict<std::string, at::Tensor>& dict, const NamedTensors& members) {
  dict.clear();
  for (const auto& [name, t] : members) dict.insert(name, t);
}

// Its buffers only through register_buffer: those not registered yet are
// added; one registered already must be the same tensor.
void add_buffers(torch::nn::Module& m, const NamedTensors& buffers) {
  const auto have = m.named_buffers(/*recurse=*/false);
  for (const auto& [name, t] : buffers) {
    if (const at::Tensor* old = have.find(name)) {
      if (!old->is_same(t))
        throw std::invalid_argument("zero_cpp: buffer '" + name + "' of a module built under zero.Init was replaced "
                                    "by another tensor since; change its values in place instead");
      continue;
    }
    m.register_buffer(name, t);
  }
}

}  // namespace

ModuleMirror::ModuleMirror(const std::string& type_name) : torch::nn::Module(type_name) {}

void ModuleMirror::set_members(const NamedTensors& params, const NamedTensors& buffers) {
  replace(parameters_, params);
  add_buffers(*this, buffers);
}

void ModuleMirror::add_child(const std::string& name, std::shared_ptr<torch::nn::Module> child) {
  register_module(name, std::move(child));
}



void UnitMirror::set_members(const NamedTensors& params, const NamedTensors& buffers) {
  replace(parameters_, params);
  add_buffers(*this, buffers);
}

void UnitMirror::add_child(const std::string& name, std::shared_ptr<torch::nn::Module> child) {
  register_module(name, std::move(child));
}

void UnitMirror::enter() {
  if (managed()) enter_forward();
}

void UnitMirror::leave(const std::vector<at::Tensor>& outputs) {
  if (managed()) leave_forward(outputs);
}

void UnitMirror::failed() {
  if (managed()) forward_failed();
}

}  // namespace zero::python
