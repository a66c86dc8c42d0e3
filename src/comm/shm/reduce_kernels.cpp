#include "comm/shm/reduce_kernels.h"

#include <stdexcept>

#include "common/half_bits.h"

namespace zero::comm::shm {

namespace {

// Elements per block: the fp32 accumulator stays in L1 while the sources stream.
constexpr int64_t kBlock = 2048;

template <typename T>
struct Load;
template <>
struct Load<float> {
  static float at(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
};
template <>
struct Load<double> {
  static double at(const void* p, int64_t i) { return static_cast<const double*>(p)[i]; }
};
struct LoadBf16 {
  static float at(const void* p, int64_t i) { return bits::from_bf16(static_cast<const uint16_t*>(p)[i]); }
};
struct LoadF16 {
  static float at(const void* p, int64_t i) { return bits::from_fp16(static_cast<const uint16_t*>(p)[i]); }
};

#define ZERO_CLONES __attribute__((target_clones("avx512f", "arch=haswell", "default")))

// acc = src0 + src1 + ... in rank order, one block at a time.
template <typename Acc, typename In>
ZERO_CLONES void accumulate_block(const void* const* srcs, int n_src, int64_t begin, int64_t n, Acc* __restrict acc) {
  for (int64_t i = 0; i < n; ++i) acc[i] = In::at(srcs[0], begin + i);
  for (int s = 1; s < n_src; ++s)
    for (int64_t i = 0; i < n; ++i) acc[i] += In::at(srcs[s], begin + i);
}

template <typename Acc, typename In>
void reduce(const void* const* srcs, int n_src, void* out, Elem out_type, int64_t count, bool average) {
  alignas(64) Acc acc[kBlock];
  const Acc divisor = static_cast<Acc>(n_src);
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = count - begin < kBlock ? count - begin : kBlock;
    accumulate_block<Acc, In>(srcs, n_src, begin, n, acc);
    // Division, not a reciprocal multiply: what the fallback's div_ computes.
    if (average && n_src > 1)
      for (int64_t i = 0; i < n; ++i) acc[i] /= divisor;
    switch (out_type) {
      case Elem::F64:
      case Elem::F32:
        for (int64_t i = 0; i < n; ++i) static_cast<Acc*>(out)[begin + i] = acc[i];
        break;
      case Elem::BF16:
        for (int64_t i = 0; i < n; ++i)
          static_cast<uint16_t*>(out)[begin + i] = bits::to_bf16(static_cast<float>(acc[i]));
        break;
      case Elem::F16:
        for (int64_t i = 0; i < n; ++i)
          static_cast<uint16_t*>(out)[begin + i] = bits::to_fp16(static_cast<float>(acc[i]));
        break;
      default:
        throw std::logic_error("shm reduce: bad output type");
    }
  }
}

}  // namespace

void sum_in_rank_order(const void* const* srcs, int n_src, Elem in, void* out, Elem out_type, int64_t count,
                       bool average) {
  switch (in) {
    case Elem::F32: return reduce<float, Load<float>>(srcs, n_src, out, out_type, count, average);
    case Elem::F64: return reduce<double, Load<double>>(srcs, n_src, out, out_type, count, average);
    case Elem::BF16: return reduce<float, LoadBf16>(srcs, n_src, out, out_type, count, average);
    case Elem::F16: return reduce<float, LoadF16>(srcs, n_src, out, out_type, count, average);
    default: throw std::logic_error("shm reduce: bytes cannot be summed");
  }
}

}  // namespace zero::comm::shm
