#include "zero/unit_runtime.h"

namespace zero {

namespace detail {

namespace {
// The names (relative to `unit`) of the units nested in it, each with a
// trailing dot: a member whose name starts with one is theirs.
std::vector<std::string> nested_unit_prefixes(torch::nn::Module& unit) {
  std::vector<std::string> prefixes;
  for (const auto& item : unit.named_modules("", /*include_self=*/false))
    if (dynamic_cast<UnitBase*>(item.value().get())) prefixes.push_back(item.key() + ".");
  return prefixes;
}

bool held_by_nested(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes)
    if (name.compare(0, p.size(), p) == 0) return true;
  return false;
}
}  // namespace

std::vector<std::pair<std::string, at::Tensor>> own_parameters(torch::nn::Module& unit) {
  const auto nested = nested_unit_prefixes(unit);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : unit.named_parameters(/*recurse=*/true))
    if (!held_by_nested(item.key(), nested)) out.emplace_back(item.key(), item.value());
  return out;
}

std::vector<at::Tensor> own_buffers(torch::nn::Module& unit) {
  const auto nested = nested_unit_prefixes(unit);
  std::vector<at::Tensor> out;
  for (const auto& item : unit.named_buffers(/*recurse=*/true))
    if (!held_by_nested(item.key(), nested)) out.push_back(item.value());
  return out;
}

}  // namespace detail

void UnitBase::enter_forward() { runtime_->before_forward(index_); }
at::Tensor UnitBase::leave_forward(const at::Tensor& out) { return runtime_->after_forward(index_, out); }
void UnitBase::leave_forward(const std::vector<at::Tensor>& outs) { runtime_->after_forward(index_, outs); }
void UnitBase::forward_failed() { runtime_->forward_failed(index_); }

void UnitBase::adopt_members(torch::nn::Module& inner) {
  for (const auto& p : inner.named_parameters(/*recurse=*/false))
    register_parameter(p.key(), p.value(), p.value().requires_grad());
  for (const auto& b : inner.named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  for (const auto& c : inner.named_children()) register_module(c.key(), c.value());
}

}  // namespace zero
