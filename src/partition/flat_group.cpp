#include "partition/flat_group.h"

#include "memory/page_buffer.h"
#include "memory/storage_release.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

namespace zero::partition {

namespace {
at::Tensor param_view(const at::Tensor& flat, const ParamSlot& s, const at::Tensor& like) {
  return flat.narrow(0, s.offset, s.numel).view(like.sizes());
}
}  // namespace

void flatten_into_group(FlatGroup& g, at::ScalarType dtype, std::optional<at::Device> device, bool pinned,
                        const InPlaceInit* init) {
  at::NoGradGuard no_grad;
  // On the params' device unless told; page-backed on the CPU
  // (memory/page_buffer.h). The padding arrives zeroed.
  const at::Device where =
      device.value_or(g.params.empty() ? at::Device(at::kCPU) : g.params.front().device());
  g.param_flat = pinned ? at::zeros({g.layout.padded_numel}, at::TensorOptions().dtype(dtype).pinned_memory(true))
                        : memory::zeros_flat(g.layout.padded_numel, dtype, where);
  for (size_t i = 0; i < g.params.size(); ++i) {
    at::Tensor& p = g.params[i];
    at::Tensor view = param_view(g.param_flat, g.layout.params[i], p);
    if (!init || !init->params.count(p.unsafeGetTensorImpl())) view.copy_(p);
    // The param keeps its identity (autograd leaf, module registration);
    // only its data now lives in the flat buffer, and its old storage is
    // released here.
    p.set_data(view);
  }
  if (init && init->run) init->run();
}

void flatten_from_rank0(FlatGroup& g, comm::Comm& comm, const comm::Group& dp, std::optional<at::Device> device,
                        bool pinned, const InPlaceInit* init) {
  flatten_into_group(g, at::kFloat, device, pinned, init);
  comm.broadcast(dp, g.param_flat, 0, "initial params")->wait();
}

void view_params_in(FlatGroup& g, at::Tensor flat) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < g.params.size(); ++i) g.params[i].set_data(param_view(flat, g.layout.params[i], g.params[i]));
  g.param_flat = std::move(flat);
}

// Page-backed host buffers keep their address across a release (and an
// access while released names the param); others -- device buffers -- give
// their block back to their allocator.
void release_params(const FlatGroup& g) {
  if (memory::page_backed(g.param_flat)) memory::release_pages(g.param_flat);
  else memory::release_storage(g.param_flat);
}
void restore_params(const FlatGroup& g) {
  if (memory::page_backed(g.param_flat)) memory::restore_pages(g.param_flat);
  else memory::restore_storage(g.param_flat);
}
bool hold_params(const FlatGroup& g) { return memory::hold_pages(g.param_flat); }
bool take_held_params(const FlatGroup& to, const FlatGroup& from) {
  return memory::take_held_pages(to.param_flat, from.param_flat);
}
bool params_released(const FlatGroup& g) {
  return memory::pages_released(g.param_flat) || memory::storage_released(g.param_flat);
}

void FlatGroup::attach_grads() const {
  for (size_t i = 0; i < params.size(); ++i)
    params[i].mutable_grad() = param_view(grad_flat, layout.params[i], params[i]);
}

void FlatGroup::detach_grads() const {
  for (const auto& p : params) p.mutable_grad() = at::Tensor();
}

}  // namespace zero::partition
