// Optimizer kernels over flat fp32 shards (no torch: plain pointers, so the
// ZeRO engine can hand them any shard and they compile in seconds).
//
// Compiled through GCC function multi-versioning (AVX-512, AVX2+FMA, and a
// portable baseline, picked once at load time by the CPU) and threaded with
// OpenMP over contiguous chunks. GCC 12 does not vectorize these loops (the
// branches of the optional 16-bit write): the clones are scalar code that
// differs in FMA use, so results differ in the last bits between CPUs
// (README, "Which CPU instructions the kernels use"). The 16-bit copy of the
// updated params is written in the same pass when mixed precision is on, so
// the update makes one trip through memory.
#pragma once

#include <cstdint>

namespace zero::optim {

// Where the updated params also go, besides the fp32 master: nowhere, as
// bf16/fp16, or rounded to bf16/fp16 but stored as fp32 (the params of a
// module that computes in fp32 over 16-bit storage: engine/precision.h).
enum class Out16 { None, BF16, FP16, BF16Widened, FP16Widened };

// Bytes per element `out16` holds for `kind`.
inline int out16_bytes(Out16 kind) { return kind == Out16::BF16Widened || kind == Out16::FP16Widened ? 4 : 2; }

struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;          // 1-based, after this update
  bool adam_w_mode = true;   // decoupled weight decay (AdamW) vs L2 into the grad
  bool bias_correction = true;
};

// p, m, v updated in place from grad * grad_scale (grad_scale folds the loss
// unscale and the clip coefficient into the read of the grad). If out16 is
// not null, the updated params are also written there as `kind` says.
void adam_update(float* p, const float* grad, float* m, float* v, int64_t n, const AdamHyper& h,
                 float grad_scale, void* out16 = nullptr, Out16 kind = Out16::None);

struct SgdHyper {
  float lr = 1e-3f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer starts as the first grad (as torch)
};

// momentum_buf may be null when momentum == 0.
void sgd_update(float* p, const float* grad, float* momentum_buf, int64_t n, const SgdHyper& h,
                float grad_scale, void* out16 = nullptr, Out16 kind = Out16::None);

struct LionHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float weight_decay = 0.0f;  // decoupled, as AdamW's
};

// Lion (Chen et al. 2023, DeepSpeed's FusedLion): p -= lr * sign(beta1 m +
// (1 - beta1) g), then m = beta2 m + (1 - beta2) g; exp_avg updated in place.
void lion_update(float* p, const float* grad, float* exp_avg, int64_t n, const LionHyper& h, float grad_scale,
                 void* out16 = nullptr, Out16 kind = Out16::None);

struct AdagradHyper {
  float lr = 1e-2f;
  float eps = 1e-10f;
  float weight_decay = 0.0f;  // L2 into the grad, as torch's Adagrad
};

// Adagrad (torch.optim.Adagrad without lr_decay): sum += g^2, p -= lr g /
// (sqrt(sum) + eps); the sum of squares (exp_avg_sq) updated in place.
void adagrad_update(float* p, const float* grad, float* sum_sq, int64_t n, const AdagradHyper& h, float grad_scale,
                    void* out16 = nullptr, Out16 kind = Out16::None);

struct LambHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // inside the update, as DeepSpeed's FusedLamb
  float max_coeff = 10.0f, min_coeff = 0.01f;  // the trust ratio's clamp
  int64_t step = 1;           // 1-based, after this update
  bool bias_correction = true;
};

// LAMB (You et al. 2020) in DeepSpeed's FusedLamb form, two passes because
// the trust ratio needs norms of whole params first. Pass 1 updates m, v
// from grad * grad_scale and adds sum p^2 and sum u^2 of these n elements
// (u = m / (sqrt(v) + eps) + wd p) into sums[0], sums[1].
void lamb_moments(const float* p, const float* grad, float* m, float* v, int64_t n, const LambHyper& h,
                  float grad_scale, double* sums);
// The trust ratio of a param from its summed squares: ||p|| / ||u||
// clamped to [min_coeff, max_coeff]; 1 when either norm is 0.
float lamb_trust_ratio(double sumsq_p, double sumsq_u, const LambHyper& h);
// Pass 2: p -= lr sqrt(1 - beta2^t) / (1 - beta1^t) * ratio * u (u
// recomputed from m, v, p), the 16-bit copy written in the same pass.
void lamb_apply(float* p, const float* m, const float* v, int64_t n, const LambHyper& h, float ratio,
                void* out16 = nullptr, Out16 kind = Out16::None);

struct MuonHyper {
  float lr = 0.02f;
  float momentum = 0.95f;
  float weight_decay = 0.0f;  // decoupled: p *= 1 - lr * wd
};

// Muon's element-wise halves (Jordan et al. 2024, as DeepSpeed's
// muon_update): around them, Newton-Schulz orthogonalises each whole
// matrix (engine/muon_step.cpp). Momentum: m = lerp(m, g, 1 - beta) with g
// = grad * grad_scale, and the Nesterov input lerp(g, m, beta) written to
// `nesterov` (the matrix's piece the orthogonalisation reads).
void muon_momentum(const float* grad, float* m, float* nesterov, int64_t n, const MuonHyper& h, float grad_scale);
// Apply: p = p * (1 - lr wd) - lr * update, the 16-bit copy in the same pass.
void muon_apply(float* p, const float* update, int64_t n, const MuonHyper& h, void* out16 = nullptr,
                Out16 kind = Out16::None);

// Casts n fp32 values to bf16/fp16 (round to nearest even), as the kernels do.
void downcast(const float* src, void* dst, int64_t n, Out16 kind);

// Threads the kernels use (default: OpenMP's). The engine sets libtorch's
// intra-op thread count, so the optimizer and the model's math share one setting.
void set_kernel_threads(int n);

// Which instruction set the kernels run with on this CPU ("avx512f", "avx2", "baseline").
const char* kernel_isa();

}  // namespace zero::optim
