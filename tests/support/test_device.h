// zdev: a second device type for tests on machines without a GPU.
//
// The project's device path (params, grads and flat buffers on a GPU,
// memory taken on the current device, host syncs) never runs where no GPU
// is. zdev is PyTorch's PrivateUse1 backend, registered on demand, whose
// memory is host memory and whose kernels are the CPU kernels run in place
// on it -- but which checks what a CUDA kernel would refuse or get wrong:
// tensors from two devices (or a CPU tensor that is not a 0-dim scalar) in
// one op, and memory that was allocated on another device than its
// tensor's (the current device, when a device guard was missing). Tensors
// print as zdev:0, zdev:1, ...; docs/test_device.md says what is checked and
// what cannot be.
//
// install() makes zdev the process's accelerator: at::accelerator::*,
// at::getAccelerator() and pinned host memory then mean zdev, even where
// CUDA is present. Install before the process's first backward pass (the
// autograd engine counts devices once).
#pragma once

#include <cstddef>
#include <cstdint>

#include <c10/core/Device.h>

namespace zero::test_device {

inline constexpr char kName[] = "zdev";
inline constexpr size_t kDefaultCapacity = size_t{64} << 30;

// Registers the backend with `devices` devices; later calls with the same
// count do nothing (another count is an error). Nothing is registered until
// it is called.
void install(int devices = 2);
bool installed();
int device_count();
// zdev:index.
c10::Device device(int index);

// The bytes a device may hold before allocation fails with
// c10::OutOfMemoryError (kDefaultCapacity until set).
void set_capacity(int index, size_t bytes);
size_t capacity(int index);

// Transfers since the last reset, counted as the GPU path would make them.
struct TransferCounts {
  // Copies into host memory and reads of device values on the host (item(),
  // and the ops whose result's size depends on device data: nonzero, ...).
  int64_t device_to_host = 0;
  // Those the host waits for: all but non_blocking copies into pinned memory.
  int64_t host_waits = 0;
  int64_t host_to_device = 0;
  // Of those, the ones from pageable (not pinned) host memory: CUDA stages
  // them through a buffer of its own, and the host waits for that.
  int64_t host_to_device_pageable = 0;
  // Copies between two zdev devices.
  int64_t device_to_device = 0;
};
TransferCounts transfer_counts();
void reset_transfer_counts();

}  // namespace zero::test_device
