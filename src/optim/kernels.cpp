#include "optim/kernels.h"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <vector>

#include <omp.h>

#include "common/half_bits.h"
#include "optim/update_math.h"

namespace zero::optim {

namespace {

// One chunk per thread-step: big enough to amortize scheduling, small enough
// to balance. Multiple of 64 so chunks stay vector-aligned.
constexpr int64_t kChunk = 1 << 16;

int g_threads = 0;  // 0: OpenMP's default

using bits::to_bf16;
using bits::to_fp16;

using bits::from_bf16;
using bits::from_fp16;

inline void store_out(void* out, int64_t i, float x, Out16 kind) {
  switch (kind) {
    case Out16::BF16: static_cast<uint16_t*>(out)[i] = to_bf16(x); break;
    case Out16::FP16: static_cast<uint16_t*>(out)[i] = to_fp16(x); break;
    case Out16::BF16Widened: static_cast<float*>(out)[i] = from_bf16(to_bf16(x)); break;
    case Out16::FP16Widened: static_cast<float*>(out)[i] = from_fp16(to_fp16(x)); break;
    case Out16::None: break;
  }
}

#define ZERO_CLONES __attribute__((target_clones("avx512f", "arch=haswell", "default")))

// The per-chunk loops, one clone per instruction set (see kernels.h); the
// per-element formulas are optim/update_math.h's, shared with the CUDA kernels.
ZERO_CLONES
void downcast_chunk(const float* __restrict src, void* __restrict dst, int64_t n, Out16 kind) {
  for (int64_t i = 0; i < n; ++i) store_out(dst, i, src[i], kind);
}

// The update and the 16-bit write are two loops over the chunk (still in
// cache for the second): the update alone has no per-element branch, so
// GCC vectorizes it; the write's conversions do not vectorize.
ZERO_CLONES
void adam_chunk(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                int64_t n, const AdamCoeffs c, void* __restrict out, Out16 kind) {
  for (int64_t i = 0; i < n; ++i) p[i] = adam_element(p[i], g[i], m[i], v[i], c);
  if (out) downcast_chunk(p, out, n, kind);
}

ZERO_CLONES
void sgd_chunk(float* __restrict p, const float* __restrict g, float* __restrict buf, int64_t n,
               const SgdHyper h, float grad_scale, void* __restrict out, Out16 kind) {
  for (int64_t i = 0; i < n; ++i) p[i] = sgd_element(p[i], g[i], buf ? buf + i : nullptr, h, grad_scale);
  if (out) downcast_chunk(p, out, n, kind);
}

ZERO_CLONES
void lion_chunk(float* __restrict p, const float* __restrict g, float* __restrict m, int64_t n, const LionHyper h,
                float grad_scale, void* __restrict out, Out16 kind) {
  for (int64_t i = 0; i < n; ++i) p[i] = lion_element(p[i], g[i], m[i], h, grad_scale);
  if (out) downcast_chunk(p, out, n, kind);
}

ZERO_CLONES
void adagrad_chunk(float* __restrict p, const float* __restrict g, float* __restrict sum, int64_t n,
                   const AdagradHyper h, float grad_scale, void* __restrict out, Out16 kind) {
  for (int64_t i = 0; i < n; ++i) p[i] = adagrad_element(p[i], g[i], sum[i], h, grad_scale);
  if (out) downcast_chunk(p, out, n, kind);
}

ZERO_CLONES
void lamb_moments_chunk(const float* __restrict p, const float* __restrict g, float* __restrict m,
                        float* __restrict v, int64_t n, const LambHyper h, float grad_scale, double* sums) {
  double sp = 0.0, su = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float u = lamb_moments_element(p[i], g[i], m[i], v[i], h, grad_scale);
    sp += static_cast<double>(p[i]) * p[i];
    su += static_cast<double>(u) * u;
  }
  sums[0] = sp;
  sums[1] = su;
}

ZERO_CLONES
void lamb_apply_chunk(float* __restrict p, const float* __restrict m, const float* __restrict v, int64_t n,
                      const LambHyper h, float scaled_step, void* __restrict out, Out16 kind) {
  for (int64_t i = 0; i < n; ++i) p[i] = p[i] - scaled_step * lamb_direction(p[i], m[i], v[i], h);
  if (out) downcast_chunk(p, out, n, kind);
}

ZERO_CLONES
void muon_momentum_chunk(const float* __restrict g, float* __restrict m, float* __restrict out, int64_t n,
                         const MuonHyper h, float grad_scale) {
  for (int64_t i = 0; i < n; ++i) out[i] = muon_momentum_element(g[i], m[i], h, grad_scale);
}

ZERO_CLONES
void muon_apply_chunk(float* __restrict p, const float* __restrict u, int64_t n, const MuonHyper h,
                      void* __restrict out, Out16 kind) {
  for (int64_t i = 0; i < n; ++i) p[i] = muon_apply_element(p[i], u[i], h);
  if (out) downcast_chunk(p, out, n, kind);
}

// `out` advanced by `lo` elements of its kind.
inline void* out_at(void* out, int64_t lo, Out16 kind) {
  return out ? static_cast<char*>(out) + lo * out16_bytes(kind) : nullptr;
}

template <typename F>
void parallel_chunks(int64_t n, F&& fn) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  const int threads = g_threads > 0 ? g_threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk;
    fn(lo, std::min(n, lo + kChunk) - lo);
  }
}

}  // namespace

