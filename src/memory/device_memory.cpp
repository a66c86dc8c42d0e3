#include "memory/device_memory.h"

#include <stdexcept>
#include <string>

#ifdef ZERO_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace zero::memory {

std::optional<int64_t> device_free_bytes(c10::Device device) {
#ifdef ZERO_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess)
      throw std::runtime_error("zero-cpp: cudaMemGetInfo on " + device.str() + " failed");
    return static_cast<int64_t>(free);
  }
#endif
  return std::nullopt;
}

}  // namespace zero::memory
