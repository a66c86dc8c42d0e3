#include "comm/cuda/peer_sum.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace zero::comm::cuda {

namespace {

constexpr int kThreads = 256;

// The sources by value: one kernel argument (kMaxPeers pointers, 512 bytes).
struct Sources {
  const void* ptr[kMaxPeers];
};

template <typename T>
__device__ inline float load(const void* p, int64_t i);
template <>
__device__ inline float load<float>(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
template <>
__device__ inline float load<__nv_bfloat16>(const void* p, int64_t i) {
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
template <>
__device__ inline float load<__half>(const void* p, int64_t i) { return __half2float(static_cast<const __half*>(p)[i]); }

template <typename T>
__device__ inline void store(void* p, int64_t i, float x);
template <>
__device__ inline void store<float>(void* p, int64_t i, float x) { static_cast<float*>(p)[i] = x; }
template <>
__device__ inline void store<__nv_bfloat16>(void* p, int64_t i, float x) {
  static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
}
template <>
__device__ inline void store<__half>(void* p, int64_t i, float x) { static_cast<__half*>(p)[i] = __float2half_rn(x); }

// fp32 accumulation in rank order, one rounding into the output type.
template <typename In, typename Out>
__global__ void sum_kernel(Sources s, int n_src, void* out, int64_t count, bool average) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = load<In>(s.ptr[0], i);
    for (int q = 1; q < n_src; ++q) acc += load<In>(s.ptr[q], i);
    // Division, not a reciprocal multiply: what the host kernel computes.
    store<Out>(out, i, average ? acc / static_cast<float>(n_src) : acc);
  }
}

__global__ void sum_kernel_f64(Sources s, int n_src, double* out, int64_t count, bool average) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double acc = static_cast<const double*>(s.ptr[0])[i];
    for (int q = 1; q < n_src; ++q) acc += static_cast<const double*>(s.ptr[q])[i];
    out[i] = average ? acc / static_cast<double>(n_src) : acc;
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(wanted < 65535 * 8 ? (wanted > 0 ? wanted : 1) : 65535 * 8);
}

template <typename In>
void launch_for_input(const Sources& s, int n_src, shm::Elem out_type, void* out, int64_t count, bool average,
                      cudaStream_t st) {
  if (out_type == shm::Elem::F32)
    sum_kernel<In, float><<<blocks_for(count), kThreads, 0, st>>>(s, n_src, out, count, average);
  else
    sum_kernel<In, In><<<blocks_for(count), kThreads, 0, st>>>(s, n_src, out, count, average);
}

}  // namespace

void peer_sum(const void* const* srcs, int n_src, shm::Elem in, void* out, shm::Elem out_type, int64_t count,
              bool average, void* stream) {
  if (n_src < 1 || n_src > kMaxPeers) throw std::invalid_argument("peer_sum: 1 to 64 sources");
  if (count == 0) return;
  Sources s{};
  for (int q = 0; q < n_src; ++q) s.ptr[q] = srcs[q];
  const auto st = static_cast<cudaStream_t>(stream);
  average = average && n_src > 1;
  switch (in) {
    case shm::Elem::F32: launch_for_input<float>(s, n_src, out_type, out, count, average, st); break;
    case shm::Elem::BF16: launch_for_input<__nv_bfloat16>(s, n_src, out_type, out, count, average, st); break;
    case shm::Elem::F16: launch_for_input<__half>(s, n_src, out_type, out, count, average, st); break;
    case shm::Elem::F64:
      sum_kernel_f64<<<blocks_for(count), kThreads, 0, st>>>(s, n_src, static_cast<double*>(out), count, average);
      break;
    default: throw std::invalid_argument("peer_sum: not a reducible element type");
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string("peer_sum: ") + cudaGetErrorString(err));
}

}  // namespace zero::comm::cuda
