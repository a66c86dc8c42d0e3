// The local half of the shared-memory reductions: sum N ranks' copies of a
// chunk in rank order, accumulating in fp32 (fp64 for doubles), optionally
// divide by N, and write the result in the output's type. Rank order and
// one rounding at the end make the result identical on every rank and
// bit-identical to the Gloo fallback's (which sums received copies the same
// way). No torch.
#pragma once

#include <cstdint>

namespace zero::comm::shm {

enum class Elem : uint8_t { F32, F64, BF16, F16, Bytes };

inline int64_t elem_size(Elem e) {
  switch (e) {
    case Elem::F64: return 8;
    case Elem::F32: return 4;
    case Elem::BF16:
    case Elem::F16: return 2;
    default: return 1;
  }
}

// out[i] = (srcs[0][i] + srcs[1][i] + ... + srcs[n_src-1][i]) [/ n_src]
// for i < count. Inputs share type `in`; `out` is `in`, or F32 for a 16-bit
// `in`. `out` may be one of the sources, if it has their type: each block
// of every source is read before that block of `out` is written.
void sum_in_rank_order(const void* const* srcs, int n_src, Elem in, void* out, Elem out_type, int64_t count,
                       bool average);

}  // namespace zero::comm::shm
