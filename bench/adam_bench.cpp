// Each optimizer over a flat fp32 buffer: zero-cpp's fused kernel against
// the torch reference on the same tensor sizes, side by side in one run --
// torch::optim::AdamW and torch::optim::Adagrad, and Lion, LAMB and Muon
// as whole-tensor torch ops (what a user without fused ones runs; torch has
// none of them).
//
//   build/bench/bench_adam --benchmark_format=json
//
// Reported: items_per_second = params updated per second. The ratio of the
// two at equal size is the figure (the machine is shared and noisy).
#include <algorithm>

#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <omp.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adamw.h>

#include "engine/muon_step.h"
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

void BM_ZeroLion(benchmark::State& state) {
  const int64_t n = state.range(0);
  zero::optim::set_kernel_threads(at::get_num_threads());
  auto p = at::randn({n}), g = at::randn({n}), m = at::zeros({n});
  const zero::optim::LionHyper h{1e-4f, 0.9f, 0.999f, 0.01f};
  for (auto _ : state) {
    zero::optim::lion_update(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), n, h, 1.0f);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

// Lion in torch ops (lucidrains/lion-pytorch's step): decay, the sign of
// the interpolation, the momentum update.
void BM_TorchLion(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto p = at::randn({n}), g = at::randn({n}), m = at::zeros({n});
  for (auto _ : state) {
    p.mul_(1 - 1e-4 * 0.01);
    p.add_(m.mul(0.9).add_(g, 0.1).sign_(), -1e-4);
    m.mul_(0.999).add_(g, 0.001);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_ZeroAdagrad(benchmark::State& state) {
  const int64_t n = state.range(0);
  zero::optim::set_kernel_threads(at::get_num_threads());
  auto p = at::randn({n}), g = at::randn({n}), sum = at::zeros({n});
  const zero::optim::AdagradHyper h{1e-2f, 1e-10f, 0.01f};
  for (auto _ : state) {
    zero::optim::adagrad_update(p.data_ptr<float>(), g.data_ptr<float>(), sum.data_ptr<float>(), n, h, 1.0f);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_TorchAdagrad(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto p = at::randn({n}).set_requires_grad(true);
  p.mutable_grad() = at::randn({n});
  torch::optim::Adagrad opt({p}, torch::optim::AdagradOptions(1e-2).weight_decay(0.01));
  for (auto _ : state) {
    opt.step();
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

// LAMB over one param the size of the buffer: both passes (moments and
// norms, then the step with the trust ratio), as the engine runs them.
void BM_ZeroLamb(benchmark::State& state) {
  const int64_t n = state.range(0);
  zero::optim::set_kernel_threads(at::get_num_threads());
  auto p = at::randn({n}), g = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
  zero::optim::LambHyper h;
  h.weight_decay = 0.01f;
  for (auto _ : state) {
    double sums[2] = {0.0, 0.0};
    zero::optim::lamb_moments(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n,
                              h, 1.0f, sums);
    zero::optim::lamb_apply(p.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n, h,
                            zero::optim::lamb_trust_ratio(sums[0], sums[1], h));
    ++h.step;
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

// LAMB in torch ops (the reference tests/mr/optimizers_test.cpp checks against).
void BM_TorchLamb(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto p = at::randn({n}), g = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
  for (auto _ : state) {
    m.mul_(0.9).add_(g, 0.1);
    v.mul_(0.999).addcmul_(g, g, 0.001);
    const at::Tensor u = m / (v.sqrt() + 1e-8) + 0.01 * p;
    const double ratio = std::clamp(p.norm().item<double>() / u.norm().item<double>(), 0.01, 10.0);
    p.sub_(u * (1e-3 * ratio));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

// Muon on one [d, 4d] matrix (a transformer's MLP weight): the fused
// momentum, the Newton-Schulz orthogonalisation (at::matmul, fp32) and the
// fused apply, as one owner runs them; against the same step in torch ops.
void BM_ZeroMuon(benchmark::State& state) {
  const int64_t d = state.range(0), n = 4 * d * d;
  zero::optim::set_kernel_threads(at::get_num_threads());
  auto p = at::randn({n}), g = at::randn({n}), m = at::zeros({n}), in = at::empty({n});
  const zero::optim::MuonHyper h{0.02f, 0.95f, 0.01f};
  for (auto _ : state) {
    zero::optim::muon_momentum(g.data_ptr<float>(), m.data_ptr<float>(), in.data_ptr<float>(), n, h, 1.0f);
    const at::Tensor u = zero::muon_orthogonalize(in.view({d, 4 * d}), {d, 4 * d}).contiguous();
    zero::optim::muon_apply(p.data_ptr<float>(), u.data_ptr<float>(), n, h);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_TorchMuon(benchmark::State& state) {
  const int64_t d = state.range(0);
  auto p = at::randn({d, 4 * d}), g = at::randn({d, 4 * d}), m = at::zeros({d, 4 * d});
  for (auto _ : state) {
    m.lerp_(g, 0.05);
    at::Tensor x = g.lerp(m, 0.95);
    x = x / (x.norm() + 1e-7);
    for (int i = 0; i < 5; ++i) {
      const at::Tensor a = x.mm(x.t());
      x = 3.4445 * x + (-4.7750 * a + 2.0315 * a.mm(a)).mm(x);
    }
    p.mul_(1 - 0.02 * 0.01).sub_(x * 0.02);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * 4 * d * d);
}

}  // namespace

BENCHMARK(BM_ZeroAdamW)->Arg(10'000'000)->Arg(100'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ZeroAdamW_Bf16Out)->Arg(10'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TorchAdamW)->Arg(10'000'000)->Arg(100'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ZeroLion)->Arg(10'000'000)->Arg(100'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TorchLion)->Arg(10'000'000)->Arg(100'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ZeroAdagrad)->Arg(10'000'000)->Arg(100'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TorchAdagrad)->Arg(10'000'000)->Arg(100'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ZeroLamb)->Arg(10'000'000)->Arg(100'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TorchLamb)->Arg(10'000'000)->Arg(100'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ZeroMuon)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TorchMuon)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
