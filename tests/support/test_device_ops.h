// What the test device's kernels (test_device_kernels.cpp) and its boxed
// fallback (test_device_fallback.cpp) share: CPU tensors over device memory,
// the checks a CUDA kernel makes of its arguments, and transfer counting.
#pragma once

#include <string_view>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>

namespace c10 {
class OperatorHandle;
}

namespace zero::test_device::detail {

inline bool on_test_device(const at::Tensor& t) { return t.defined() && t.device().is_privateuseone(); }

// CPU tensors aliasing device tensors' memory: same bytes, sizes, strides and
// offset, so a CPU kernel run on them reads and writes the device memory in
// place. Device tensors that share a storage get host tensors that share one
// too: CPU kernels' overlap checks and views then see what they would on the
// device. Each host storage keeps its device storage alive.
class HostAliases {
 public:
  at::Tensor of(const at::Tensor& device_tensor);

  struct Entry {
    c10::Storage device;
    c10::Storage host;
  };
  // The entry whose host storage is `host`, or null.
  const Entry* by_host(const c10::StorageImpl* host) const;
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::vector<Entry> entries_;
  std::unordered_map<const c10::StorageImpl*, size_t> by_device_, by_host_;
};

// A CUDA kernel touches its arguments' memory from their device: throws
// unless `t`'s memory was allocated on t's own device (not on whatever device
// was current) and covers t's extent (a released storage does not).
void check_memory(const at::Tensor& t, std::string_view op, std::string_view arg);

// A dense tensor allocated on `device` (not on the current device).
at::Tensor empty_on(c10::Device device, c10::IntArrayRef sizes, c10::IntArrayRef strides, caffe2::TypeMeta dtype);

enum class Transfer { DeviceToHost, HostToDevice, DeviceToDevice };
// from_pageable: a copy to a device from host memory that is not pinned.
void count_transfer(Transfer kind, bool host_waits, bool from_pageable = false);

// Every op without a kernel of its own runs the CPU kernel in place.
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// The kernels of test_device_kernels.cpp and the fallback, for PrivateUse1.
void register_kernels();

}  // namespace zero::test_device::detail
