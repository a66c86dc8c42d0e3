#include "optim/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "optim/update_math.h"

namespace zero::optim::cuda {

namespace {

constexpr int kThreads = 256;

// Enough blocks to fill the device; each thread strides over the rest.
unsigned blocks_for(int64_t n) {
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(wanted < 65535 * 8 ? (wanted > 0 ? wanted : 1) : 65535 * 8);
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

__device__ inline void store16(void* out, int64_t i, float x, Out16 kind) {
  switch (kind) {
    case Out16::BF16: static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(x); break;
    case Out16::FP16: static_cast<__half*>(out)[i] = __float2half_rn(x); break;
    case Out16::BF16Widened: static_cast<float*>(out)[i] = __bfloat162float(__float2bfloat16_rn(x)); break;
    case Out16::FP16Widened: static_cast<float*>(out)[i] = __half2float(__float2half_rn(x)); break;
    case Out16::None: break;
  }
}

__global__ void adam_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                            float* __restrict__ v, int64_t n, AdamCoeffs c, void* out16, Out16 kind) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float mi = m[i], vi = v[i];
    const float param = adam_element(p[i], g[i], mi, vi, c);
    m[i] = mi;
    v[i] = vi;
    p[i] = param;
    if (out16) store16(out16, i, param, kind);
  }
}

__global__ void sgd_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ buf, int64_t n,
                           SgdHyper h, float grad_scale, void* out16, Out16 kind) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float param = sgd_element(p[i], g[i], buf ? buf + i : nullptr, h, grad_scale);
    p[i] = param;
    if (out16) store16(out16, i, param, kind);
  }
}

__global__ void lion_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m, int64_t n,
                            LionHyper h, float grad_scale, void* out16, Out16 kind) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float mi = m[i];
    const float param = lion_element(p[i], g[i], mi, h, grad_scale);
    m[i] = mi;
    p[i] = param;
    if (out16) store16(out16, i, param, kind);
  }
}

__global__ void adagrad_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ sum,
                               int64_t n, AdagradHyper h, float grad_scale, void* out16, Out16 kind) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float si = sum[i];
    const float param = adagrad_element(p[i], g[i], si, h, grad_scale);
    sum[i] = si;
    p[i] = param;
    if (out16) store16(out16, i, param, kind);
  }
}

__global__ void lamb_moments_kernel(const float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                    float* __restrict__ v, int64_t n, LambHyper h, float grad_scale,
                                    double* sums) {
  __shared__ double sp[kThreads], su[kThreads];
  double a = 0.0, b = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float mi = m[i], vi = v[i];
    const float u = lamb_moments_element(p[i], g[i], mi, vi, h, grad_scale);
    m[i] = mi;
    v[i] = vi;
    a += static_cast<double>(p[i]) * p[i];
    b += static_cast<double>(u) * u;
  }
  sp[threadIdx.x] = a;
  su[threadIdx.x] = b;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      sp[threadIdx.x] += sp[threadIdx.x + half];
      su[threadIdx.x] += su[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicAdd(sums, sp[0]);
    atomicAdd(sums + 1, su[0]);
  }
}

__global__ void lamb_apply_kernel(float* __restrict__ p, const float* __restrict__ m, const float* __restrict__ v,
                                  int64_t n, LambHyper h, float scaled_step, void* out16, Out16 kind) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float param = p[i] - scaled_step * lamb_direction(p[i], m[i], v[i], h);
    p[i] = param;
    if (out16) store16(out16, i, param, kind);
  }
}

__global__ void muon_momentum_kernel(const float* __restrict__ g, float* __restrict__ m, float* __restrict__ out,
                                     int64_t n, MuonHyper h, float grad_scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float mi = m[i];
    out[i] = muon_momentum_element(g[i], mi, h, grad_scale);
    m[i] = mi;
  }
}

__global__ void muon_apply_kernel(float* __restrict__ p, const float* __restrict__ u, int64_t n, MuonHyper h,
                                  void* out16, Out16 kind) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float param = muon_apply_element(p[i], u[i], h);
    p[i] = param;
    if (out16) store16(out16, i, param, kind);
  }
}

__global__ void downcast_kernel(const float* __restrict__ src, void* dst, int64_t n, Out16 kind) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store16(dst, i, src[i], kind);
}

}  // namespace

void adam_update(float* p, const float* grad, float* m, float* v, int64_t n, const AdamHyper& h,
                 float grad_scale, void* out16, Out16 kind, void* stream) {
  if (n == 0) return;
  adam_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(p, grad, m, v, n, adam_coeffs(h, grad_scale),
                                                                  out16, kind);
  check_launch("adam_update");
}

void sgd_update(float* p, const float* grad, float* momentum_buf, int64_t n, const SgdHyper& h,
                float grad_scale, void* out16, Out16 kind, void* stream) {
  if (n == 0) return;
  float* buf = h.momentum != 0.0f ? momentum_buf : nullptr;
  sgd_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(p, grad, buf, n, h, grad_scale, out16, kind);
  check_launch("sgd_update");
}

void lion_update(float* p, const float* grad, float* exp_avg, int64_t n, const LionHyper& h, float grad_scale,
                 void* out16, Out16 kind, void* stream) {
  if (n == 0) return;
  lion_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(p, grad, exp_avg, n, h, grad_scale, out16, kind);
  check_launch("lion_update");
}

void adagrad_update(float* p, const float* grad, float* sum_sq, int64_t n, const AdagradHyper& h, float grad_scale,
                    void* out16, Out16 kind, void* stream) {
  if (n == 0) return;
  adagrad_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(p, grad, sum_sq, n, h, grad_scale, out16, kind);
  check_launch("adagrad_update");
}

void lamb_moments(const float* p, const float* grad, float* m, float* v, int64_t n, const LambHyper& h,
                  float grad_scale, double* sums, void* stream) {
  if (n == 0) return;
  lamb_moments_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(p, grad, m, v, n, h, grad_scale, sums);
  check_launch("lamb_moments");
}

void lamb_apply(float* p, const float* m, const float* v, int64_t n, const LambHyper& h, float ratio, void* out16,
                Out16 kind, void* stream) {
  if (n == 0) return;
  lamb_apply_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(p, m, v, n, h, lamb_step_size(h) * ratio,
                                                                       out16, kind);
  check_launch("lamb_apply");
}

void muon_momentum(const float* grad, float* m, float* nesterov, int64_t n, const MuonHyper& h, float grad_scale,
                   void* stream) {
  if (n == 0) return;
  muon_momentum_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(grad, m, nesterov, n, h, grad_scale);
  check_launch("muon_momentum");
}

void muon_apply(float* p, const float* update, int64_t n, const MuonHyper& h, void* out16, Out16 kind, void* stream) {
  if (n == 0) return;
  muon_apply_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(p, update, n, h, out16, kind);
  check_launch("muon_apply");
}

void downcast(const float* src, void* dst, int64_t n, Out16 kind, void* stream) {
  if (n == 0) return;
  downcast_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(src, dst, n, kind);
  check_launch("downcast");
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("zero::optim::cuda::") + what + ": " + cudaGetErrorString(err));
}

}  // namespace zero::optim::cuda
