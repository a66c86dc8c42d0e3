#include "comm/cuda/peer_sum.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace zero::comm::cuda {

namespace {

constexpr int kThreads = 256;

// The sources by value: one kernel argument (kMaxPeers pointers, 512 bytes).
struct Sources {
  const void* ptr[kMaxPeers];
};

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ inline T from_float(float x);
template <>
__device__ inline float from_float<float>(float x) { return x; }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }

// One element: fp32 accumulation in rank order, one rounding into the
// output type. Division, not a reciprocal multiply: what the host kernel
// (shm::sum_in_rank_order) computes.
template <typename In, typename Out>
__device__ inline void sum_one(const Sources& s, int n_src, Out* out, int64_t i, bool average) {
  float acc = to_float(static_cast<const In*>(s.ptr[0])[i]);
  for (int q = 1; q < n_src; ++q) acc += to_float(static_cast<const In*>(s.ptr[q])[i]);
  out[i] = from_float<Out>(average ? acc / static_cast<float>(n_src) : acc);
}

// V elements that move as one 16-byte load (bf16: 8, fp32: 4).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// The sum with 16-byte loads: 2-byte elements read one by one leave most of
// the memory system idle, and the reduce-scatter and all-reduce of the
// direct path (cuda_ipc_transport.cpp) are bound by this kernel's reads. The
// same arithmetic per element as sum_one, so the bits do not change. Needs
// every source and the output aligned to their packs (vectorizable());
// the last count % V elements are summed one by one.
template <typename In, typename Out>
__global__ void sum_kernel(Sources s, int n_src, void* out_ptr, int64_t count, bool average) {
  constexpr int V = 16 / sizeof(In);
  using InPack = Pack<In, V>;
  using OutPack = Pack<Out, V>;
  auto* out = static_cast<Out*>(out_ptr);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t packs = count / V;
  for (int64_t p = first; p < packs; p += stride) {
    float acc[V];
    const InPack x0 = static_cast<const InPack*>(s.ptr[0])[p];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = to_float(x0.v[j]);
    for (int q = 1; q < n_src; ++q) {
      const InPack x = static_cast<const InPack*>(s.ptr[q])[p];
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += to_float(x.v[j]);
    }
    OutPack y;
#pragma unroll
    for (int j = 0; j < V; ++j) y.v[j] = from_float<Out>(average ? acc[j] / static_cast<float>(n_src) : acc[j]);
    reinterpret_cast<OutPack*>(out)[p] = y;
  }
  for (int64_t i = packs * V + first; i < count; i += stride) sum_one<In, Out>(s, n_src, out, i, average);
}

// Sources or an output not aligned to the packs (a slice at an odd offset):
// element by element.
template <typename In, typename Out>
__global__ void sum_kernel_unaligned(Sources s, int n_src, void* out, int64_t count, bool average) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    sum_one<In, Out>(s, n_src, static_cast<Out*>(out), i, average);
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

bool aligned(const void* p, size_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; }

template <typename In, typename Out>
void launch(const Sources& s, int n_src, void* out, int64_t count, bool average, cudaStream_t st) {
  constexpr int V = 16 / sizeof(In);
  bool vectorizable = aligned(out, sizeof(Out) * V);
  for (int q = 0; q < n_src; ++q) vectorizable = vectorizable && aligned(s.ptr[q], 16);
  if (vectorizable)
    sum_kernel<In, Out><<<blocks_for((count + V - 1) / V), kThreads, 0, st>>>(s, n_src, out, count, average);
  else
    sum_kernel_unaligned<In, Out><<<blocks_for(count), kThreads, 0, st>>>(s, n_src, out, count, average);
}

template <typename In>
void launch_for_input(const Sources& s, int n_src, shm::Elem out_type, void* out, int64_t count, bool average,
                      cudaStream_t st) {
  if (out_type == shm::Elem::F32)
    launch<In, float>(s, n_src, out, count, average, st);
  else
    launch<In, In>(s, n_src, out, count, average, st);
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