void adam_update(float* p, const float* grad, float* m, float* v, int64_t n, const AdamHyper& h,
                 float grad_scale, void* out16, Out16 kind) {
  const AdamCoeffs c = adam_coeffs(h, grad_scale);
  if (kind == Out16::None) out16 = nullptr;
  parallel_chunks(n, [&](int64_t lo, int64_t len) {
    adam_chunk(p + lo, grad + lo, m + lo, v + lo, len, c, out_at(out16, lo, kind), kind);
  });
}

void sgd_update(float* p, const float* grad, float* momentum_buf, int64_t n, const SgdHyper& h,
                float grad_scale, void* out16, Out16 kind) {
  float* buf = h.momentum != 0.0f ? momentum_buf : nullptr;
  if (kind == Out16::None) out16 = nullptr;
  parallel_chunks(n, [&](int64_t lo, int64_t len) {
    sgd_chunk(p + lo, grad + lo, buf ? buf + lo : nullptr, len, h, grad_scale, out_at(out16, lo, kind), kind);
  });
}

void lion_update(float* p, const float* grad, float* exp_avg, int64_t n, const LionHyper& h, float grad_scale,
                 void* out16, Out16 kind) {
  if (kind == Out16::None) out16 = nullptr;
  parallel_chunks(n, [&](int64_t lo, int64_t len) {
    lion_chunk(p + lo, grad + lo, exp_avg + lo, len, h, grad_scale, out_at(out16, lo, kind), kind);
  });
}

void adagrad_update(float* p, const float* grad, float* sum_sq, int64_t n, const AdagradHyper& h, float grad_scale,
                    void* out16, Out16 kind) {
  if (kind == Out16::None) out16 = nullptr;
  parallel_chunks(n, [&](int64_t lo, int64_t len) {
    adagrad_chunk(p + lo, grad + lo, sum_sq + lo, len, h, grad_scale, out_at(out16, lo, kind), kind);
  });
}

void lamb_moments(const float* p, const float* grad, float* m, float* v, int64_t n, const LambHyper& h,
                  float grad_scale, double* sums) {
  // Per-chunk partial sums, added in chunk order: the same result whatever
  // the thread count.
  std::vector<double> partial(2 * ((n + kChunk - 1) / kChunk + 1), 0.0);
  parallel_chunks(n, [&](int64_t lo, int64_t len) {
    lamb_moments_chunk(p + lo, grad + lo, m + lo, v + lo, len, h, grad_scale, &partial[2 * (lo / kChunk)]);
  });
  for (size_t c = 0; c < partial.size(); c += 2) {
    sums[0] += partial[c];
    sums[1] += partial[c + 1];
  }
}

float lamb_trust_ratio(double sumsq_p, double sumsq_u, const LambHyper& h) {
  const double w = std::sqrt(sumsq_p), u = std::sqrt(sumsq_u);
  if (w == 0.0 || u == 0.0) return 1.0f;
  return static_cast<float>(std::clamp(w / u, static_cast<double>(h.min_coeff), static_cast<double>(h.max_coeff)));
}

void lamb_apply(float* p, const float* m, const float* v, int64_t n, const LambHyper& h, float ratio, void* out16,
                Out16 kind) {
  if (kind == Out16::None) out16 = nullptr;
  const float scaled_step = lamb_step_size(h) * ratio;
  parallel_chunks(n, [&](int64_t lo, int64_t len) {
    lamb_apply_chunk(p + lo, m + lo, v + lo, len, h, scaled_step, out_at(out16, lo, kind), kind);
  });
}

void muon_momentum(const float* grad, float* m, float* nesterov, int64_t n, const MuonHyper& h, float grad_scale) {
  parallel_chunks(n, [&](int64_t lo, int64_t len) {
    muon_momentum_chunk(grad + lo, m + lo, nesterov + lo, len, h, grad_scale);
  });
}

void muon_apply(float* p, const float* update, int64_t n, const MuonHyper& h, void* out16, Out16 kind) {
  if (kind == Out16::None) out16 = nullptr;
  parallel_chunks(n, [&](int64_t lo, int64_t len) {
    muon_apply_chunk(p + lo, update + lo, len, h, out_at(out16, lo, kind), kind);
  });
}

void downcast(const float* src, void* dst, int64_t n, Out16 kind) {
  parallel_chunks(n, [&](int64_t lo, int64_t len) { downcast_chunk(src + lo, out_at(dst, lo, kind), len, kind); });
}

void set_kernel_threads(int n) { g_threads = n; }

const char* kernel_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "avx512f";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
  return "baseline";
}

}  // namespace zero::optim
