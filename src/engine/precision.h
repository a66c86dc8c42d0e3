// Mixed precision as the engine runs it, in the spirit of FSDP2's
// MixedPrecisionPolicy: with bf16/fp16 enabled the params are stored at rest
// and communicated in 16 bits, and the module sees them in the compute dtype
// -- the 16-bit one where this CPU multiplies it fast, fp32 where it does not
// (measured, or zero_cpp.compute_dtype). With fp32 compute a stage-3 gather
// widens the 16-bit shards into the unit's fp32 buffer as they land, so
// stock modules (torch::nn::Linear, ...) train unchanged.
#pragma once

#include <string>

#include <ATen/ATen.h>

#include "zero/comm.h"
#include "zero/config.h"

namespace zero {

struct Precision {
  at::ScalarType storage = at::kFloat;  // params at rest and on the wire (the config's dtype)
  at::ScalarType compute = at::kFloat;  // the module's params in forward/backward: storage or fp32
  at::ScalarType grad = at::kFloat;     // grads as autograd accumulates them
  at::ScalarType wire = at::kFloat;     // grads on the wire: `grad`, or fp32 (communication_data_type)
  std::string why;                      // how `compute` was chosen, for describe()

  // 16-bit at rest, fp32 in the module.
  bool widened() const { return compute != storage; }
};

// Resolves the config's precision. With bf16/fp16 and compute_dtype "auto",
// rank 0 of `dp` times the GEMMs (once per process) and every rank takes its
// answer (one broadcast), so all ranks compute alike. Throws ConfigError for
// a communication_data_type the resolved grads cannot travel in (fp32 for
// 16-bit grads is taken: they are widened for the reduction, as DeepSpeed
// does; a 16-bit wire for fp32 grads, or the other 16-bit dtype, is not).
// On a CUDA device "auto" is the 16-bit dtype (tensor cores), unmeasured.
Precision resolve_precision(const Config& config, comm::Comm& comm, const comm::Group& dp,
                            at::Device device = at::kCPU);

// Milliseconds for one [n x n] @ [n x n] GEMM through libtorch in `dtype`
// (the best of a few runs, after a warm-up).
double time_gemm_ms(at::ScalarType dtype, int64_t n);

// The tensor dtype of a config dtype.
at::ScalarType to_scalar_type(DType d);

}  // namespace zero
