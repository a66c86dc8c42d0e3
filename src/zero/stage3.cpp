#include "zero/stage3.h"

#include <ATen/native/Resize.h>
#include <torch/csrc/autograd/custom_function.h>

namespace zero {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Identity in forward; in backward, regathers the unit before the grads flow
// into it (its own backward ops need its params).
struct RegatherBeforeBackward : torch::autograd::Function<RegatherBeforeBackward> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Stage3Runtime* rt, int64_t unit) {
    ctx->saved_data["runtime"] = reinterpret_cast<int64_t>(rt);
    ctx->saved_data["unit"] = unit;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* rt = reinterpret_cast<Stage3Runtime*>(ctx->saved_data["runtime"].toInt());
    rt->before_backward(static_cast<size_t>(ctx->saved_data["unit"].toInt()));
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

void resize_storage(const at::Tensor& t, size_t bytes) {
  at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(), bytes);
}

}  // namespace

Stage3Runtime::Stage3Runtime(std::vector<partition::FlatGroup>& groups, std::vector<bool> persistent,
                             std::vector<size_t> unit_to_group, comm::Comm& comm, const comm::Group& dp)
    : groups_(groups), persistent_(std::move(persistent)), unit_to_group_(std::move(unit_to_group)),
      comm_(comm), dp_(dp), gathered_(persistent_) {}

void Stage3Runtime::release_storage(partition::FlatGroup& g) { resize_storage(g.param_flat, 0); }

void Stage3Runtime::materialize(size_t i) {
  auto& g = groups_[i];
  resize_storage(g.param_flat, g.layout.padded_numel * g.param_flat.element_size());
  comm_.all_gather(dp_, g.param_flat, g.param_shard)->wait();
}

void Stage3Runtime::gather(size_t i) {
  if (gathered_[i]) return;
  materialize(i);
  gathered_[i] = true;
  live_ += groups_[i].layout.padded_numel;
  peak_live_ = std::max(peak_live_, live_);
}

void Stage3Runtime::release(size_t i) {
  if (!gathered_[i] || persistent_[i]) return;
  release_storage(groups_[i]);
  gathered_[i] = false;
  live_ -= groups_[i].layout.padded_numel;
}

void Stage3Runtime::before_forward(size_t unit) { gather(unit_to_group_[unit]); }

at::Tensor Stage3Runtime::after_forward(size_t unit, const at::Tensor& out) {
  release(unit_to_group_[unit]);
  if (!out.requires_grad()) return out;  // no backward will come (e.g. evaluation)
  return RegatherBeforeBackward::apply(out, this, static_cast<int64_t>(unit));
}

void Stage3Runtime::before_backward(size_t unit) { gather(unit_to_group_[unit]); }

void Stage3Runtime::on_grads_complete(size_t group) { release(group); }

void Stage3Runtime::after_backward() {
  for (size_t i = 0; i < groups_.size(); ++i) release(i);
}

void Stage3Runtime::after_step() {
  std::vector<comm::WorkHandle> works;
  for (size_t i = 0; i < groups_.size(); ++i)
    if (persistent_[i]) works.push_back(comm_.all_gather(dp_, groups_[i].param_flat, groups_[i].param_shard));
  for (auto& w : works) w->wait();
}

}  // namespace zero
