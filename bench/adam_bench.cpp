// AdamW over a flat fp32 buffer: zero-cpp's fused kernel against libtorch's
// torch::optim::AdamW on the same tensor sizes, side by side in one run.
//
//   build/bench/bench_adam --benchmark_format=json
//
// Reported: items_per_second = params updated per second. The ratio of the
// two at equal size is the figure (the machine is shared and noisy).
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <omp.h>
#include <torch/optim/adamw.h>

#include "optim/kernels.h"

namespace {

void BM_ZeroAdamW(benchmark::State& state) {
  const int64_t n = state.range(0);
  zero::optim::set_kernel_threads(at::get_num_threads());  // the same threads torch's AdamW gets
  auto p = at::randn({n}), g = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
  zero::optim::AdamHyper h{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, true, true};
  for (auto _ : state) {
    zero::optim::adam_update(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n,
                             h, 1.0f);
    ++h.step;
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetLabel(zero::optim::kernel_isa());
}

void BM_ZeroAdamW_Bf16Out(benchmark::State& state) {
  const int64_t n = state.range(0);
  zero::optim::set_kernel_threads(at::get_num_threads());
  auto p = at::randn({n}), g = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
  auto out = at::empty({n}, at::kBFloat16);
  zero::optim::AdamHyper h;
  for (auto _ : state) {
    zero::optim::adam_update(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n,
                             h, 1.0f, out.data_ptr(), zero::optim::Out16::BF16);
    ++h.step;
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_TorchAdamW(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto p = at::randn({n}).set_requires_grad(true);
  p.mutable_grad() = at::randn({n});
  torch::optim::AdamW opt({p}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  for (auto _ : state) {
    opt.step();
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

}  // namespace

BENCHMARK(BM_ZeroAdamW)->Arg(10'000'000)->Arg(100'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ZeroAdamW_Bf16Out)->Arg(10'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TorchAdamW)->Arg(10'000'000)->Arg(100'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
