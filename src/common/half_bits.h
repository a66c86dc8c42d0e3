// fp32 <-> bf16/fp16 conversions on raw bits, bit-exact with ATen's
// c10::BFloat16 / c10::Half (round to nearest even; inf/NaN kept), for the
// torch-free loops (optimizer kernels, shared-memory reductions).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace zero::bits {

inline uint32_t of_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, NaN -> quiet NaN (as c10::BFloat16).
inline uint16_t to_bf16(float f) {
  const uint32_t u = of_float(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return f != f ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

inline float from_bf16(uint16_t h) { return to_float(static_cast<uint32_t>(h) << 16); }

// IEEE fp32 -> fp16, round to nearest even, branch-free (the classic
// scale-and-rebias method; inf/NaN preserved, overflow to inf).
inline uint16_t to_fp16(float f) {
  const float scale_to_inf = to_float(0x77800000u);   // 2^112
  const float scale_to_zero = to_float(0x08800000u);  // 2^-110
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = of_float(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = to_float((bias >> 1) + 0x07800000u) + base;
  const uint32_t b = of_float(base);
  const uint32_t nonsign = ((b >> 13) & 0x00007C00u) + (b & 0x00000FFFu);
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

// IEEE fp16 -> fp32, exact (the same method's inverse; subnormals included).
inline float from_fp16(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = to_float(0x7800000u);  // 2^-112
  const float normalized = to_float((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = 126u << 23;
  const float magic_bias = 0.5f;
  const float denormalized = to_float((two_w >> 17) | magic_mask) - magic_bias;
  const uint32_t denormalized_cutoff = 1u << 27;
  const uint32_t result =
      sign | (two_w < denormalized_cutoff ? of_float(denormalized) : of_float(normalized));
  return to_float(result);
}

}  // namespace zero::bits
