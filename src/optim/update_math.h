// The per-element optimizer updates, written once for the CPU kernels
// (optim/kernels.cpp) and the CUDA ones (optim/cuda/kernels.cu), so both
// compute the same formula in the same order.
#pragma once

#include <cmath>
#include <cstdint>

#include "optim/kernels.h"

#if defined(__CUDACC__)
#define ZERO_HOST_DEVICE __host__ __device__
#else
#define ZERO_HOST_DEVICE
#endif

namespace zero::optim {

// What one Adam step needs per element, computed once per step on the host.
struct AdamCoeffs {
  float b1, b2, eps, wd;
  float decay;         // 1 - lr * wd (AdamW's decoupled decay)
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float grad_scale;    // loss unscale times the clip coefficient
  bool adam_w_mode;
};

inline AdamCoeffs adam_coeffs(const AdamHyper& h, float grad_scale) {
  const double bc1 = h.bias_correction ? 1.0 - std::pow(static_cast<double>(h.beta1), h.step) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - std::pow(static_cast<double>(h.beta2), h.step) : 1.0;
  return {h.beta1, h.beta2, h.eps, h.weight_decay, 1.0f - h.lr * h.weight_decay,
          static_cast<float>(h.lr / bc1), static_cast<float>(1.0 / std::sqrt(bc2)), grad_scale, h.adam_w_mode};
}

// Updates m and v in place and returns the new param.
ZERO_HOST_DEVICE inline float adam_element(float param, float grad, float& m, float& v, const AdamCoeffs& c) {
  grad *= c.grad_scale;
  if (c.adam_w_mode) param *= c.decay;
  else grad += c.wd * param;
  const float mi = m * c.b1 + (1.0f - c.b1) * grad;
  const float vi = v * c.b2 + (1.0f - c.b2) * grad * grad;
  m = mi;
  v = vi;
  return param - c.step_size * (mi / (sqrtf(vi) * c.inv_sqrt_bc2 + c.eps));
}

// Updates the momentum buffer (when there is one) and returns the new param.
ZERO_HOST_DEVICE inline float sgd_element(float param, float grad, float* momentum, const SgdHyper& h,
                                          float grad_scale) {
  grad = grad * grad_scale + h.weight_decay * param;
  if (momentum) {
    const float b = h.first_step ? grad : *momentum * h.momentum + (1.0f - h.dampening) * grad;
    *momentum = b;
    grad = h.nesterov ? grad + h.momentum * b : b;
  }
  return param - h.lr * grad;
}

// Updates the momentum and returns the new param. sign(0) is 0, as torch's
// and DeepSpeed's: a zero interpolation leaves the param (but not its decay).
ZERO_HOST_DEVICE inline float lion_element(float param, float grad, float& m, const LionHyper& h,
                                           float grad_scale) {
  grad *= grad_scale;
  param *= 1.0f - h.lr * h.weight_decay;
  const float c = h.beta1 * m + (1.0f - h.beta1) * grad;
  // Branch-free: the signs of a random shard mispredict half the time.
  const float sign = static_cast<float>((c > 0.0f) - (c < 0.0f));
  m = h.beta2 * m + (1.0f - h.beta2) * grad;
  return param - h.lr * sign;
}

// Updates the sum of squared grads and returns the new param, in torch's
// order: the decayed grad squared into the sum, then lr * g / (sqrt + eps).
ZERO_HOST_DEVICE inline float adagrad_element(float param, float grad, float& sum, const AdagradHyper& h,
                                              float grad_scale) {
  grad = grad * grad_scale + h.weight_decay * param;
  const float s = sum + grad * grad;
  sum = s;
  return param - h.lr * grad / (sqrtf(s) + h.eps);
}

// LAMB's pass 1 per element: m and v (no bias correction: it is in the
// step size, as DeepSpeed's FusedLamb). Returns the update direction u.
ZERO_HOST_DEVICE inline float lamb_moments_element(float param, float grad, float& m, float& v, const LambHyper& h,
                                                   float grad_scale) {
  grad *= grad_scale;
  const float mi = h.beta1 * m + (1.0f - h.beta1) * grad;
  const float vi = h.beta2 * v + (1.0f - h.beta2) * grad * grad;
  m = mi;
  v = vi;
  return mi / (sqrtf(vi) + h.eps) + h.weight_decay * param;
}

// LAMB's update direction from the stored moments (pass 2 recomputes it
// rather than storing it: one buffer fewer, the same float ops).
ZERO_HOST_DEVICE inline float lamb_direction(float param, float m, float v, const LambHyper& h) {
  return m / (sqrtf(v) + h.eps) + h.weight_decay * param;
}

inline float lamb_step_size(const LambHyper& h) {
  if (!h.bias_correction) return h.lr;
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), h.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), h.step);
  return static_cast<float>(h.lr * std::sqrt(bc2) / bc1);
}

// torch's lerp (start + w (end - start), or end - (end - start)(1 - w)
// for w >= 0.5), so Muon's momentum rounds as DeepSpeed's lerp_ does.
ZERO_HOST_DEVICE inline float torch_lerp(float start, float end, float w) {
  const float diff = end - start;
  return w < 0.5f ? start + w * diff : end - diff * (1.0f - w);
}

// Muon's momentum per element: m = lerp(m, g, 1 - beta); returns the
// Nesterov input lerp(g, m, beta).
ZERO_HOST_DEVICE inline float muon_momentum_element(float grad, float& m, const MuonHyper& h, float grad_scale) {
  grad *= grad_scale;
  const float mi = torch_lerp(m, grad, 1.0f - h.momentum);
  m = mi;
  return torch_lerp(grad, mi, h.momentum);
}

// Muon's apply per element (DeepSpeed's order: decay, then the step).
ZERO_HOST_DEVICE inline float muon_apply_element(float param, float update, const MuonHyper& h) {
  return param * (1.0f - h.lr * h.weight_decay) - h.lr * update;
}

}  // namespace zero::optim
