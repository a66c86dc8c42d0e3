// The device a c10::OptionalDeviceGuard should hold for work on a tensor or
// device: none for the host (nothing to switch). Every entry that allocates
// or queues device work holds one, because the thread it runs on may have
// another current device -- autograd's threads, a lane's worker, a rank
// whose program never called set_device -- and CUDA allocates and launches
// on the current device, not the tensor's.
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace zero {

inline std::optional<c10::Device> guard_device(c10::Device d) {
  return d.is_cpu() ? std::nullopt : std::make_optional(d);
}

inline std::optional<c10::Device> guard_device(const at::Tensor& t) {
  return t.defined() ? guard_device(t.device()) : std::nullopt;
}

}  // namespace zero
