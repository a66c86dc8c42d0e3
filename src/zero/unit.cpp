#include "zero/unit_runtime.h"

namespace zero {

void UnitBase::enter_forward() { runtime_->before_forward(index_); }
at::Tensor UnitBase::leave_forward(const at::Tensor& out) { return runtime_->after_forward(index_, out); }
void UnitBase::forward_failed() { runtime_->forward_failed(index_); }

void UnitBase::adopt_members(torch::nn::Module& inner) {
  for (const auto& p : inner.named_parameters(/*recurse=*/false))
    register_parameter(p.key(), p.value(), p.value().requires_grad());
  for (const auto& b : inner.named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  for (const auto& c : inner.named_children()) register_module(c.key(), c.value());
}

}  // namespace zero
