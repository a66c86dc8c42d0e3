#include "engine/precision.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>
#include <sstream>

#include <ATen/core/grad_mode.h>

namespace zero {

at::ScalarType to_scalar_type(DType d) {
  switch (d) {
    case DType::bf16: return at::kBFloat16;
    case DType::fp16: return at::kHalf;
    default: return at::kFloat;
  }
}

namespace {

// Big enough that the GEMM kernel, not dispatch, is timed (~1 ms in fp32 on
// one core); small enough to cost a few tens of ms even where 16-bit is slow.
constexpr int64_t kGemmSize = 256;

struct Measured {
  double fp32_ms, low_ms;
};

// Once per process and dtype: engines built later reuse it.
Measured measure(at::ScalarType low) {
  static std::mutex mu;
  static std::optional<Measured> bf16, fp16;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = low == at::kBFloat16 ? bf16 : fp16;
  if (!slot) slot = Measured{time_gemm_ms(at::kFloat, kGemmSize), time_gemm_ms(low, kGemmSize)};
  return *slot;
}

}  // namespace

double time_gemm_ms(at::ScalarType dtype, int64_t n) {
  at::NoGradGuard no_grad;
  const auto opts = at::TensorOptions().dtype(dtype);
  const at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  at::Tensor c = at::empty({n, n}, opts);
  at::mm_out(c, a, b);  // warm-up: first-call dispatch, page faults
  double best = 1e300;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

Precision resolve_precision(const Config& config, comm::Comm& comm, const comm::Group& dp, at::Device device) {
  Precision p;
  p.storage = to_scalar_type(config.param_dtype());
  if (p.storage == at::kFloat) {
    p.compute = at::kFloat;
  } else if (config.compute_dtype) {
    p.compute = to_scalar_type(*config.compute_dtype);
    p.why = "zero_cpp.compute_dtype";
  } else if (device.is_cuda()) {
    p.compute = p.storage;
    p.why = "a CUDA device computes 16-bit GEMMs natively";
  } else {
    // Rank 0 decides, so that noisy timings cannot split the ranks.
    at::Tensor choice = at::zeros({1}, at::kInt);
    std::ostringstream why;
    if (dp.rank() == 0) {
      const Measured m = measure(p.storage);
      choice.fill_(m.low_ms <= m.fp32_ms ? 1 : 0);
      why.precision(3);
      why << "measured on rank 0: " << kGemmSize << "^3 GEMM " << c10::toString(p.storage) << " " << m.low_ms
          << " ms vs fp32 " << m.fp32_ms << " ms";
    } else {
      why << "rank 0's measurement";
    }
    comm.broadcast(dp, choice, 0, "compute dtype")->wait();
    p.compute = choice.item<int>() == 1 ? p.storage : at::kFloat;
    p.why = why.str();
  }
  // Grads arrive from autograd in the compute dtype. 16-bit compute keeps
  // DeepSpeed's rules (grad_accum_dtype, else the params' dtype); fp32
  // compute accumulates and communicates them in fp32.
  p.grad = p.widened() ? at::kFloat : to_scalar_type(config.grad_accum_dtype.value_or(config.param_dtype()));
  const at::ScalarType wire = config.communication_data_type ? to_scalar_type(*config.communication_data_type) : p.grad;
  p.wire = wire;
  if (wire != p.grad && !(wire == at::kFloat && p.grad != at::kFloat))
    throw ConfigError(std::string("ds_config: communication_data_type = ") + to_string(*config.communication_data_type) +
                      " differs from the grad dtype (" + c10::toString(p.grad) + ")" +
                      (p.widened() ? ": params compute in fp32, so grads arrive and travel in fp32; set "
                                     "zero_cpp.compute_dtype to the 16-bit dtype for 16-bit grads"
                                   : "; zero-cpp communicates grads in their accumulation dtype, or in fp32"));
  return p;
}

}  // namespace zero
