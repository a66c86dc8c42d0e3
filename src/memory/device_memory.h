// What a device has room for right now: how zero::Init decides whether a
// unit can be flattened on the device (seed 003). Asked of the device's
// allocator (c10::DeviceAllocator: CUDA's caching allocator, or the tests'
// CPU-backed device), so it needs no CUDA headers.
#pragma once

#include <cstdint>
#include <optional>

#include <c10/core/Device.h>

namespace zero::memory {

// Bytes an allocation on `device` can still get: what the device has free
// plus what its caching allocator holds reserved but unused (it hands
// that out first). nullopt for the host, or a device whose allocator cannot
// say.
std::optional<int64_t> device_free_bytes(c10::Device device);

// Bytes the allocator has handed out on `device` now, and its peak since
// the last reset (torch.cuda.memory_allocated / max_memory_allocated);
// nullopt where it keeps no stats.
std::optional<int64_t> device_allocated_bytes(c10::Device device);
std::optional<int64_t> device_peak_allocated_bytes(c10::Device device);
void reset_device_peak(c10::Device device);

}  // namespace zero::memory
