// What a CUDA device has free right now (cudaMemGetInfo): how zero::Init
// decides whether a unit can be flattened on the device (seed 003).
#pragma once

#include <cstdint>
#include <optional>

#include <c10/core/Device.h>

namespace zero::memory {

// Free bytes on `device`; nullopt for the host, or in a build without CUDA.
std::optional<int64_t> device_free_bytes(c10::Device device);

}  // namespace zero::memory
