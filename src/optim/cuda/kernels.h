// The optimizer kernels on a CUDA device: the same updates as
// optim/kernels.h (one formula, optim/update_math.h) over device pointers,
// launched on the caller's stream. This header needs no CUDA or torch
// headers: the stream is passed as the cudaStream_t it is, cast to void*.
//
// Built only when the CUDA toolkit is found (ZERO_CUDA); compiled and
// linked in CI, run by tests/cuda on machines with a GPU.
#pragma once

#include <cstdint>

#include "optim/kernels.h"

namespace zero::optim::cuda {

// p, m, v (fp32, device) updated in place from grad * grad_scale; if out16 is
// not null the updated params are also written there as bf16/fp16, in the
// same pass. Asynchronous on `stream` (nullptr: the legacy default stream).
void adam_update(float* p, const float* grad, float* m, float* v, int64_t n, const AdamHyper& h,
                 float grad_scale, void* out16, Out16 kind, void* stream);

void sgd_update(float* p, const float* grad, float* momentum_buf, int64_t n, const SgdHyper& h,
                float grad_scale, void* out16, Out16 kind, void* stream);

void lion_update(float* p, const float* grad, float* exp_avg, int64_t n, const LionHyper& h, float grad_scale,
                 void* out16, Out16 kind, void* stream);

void adagrad_update(float* p, const float* grad, float* sum_sq, int64_t n, const AdagradHyper& h, float grad_scale,
                    void* out16, Out16 kind, void* stream);

// LAMB's passes (optim/kernels.h). `sums` is device memory: two doubles
// the block sums are added to atomically (their order, and so the last bits
// of the norms, may vary between runs).
void lamb_moments(const float* p, const float* grad, float* m, float* v, int64_t n, const LambHyper& h,
                  float grad_scale, double* sums, void* stream);
void lamb_apply(float* p, const float* m, const float* v, int64_t n, const LambHyper& h, float ratio, void* out16,
                Out16 kind, void* stream);

// Muon's element-wise halves (optim/kernels.h).
void muon_momentum(const float* grad, float* m, float* nesterov, int64_t n, const MuonHyper& h, float grad_scale,
                   void* stream);
void muon_apply(float* p, const float* update, int64_t n, const MuonHyper& h, void* out16, Out16 kind, void* stream);

// n fp32 values to bf16/fp16, round to nearest even.
void downcast(const float* src, void* dst, int64_t n, Out16 kind, void* stream);

// Throws std::runtime_error naming `what` and CUDA's message if the last
// launch failed.
void check_launch(const char* what);

}  // namespace zero::optim::cuda
