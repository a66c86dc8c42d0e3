#include "zero/unit_runtime.h"

namespace zero {

void UnitBase::enter_forward() { runtime_->before_forward(index_); }
at::Tensor UnitBase::leave_forward(const at::Tensor& out) { return runtime_->after_forward(index_, out); }
void UnitBase::forward_failed() { runtime_->forward_failed(index_); }

}  // namespace zero
