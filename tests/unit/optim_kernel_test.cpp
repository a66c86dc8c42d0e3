// The flat optimizer kernels against libtorch's own optimizers run in fp64
// (the oracle users know, with rounding far below fp32's), within a forward
// error bound derived from the fp32 operations the kernel performs; and the
// fused 16-bit write against ATen's casts (bit-exact).
//
// Why a derived bound and not an absolute one: the kernel is compiled for
// several ISAs (kernels.cpp: target_clones) and the AVX2/AVX-512 clones
// contract a*b+c into FMAs, which round once instead of twice; torch's own
// fp32 kernels differ between AVX2 and AVX-512 too. A fixed 1e-6 held on
// one CPU and not on another. The bound below holds for any order of the
// same roundings, and a wrong formula still exceeds it by orders of
// magnitude (OptimizerBounds.CatchAWrongHyperparameter).
//
// Derivation (first order in u = 2^-24, fp32's unit roundoff: each rounded
// op returns x(1 + d), |d| <= u). The test recomputes, in fp64 along the
// exact trajectory, the magnitude of every quantity the kernel rounds at
// step t: P = |p_{t-1}|, and the update's size D_t with grads replaced by
// their absolute values (M_t = b1 M_{t-1} + (1-b1)|g|; for SGD the same for
// the momentum buffer), so cancellation inside m or the buffer cannot hide
// a rounding. A rounded op errs by at most u times its result; errors that
// m, v or the buffer carry decay by b1, b2, momentum < 1, so after t steps
// they are at most t times one step's. Summing over steps:
//     |ours - exact| <= u * sum_t (k_p * P_t + k_d(t) * D_t)
// with k_p, k_d counted per kernel below. The hyperparameters given to the
// oracle are the kernel's fp32 values, so both compute the same function.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "optim/kernels.h"
#ifdef ZERO_HAVE_CUDA
#include <torch/cuda.h>

#include "optim/cuda/kernels.h"
#endif

namespace {

using namespace zero::optim;

// Where the kernels under test run: the CPU, or (tests at the end, on a
// machine with a GPU) the CUDA kernels, held to the same bounds.
enum class Where { Cpu, Cuda };
Where g_where = Where::Cpu;

// One step of the kernel under test on CPU tensors; on CUDA, through device
// copies of them and back.
void adam_step(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, const AdamHyper& h, float scale) {
  if (g_where == Where::Cpu) {
    adam_update(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), p.numel(), h,
                scale);
    return;
  }
#ifdef ZERO_HAVE_CUDA
  auto pd = p.cuda(), gd = g.cuda(), md = m.cuda(), vd = v.cuda();
  cuda::adam_update(pd.data_ptr<float>(), gd.data_ptr<float>(), md.data_ptr<float>(), vd.data_ptr<float>(),
                    p.numel(), h, scale, nullptr, Out16::None, nullptr);
  p.copy_(pd), m.copy_(md), v.copy_(vd);
#endif
}

void sgd_step(at::Tensor& p, const at::Tensor& g, at::Tensor& buf, const SgdHyper& h) {
  if (g_where == Where::Cpu) {
    sgd_update(p.data_ptr<float>(), g.data_ptr<float>(), buf.data_ptr<float>(), p.numel(), h, 1.0f);
    return;
  }
#ifdef ZERO_HAVE_CUDA
  auto pd = p.cuda(), gd = g.cuda(), bd = buf.cuda();
  cuda::sgd_update(pd.data_ptr<float>(), gd.data_ptr<float>(), bd.data_ptr<float>(), p.numel(), h, 1.0f, nullptr,
                   Out16::None, nullptr);
  p.copy_(pd), buf.copy_(bd);
#endif
}

void lion_step(at::Tensor& p, const at::Tensor& g, at::Tensor& m, const LionHyper& h) {
  if (g_where == Where::Cpu) {
    lion_update(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), p.numel(), h, 1.0f);
    return;
  }
#ifdef ZERO_HAVE_CUDA
  auto pd = p.cuda(), gd = g.cuda(), md = m.cuda();
  cuda::lion_update(pd.data_ptr<float>(), gd.data_ptr<float>(), md.data_ptr<float>(), p.numel(), h, 1.0f, nullptr,
                    Out16::None, nullptr);
  p.copy_(pd), m.copy_(md);
#endif
}

void adagrad_step(at::Tensor& p, const at::Tensor& g, at::Tensor& sum, const AdagradHyper& h) {
  if (g_where == Where::Cpu) {
    adagrad_update(p.data_ptr<float>(), g.data_ptr<float>(), sum.data_ptr<float>(), p.numel(), h, 1.0f);
    return;
  }
#ifdef ZERO_HAVE_CUDA
  auto pd = p.cuda(), gd = g.cuda(), sd = sum.cuda();
  cuda::adagrad_update(pd.data_ptr<float>(), gd.data_ptr<float>(), sd.data_ptr<float>(), p.numel(), h, 1.0f,
                       nullptr, Out16::None, nullptr);
  p.copy_(pd), sum.copy_(sd);
#endif
}

constexpr double kU = 1.0 / (1 << 24);

// The same start and grads for both sides; fp32 values, so the fp64 oracle
// sees them exactly. Grad sizes vary by step.
struct Trajectory {
  at::Tensor p0;
  std::vector<at::Tensor> grads;
};

Trajectory make_trajectory(int64_t n, int steps) {
  at::manual_seed(0);
  Trajectory t{at::randn({n}), {}};
  for (int s = 1; s <= steps; ++s) t.grads.push_back(at::randn({n}) * (s % 3 + 0.5));
  return t;
}

// Largest |ours - exact| / bound over the elements: <= 1 is within the bound.
double worst_ratio(const at::Tensor& ours, const at::Tensor& exact, const at::Tensor& bound) {
  return ((ours.to(at::kDouble) - exact).abs() / bound).max().item<double>();
}

// Adam/AdamW: `kernel` is what our kernel is given, `h` what the oracle is
// (equal, except when a test plants a wrong hyperparameter).
double adam_ratio(int64_t n, int steps, const AdamHyper& h, AdamHyper kernel) {
  const auto tr = make_trajectory(n, steps);
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay;
  auto exact = tr.p0.to(at::kDouble).set_requires_grad(true);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (h.adam_w_mode)
    opt = std::make_unique<torch::optim::AdamW>(
        std::vector<at::Tensor>{exact}, torch::optim::AdamWOptions(lr).betas({b1, b2}).eps(eps).weight_decay(wd));
  else
    opt = std::make_unique<torch::optim::Adam>(
        std::vector<at::Tensor>{exact}, torch::optim::AdamOptions(lr).betas({b1, b2}).eps(eps).weight_decay(wd));
  auto p = tr.p0.clone(), m = at::zeros({n}), v = at::zeros({n});
  auto M = at::zeros({n}, at::kDouble), V = at::zeros({n}, at::kDouble), bound = at::zeros({n}, at::kDouble);
  auto growth = at::ones({n}, at::kDouble);
  for (int t = 1; t <= steps; ++t) {
    const auto& g = tr.grads[t - 1];
    const auto prev = exact.detach().clone();
    kernel.step = t;
    adam_step(p, g, m, v, kernel, 1.0f);
    exact.mutable_grad() = g.to(at::kDouble);
    opt->step();

    const auto g64 = g.to(at::kDouble);
    const auto G = h.adam_w_mode ? g64.abs() : g64.abs() + wd * prev.abs();  // L2: grad + wd p
    const auto geff = h.adam_w_mode ? g64 : g64 + wd * prev;
    M = b1 * M + (1 - b1) * G;
    V = b2 * V + (1 - b2) * geff * geff;
    const double step_size = lr / (1 - std::pow(b1, t));
    const auto denom = V.sqrt() / std::sqrt(1 - std::pow(b2, t)) + eps;
    const auto D = step_size * M / denom;
    // Roundings per step, kernels.cpp adam_chunk:
    //  AdamW, P terms: decay = 1 - lr*wd (2 roundings, ~1u of decay), p*decay
    //    (1), p - update (1): 3, and a hair for lr*wd's rounding: k_p = 4.
    //  Update, relative to D: m gets grad*scale, b1*m, (1-b1)*grad, the sum
    //    (4u of M per step, so 4t after t steps); v gets those and grad*grad
    //    (6t, halved by the sqrt: 3t, +1 for the sqrt); *inv_sqrt_bc2 and its
    //    own rounding (2), +eps (1), the division (1), *step_size and its own
    //    rounding (2), and the update's share of the last subtraction (1):
    //    4t + 3t + 8 = 7t + 8.
    //  Adam (L2): grad + wd*p adds 2 roundings to grad (3u of G), which m
    //    carries (+2t) and v's square doubles (+4t, halved: +2t): 11t + 8;
    //    no decay, so k_p = 1 (the subtraction).
    const double k_p = h.adam_w_mode ? 4 : 1, k_d = h.adam_w_mode ? 7.0 * t + 8 : 11.0 * t + 8;
    bound += kU * (k_p * prev.abs() + k_d * D);
    // L2 only: an error e in p stays in p and enters every later grad as
    // wd*e. Through m (weights summing to <= 1) it moves this step's update by
    // at most step_size*wd*e/denom; through v, sqrt(v_hat) by at most wd*e
    // (Cauchy-Schwarz over v's weights), so the update by D*wd*e/denom. Each
    // step thus grows the error by at most the factor below.
    if (!h.adam_w_mode) growth *= 1 + step_size * wd / denom * (1 + M / denom);
  }
  bound *= growth;
  return worst_ratio(p, exact.detach(), bound);
}

double adam_ratio(int64_t n, int steps, const AdamHyper& h) { return adam_ratio(n, steps, h, h); }

double sgd_ratio(int64_t n, int steps, const SgdHyper& h, SgdHyper kernel) {
  const auto tr = make_trajectory(n, steps);
  const double lr = h.lr, mom = h.momentum, wd = h.weight_decay;
  auto exact = tr.p0.to(at::kDouble).set_requires_grad(true);
  torch::optim::SGD opt({exact}, torch::optim::SGDOptions(lr).momentum(mom).weight_decay(wd).nesterov(h.nesterov));
  auto p = tr.p0.clone(), buf = at::zeros({n});
  auto B = at::zeros({n}, at::kDouble), bound = at::zeros({n}, at::kDouble);
  for (int t = 1; t <= steps; ++t) {
    const auto& g = tr.grads[t - 1];
    const auto prev = exact.detach().clone();
    kernel.first_step = t == 1;
    sgd_step(p, g, buf, kernel);
    exact.mutable_grad() = g.to(at::kDouble);
    opt.step();

    const auto G = g.to(at::kDouble).abs() + wd * prev.abs();
    B = t == 1 ? G : mom * B + G;
    const auto U = h.nesterov ? G + mom * B : B;
    // Roundings per step, kernels.cpp sgd_chunk, relative to lr*U: grad =
    // g*scale + wd*p (3u of G); buf = buf*mom + grad adds 2 (5u of B per
    // step, so 5t); nesterov's grad + mom*buf adds grad's 3 and its own 2;
    // then lr*grad (1) and the update's share of p - lr*grad (1):
    // k_d = 5t + 2, or 5t + 7 with nesterov. P terms: the subtraction, k_p = 1.
    const double k_d = h.nesterov ? 5.0 * t + 7 : 5.0 * t + 2;
    bound += kU * (prev.abs() + k_d * lr * U);
  }
  // An error e in p stays in p and enters every later grad as wd*e; the
  // buffer (weights summing to 1/(1-mom)) and nesterov's extra mom*buf turn
  // that into at most lr*wd*(1+mom)/(1-mom)*e more per step.
  bound *= std::pow(1 + lr * wd * (1 + mom) / (1 - mom), steps);
  return worst_ratio(p, exact.detach(), bound);
}

double sgd_ratio(int64_t n, int steps, const SgdHyper& h) { return sgd_ratio(n, steps, h, h); }

// Lion against its update written in fp64 torch (torch has no Lion).
// Roundings per step, kernels.cpp lion_chunk: decay = 1 - lr*wd and p*decay
// (~3u of P, +1 for lr*wd's rounding), p - step (1u of P, and of lr): the
// step itself is exactly +-lr. The sign is exact where the fp64
// interpolation c is farther from 0 than its fp32 error: c = b1 m + (1-b1) g
// rounds 3 times and m carries 3u of M per step (M = b2 M + (1-b2)|g|), so
// |c - c32| <= u (3t + 3) C with C = b1 M + (1-b1)|g|. An element whose |c|
// is within 4x that at some step may take the other sign: it is left out
// from then on (and counted: a handful of a random start's elements).
double lion_ratio(int64_t n, int steps, const LionHyper& h, LionHyper kernel, int64_t* ambiguous = nullptr) {
  const auto tr = make_trajectory(n, steps);
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2, wd = h.weight_decay;
  auto exact = tr.p0.to(at::kDouble), m64 = at::zeros({n}, at::kDouble);
  auto p = tr.p0.clone(), m = at::zeros({n});
  auto M = at::zeros({n}, at::kDouble), bound = at::zeros({n}, at::kDouble);
  auto unsure = at::zeros({n}, at::kBool);
  for (int t = 1; t <= steps; ++t) {
    const auto& g = tr.grads[t - 1];
    const auto g64 = g.to(at::kDouble);
    lion_step(p, g, m, kernel);
    const auto prev = exact.clone();
    const auto c = b1 * m64 + (1 - b1) * g64;
    const auto C = b1 * M + (1 - b1) * g64.abs();
    unsure |= c.abs() <= 4 * kU * (3.0 * t + 3) * C;
    exact = exact * (1 - lr * wd) - lr * c.sign();
    m64 = b2 * m64 + (1 - b2) * g64;
    M = b2 * M + (1 - b2) * g64.abs();
    bound += kU * (5 * prev.abs() + lr);
  }
  if (ambiguous) *ambiguous = unsure.sum().item<int64_t>();
  const auto keep = unsure.logical_not();
  return worst_ratio(p.masked_select(keep), exact.masked_select(keep), bound.masked_select(keep));
}

double lion_ratio(int64_t n, int steps, const LionHyper& h) { return lion_ratio(n, steps, h, h); }

// Adagrad against torch's Adagrad in fp64. Roundings per step, kernels.cpp
// adagrad_chunk, relative to D = lr G / sqrt(S) (G = |g| + wd |p|, S the sum
// of G^2): grad = g*scale + wd*p (3u of G); grad*grad and the sum (2u, and
// the square doubles grad's 3: 8u of S per step, so 8t after t steps), the
// sqrt halves it (4t) and adds 1, +eps (1), lr*grad (1, and grad's 3), the
// division (1), the update's share of p - update (1): k_d = 4t + 8; k_p = 1.
// L2 decay feeds an error e in p back as wd e in the grad, moving the update
// by at most 2 lr wd e / sqrt(S) (the grad's share and the sum's, since
// grad^2 <= S): the growth factor below.
double adagrad_ratio(int64_t n, int steps, const AdagradHyper& h, AdagradHyper kernel) {
  const auto tr = make_trajectory(n, steps);
  const double lr = h.lr, eps = h.eps, wd = h.weight_decay;
  auto exact = tr.p0.to(at::kDouble).set_requires_grad(true);
  torch::optim::Adagrad opt({exact}, torch::optim::AdagradOptions(lr).eps(eps).weight_decay(wd));
  auto p = tr.p0.clone(), sum = at::zeros({n});
  auto S = at::zeros({n}, at::kDouble), bound = at::zeros({n}, at::kDouble);
  auto growth = at::ones({n}, at::kDouble);
  for (int t = 1; t <= steps; ++t) {
    const auto& g = tr.grads[t - 1];
    const auto prev = exact.detach().clone();
    adagrad_step(p, g, sum, kernel);
    exact.mutable_grad() = g.to(at::kDouble);
    opt.step();
    const auto G = g.to(at::kDouble).abs() + wd * prev.abs();
    S = S + G * G;
    const auto denom = S.sqrt() + eps;
    bound += kU * (prev.abs() + (4.0 * t + 8) * lr * G / denom);
    growth *= 1 + 2 * lr * wd / denom;
  }
  bound *= growth;
  return worst_ratio(p, exact.detach(), bound);
}

double adagrad_ratio(int64_t n, int steps, const AdagradHyper& h) { return adagrad_ratio(n, steps, h, h); }

// LAMB's two passes over one param against the same update in fp64
// torch. Roundings per step, relative to D = step_size * ratio * |u| (U =
// |m|/(sqrt(v)+eps) + wd|p| on absolute grads, as Adam's bound): m and v
// as Adam's (4t and 3t + 1 for the sqrt), +eps, the division, wd*p and the
// sum (4), the ratio from fp64 sums of fp32 squares (~2 u: the squares and
// the sqrt's), step_size * ratio and its product with u (2), the share of
// p - step (1): k_d = 7t + 12; k_p = 1. The ratio also carries an error in
// p into every later step: a relative 1 + u per step, far below the rest.
double lamb_ratio(int64_t n, int steps, const LambHyper& h, LambHyper kernel) {
  const auto tr = make_trajectory(n, steps);
  const double b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay;
  auto exact = tr.p0.to(at::kDouble), m64 = at::zeros({n}, at::kDouble), v64 = at::zeros({n}, at::kDouble);
  auto p = tr.p0.clone(), m = at::zeros({n}), v = at::zeros({n});
  auto M = at::zeros({n}, at::kDouble), bound = at::zeros({n}, at::kDouble);
  for (int t = 1; t <= steps; ++t) {
    const auto& g = tr.grads[t - 1];
    const auto g64 = g.to(at::kDouble);
    kernel.step = t;
    double sums[2] = {0.0, 0.0};
    lamb_moments(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n, kernel, 1.0f,
                 sums);
    lamb_apply(p.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n, kernel,
               lamb_trust_ratio(sums[0], sums[1], kernel));
    const auto prev = exact.clone();
    m64 = b1 * m64 + (1 - b1) * g64;
    v64 = b2 * v64 + (1 - b2) * g64 * g64;
    M = b1 * M + (1 - b1) * g64.abs();
    const auto u = m64 / (v64.sqrt() + eps) + wd * exact;
    const double ratio = std::clamp(exact.norm().item<double>() / u.norm().item<double>(),
                                    static_cast<double>(h.min_coeff), static_cast<double>(h.max_coeff));
    const double step_size = h.lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    exact = exact - step_size * ratio * u;
    const auto D = step_size * ratio * (M / (v64.sqrt() + eps) + wd * prev.abs());
    bound += kU * (prev.abs() + (7.0 * t + 12) * D);
  }
  return worst_ratio(p, exact, bound);
}

const LambHyper kLamb{1e-2f, 0.9f, 0.999f, 1e-6f, 0.1f, 10.0f, 0.01f, 1, true};

const LionHyper kLion{1e-2f, 0.9f, 0.99f, 0.1f};
const AdagradHyper kAdagrad{1e-1f, 1e-10f, 0.05f};

const AdamHyper kAdamW{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, true, true};
const AdamHyper kAdamL2{1e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, 1, false, true};
SgdHyper sgd_hyper(bool nesterov) { return {0.1f, 0.9f, 0.0f, 0.01f, nesterov, false}; }

TEST(AdamKernel, MatchesTorchAdamW) {
  // Sizes around the chunk and vector widths.
  for (int64_t n : {1, 15, 17, 1000, (1 << 16) + 3, 300001}) EXPECT_LE(adam_ratio(n, 10, kAdamW), 1.0) << "n = " << n;
}

TEST(AdamKernel, L2ModeMatchesTorchAdam) { EXPECT_LE(adam_ratio(4099, 10, kAdamL2), 1.0); }

TEST(AdamKernel, GradScaleIsAppliedToTheGrad) {
  // Updating with (2g, scale 0.5) equals updating with g.
  const int64_t n = 777;
  at::manual_seed(1);
  auto p = at::randn({n}), g = at::randn({n});
  auto p2 = p.clone(), g2 = g * 2;
  auto m = at::zeros({n}), v = at::zeros({n}), m2 = at::zeros({n}), v2 = at::zeros({n});
  AdamHyper h;
  adam_update(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n, h, 1.0f);
  adam_update(p2.data_ptr<float>(), g2.data_ptr<float>(), m2.data_ptr<float>(), v2.data_ptr<float>(), n, h, 0.5f);
  EXPECT_TRUE(p.equal(p2));
}

TEST(SgdKernel, MatchesTorchSgd) {
  for (bool nesterov : {false, true}) EXPECT_LE(sgd_ratio(70001, 6, sgd_hyper(nesterov)), 1.0) << "nesterov " << nesterov;
}

TEST(LionKernel, MatchesThePapersUpdate) {
  for (int64_t n : {1, 17, (1 << 16) + 3, 300001}) {
    int64_t ambiguous = 0;
    EXPECT_LE(lion_ratio(n, 10, kLion, kLion, &ambiguous), 1.0) << "n = " << n;
    EXPECT_LE(ambiguous, n / 10000 + 1) << "n = " << n;
  }
}

TEST(LambKernel, MatchesTheFusedLambUpdate) {
  for (int64_t n : {1, 17, (1 << 16) + 3, 300001}) EXPECT_LE(lamb_ratio(n, 10, kLamb, kLamb), 1.0) << "n = " << n;
  auto wrong = kLamb;
  wrong.weight_decay *= 1.01f;
  EXPECT_GT(lamb_ratio(4099, 10, kLamb, wrong), 10.0) << "weight decay 1% off";
  wrong = kLamb;
  wrong.beta1 = 0.909f;
  EXPECT_GT(lamb_ratio(4099, 10, kLamb, wrong), 10.0) << "beta1 1% off";
  wrong = kLamb;
  wrong.bias_correction = false;
  EXPECT_GT(lamb_ratio(4099, 10, kLamb, wrong), 10.0) << "no bias correction";
}

TEST(AdagradKernel, MatchesTorchAdagrad) {
  for (int64_t n : {1, 17, (1 << 16) + 3, 300001}) EXPECT_LE(adagrad_ratio(n, 10, kAdagrad), 1.0) << "n = " << n;
}

// The fused 16-bit write equals a separate cast of the updated params.
TEST(LionAndAdagradKernels, WriteTheRoundedParamsInTheSamePass) {
  const int64_t n = (1 << 16) + 5;
  at::manual_seed(5);
  for (auto [kind, dt] : {std::pair{Out16::BF16, at::kBFloat16}, std::pair{Out16::FP16Widened, at::kHalf}}) {
    auto p = at::randn({n}), g = at::randn({n}), state = at::zeros({n});
    auto out = kind == Out16::BF16 ? at::empty({n}, at::kBFloat16) : at::empty({n});
    lion_update(p.data_ptr<float>(), g.data_ptr<float>(), state.data_ptr<float>(), n, kLion, 1.0f, out.data_ptr(),
                kind);
    EXPECT_TRUE(out.to(at::kFloat).equal(p.to(dt).to(at::kFloat)));
    state.zero_();  // a sum of squares, not Lion's signed momentum
    adagrad_update(p.data_ptr<float>(), g.data_ptr<float>(), state.data_ptr<float>(), n, kAdagrad, 0.5f,
                   out.data_ptr(), kind);
    EXPECT_TRUE(out.to(at::kFloat).equal(p.to(dt).to(at::kFloat)));
  }
}

// The bounds are loose enough for any rounding order yet far below a real
// mistake: a hyperparameter off by 1% (what a wrong default or a dropped
// bias correction looks like, or smaller) exceeds them.
TEST(OptimizerBounds, CatchAWrongHyperparameter) {
  const int64_t n = 4099;
  auto adamw = kAdamW;
  adamw.weight_decay *= 1.01f;
  EXPECT_GT(adam_ratio(n, 10, kAdamW, adamw), 10.0) << "weight decay 1% off";
  adamw = kAdamW;
  adamw.beta1 = 0.909f;
  EXPECT_GT(adam_ratio(n, 10, kAdamW, adamw), 10.0) << "beta1 1% off";
  adamw = kAdamW;
  adamw.bias_correction = false;
  EXPECT_GT(adam_ratio(n, 10, kAdamW, adamw), 10.0) << "no bias correction";
  auto l2 = kAdamL2;
  l2.adam_w_mode = true;
  EXPECT_GT(adam_ratio(n, 10, kAdamL2, l2), 10.0) << "decoupled instead of L2 weight decay";
  for (bool nesterov : {false, true}) {
    auto sgd = sgd_hyper(nesterov);
    sgd.momentum = 0.909f;
    EXPECT_GT(sgd_ratio(n, 6, sgd_hyper(nesterov), sgd), 10.0) << "momentum 1% off, nesterov " << nesterov;
    sgd = sgd_hyper(nesterov);
    sgd.weight_decay *= 1.01f;
    EXPECT_GT(sgd_ratio(n, 6, sgd_hyper(nesterov), sgd), 10.0) << "weight decay 1% off, nesterov " << nesterov;
  }
  auto lion = kLion;
  lion.weight_decay *= 1.01f;
  EXPECT_GT(lion_ratio(n, 10, kLion, lion), 10.0) << "Lion weight decay 1% off";
  lion = kLion;
  lion.beta1 = 0.5f;  // the sign hides small changes of beta1: a large one flips some
  EXPECT_GT(lion_ratio(n, 10, kLion, lion), 10.0) << "Lion beta1 off";
  lion = kLion;
  lion.beta2 = 0.5f;
  EXPECT_GT(lion_ratio(n, 10, kLion, lion), 10.0) << "Lion beta2 off";
  auto adagrad = kAdagrad;
  adagrad.weight_decay *= 1.01f;
  EXPECT_GT(adagrad_ratio(n, 10, kAdagrad, adagrad), 10.0) << "Adagrad weight decay 1% off";
  adagrad = kAdagrad;
  adagrad.lr *= 1.01f;
  EXPECT_GT(adagrad_ratio(n, 10, kAdagrad, adagrad), 10.0) << "Adagrad lr 1% off";
}

TEST(Downcast, BitExactWithATen) {
  at::manual_seed(2);
  auto x = at::cat({at::randn({100000}) * 1000, at::randn({1000}) * 1e-6, at::randn({1000}) * 1e6,
                    at::tensor({0.0f, -0.0f, 65504.0f, 65520.0f, 1e-8f, std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity()})});
  for (auto [kind, dt] : {std::pair{Out16::BF16, at::kBFloat16}, std::pair{Out16::FP16, at::kHalf}}) {
    auto out = at::empty({x.numel()}, dt);
    downcast(x.data_ptr<float>(), out.data_ptr(), x.numel(), kind);
    EXPECT_TRUE(out.view(at::kShort).equal(x.to(dt).view(at::kShort))) << c10::toString(dt);
  }
  // The fused write equals a separate cast of the updated params.
  const int64_t n = 5000;
  auto p = at::randn({n}), g = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
  auto out = at::empty({n}, at::kBFloat16);
  adam_update(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n, AdamHyper{},
              1.0f, out.data_ptr(), Out16::BF16);
  EXPECT_TRUE(out.equal(p.to(at::kBFloat16)));
}

// Widened: rounded to 16 bits, stored as fp32 (a module computing in fp32
// over 16-bit storage), at offsets that cross the kernels' chunks.
TEST(Downcast, WidenedKindsRoundThenStoreFp32) {
  at::manual_seed(4);
  const int64_t n = (1 << 16) * 3 + 17;
  for (auto [kind, dt] : {std::pair{Out16::BF16Widened, at::kBFloat16}, std::pair{Out16::FP16Widened, at::kHalf}}) {
    SCOPED_TRACE(c10::toString(dt));
    const auto x = at::randn({n}) * 100;
    auto out = at::empty({n});
    downcast(x.data_ptr<float>(), out.data_ptr(), n, kind);
    EXPECT_TRUE(out.equal(x.to(dt).to(at::kFloat)));
    auto p = at::randn({n}), g = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
    auto fused = at::empty({n});
    adam_update(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n, AdamHyper{},
                1.0f, fused.data_ptr(), kind);
    EXPECT_TRUE(fused.equal(p.to(dt).to(at::kFloat)));
    auto buf = at::zeros({n});
    sgd_update(p.data_ptr<float>(), g.data_ptr<float>(), buf.data_ptr<float>(), n, SgdHyper{}, 1.0f, fused.data_ptr(),
               kind);
    EXPECT_TRUE(fused.equal(p.to(dt).to(at::kFloat)));
  }
}

// Muon's element-wise halves against the torch ops of DeepSpeed's
// muon_update and MuonWithAuxAdam.step in fp32: m.lerp_(g, 1 - beta), the
// Nesterov input g.lerp(m, beta), p.mul_(1 - lr wd).add_(u, -lr). The same
// formulas (torch's lerp is torch_lerp), so they differ only where a clone
// contracts a multiply-add into an FMA: about an ulp of the result per
// step, carried on (m's decays by beta). Over 5 steps with |m| < 2.5 and
// |p| < 6 here: 5 ulps, < 1.3e-6 and < 2.4e-6; bounds 2e-6 and 4e-6. A 1%
// wrong momentum moves the Nesterov input by ~1e-2. The 16-bit copy is
// the master rounded.
TEST(MuonKernel, MatchesDeepSpeedsTorchOps) {
  at::manual_seed(8);
  const int64_t n = 300001;
  const MuonHyper h{0.02f, 0.95f, 0.1f};
  auto m = at::zeros({n}), mt = at::zeros({n}), p = at::randn({n}), pt = p.clone();
  auto nesterov = at::empty({n});
  auto out = at::empty({n}, at::kBFloat16);
  for (int t = 0; t < 5; ++t) {
    const auto g = at::randn({n});
    muon_momentum(g.data_ptr<float>(), m.data_ptr<float>(), nesterov.data_ptr<float>(), n, h, 0.5f);
    const auto gs = g * 0.5f;
    mt.lerp_(gs, 1 - 0.95f);
    EXPECT_LT((m - mt).abs().max().item<double>(), 2e-6) << "step " << t;
    EXPECT_LT((nesterov - gs.lerp(mt, 0.95f)).abs().max().item<double>(), 2e-6) << "step " << t;
    const auto u = at::randn({n});
    muon_apply(p.data_ptr<float>(), u.data_ptr<float>(), n, h, out.data_ptr(), Out16::BF16);
    pt.mul_(1 - 0.02f * 0.1f).add_(u, -0.02f);
    EXPECT_LT((p - pt).abs().max().item<double>(), 4e-6) << "step " << t;
    EXPECT_TRUE(out.view(at::kShort).equal(p.to(at::kBFloat16).view(at::kShort)));
  }
  MuonHyper wrong = h;
  wrong.momentum = 0.9405f;
  auto m2 = at::zeros({n});
  const auto g = at::randn({n});
  muon_momentum(g.data_ptr<float>(), m2.data_ptr<float>(), nesterov.data_ptr<float>(), n, wrong, 1.0f);
  EXPECT_GT((nesterov - g.lerp(at::zeros({n}).lerp_(g, 0.05f), 0.95f)).abs().max().item<double>(), 1e-3);
}

#ifdef ZERO_HAVE_CUDA
// The CUDA kernels (optim/cuda): the same bounds against the same fp64
// oracle, and the fused 16-bit write bit-exact with ATen's cast. Skipped
// where no GPU is present; CI builds them on every machine.
class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    g_where = Where::Cuda;
  }
  void TearDown() override { g_where = Where::Cpu; }
};

TEST_F(CudaKernels, AdamMatchesTorchAdamW) {
  for (int64_t n : {1, 1000, 300001}) EXPECT_LE(adam_ratio(n, 10, kAdamW), 1.0) << "n = " << n;
  EXPECT_LE(adam_ratio(4099, 10, kAdamL2), 1.0) << "L2 mode";
  auto wrong = kAdamW;
  wrong.beta1 = 0.909f;
  EXPECT_GT(adam_ratio(4099, 10, kAdamW, wrong), 10.0) << "the bound still catches a wrong beta1";
}

TEST_F(CudaKernels, SgdMatchesTorchSgd) {
  for (bool nesterov : {false, true}) EXPECT_LE(sgd_ratio(70001, 6, sgd_hyper(nesterov)), 1.0) << "nesterov " << nesterov;
}

TEST_F(CudaKernels, LionAndAdagradMatchTheirOracles) {
  for (int64_t n : {1, 300001}) {
    EXPECT_LE(lion_ratio(n, 10, kLion), 1.0) << "Lion, n = " << n;
    EXPECT_LE(adagrad_ratio(n, 10, kAdagrad), 1.0) << "Adagrad, n = " << n;
  }
}

// LAMB's device passes against the CPU ones: the same float ops per
// element (FMA contraction aside: a few ulps) and norms summed in fp64 in
// another order (the ratio differs far below fp32's resolution).
TEST_F(CudaKernels, LambMatchesTheCpuKernel) {
  at::manual_seed(6);
  const int64_t n = 300001;
  auto p = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
  auto pd = p.cuda(), md = m.cuda(), vd = v.cuda();
  auto sums_d = at::zeros({2}, pd.options().dtype(at::kDouble));
  auto out = at::empty({n}, pd.options().dtype(at::kBFloat16));
  LambHyper h = kLamb;
  for (int t = 1; t <= 5; ++t) {
    h.step = t;
    const auto g = at::randn({n});
    const auto gd = g.cuda();
    double sums[2] = {0.0, 0.0};
    lamb_moments(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n, h, 1.0f, sums);
    lamb_apply(p.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n, h, lamb_trust_ratio(sums[0], sums[1], h));
    sums_d.zero_();
    cuda::lamb_moments(pd.data_ptr<float>(), gd.data_ptr<float>(), md.data_ptr<float>(), vd.data_ptr<float>(), n, h,
                       1.0f, sums_d.data_ptr<double>(), nullptr);
    const auto host = sums_d.cpu();
    const float ratio = lamb_trust_ratio(host[0].item<double>(), host[1].item<double>(), h);
    cuda::lamb_apply(pd.data_ptr<float>(), md.data_ptr<float>(), vd.data_ptr<float>(), n, h, ratio, out.data_ptr(),
                     Out16::BF16, nullptr);
  }
  EXPECT_TRUE(at::allclose(pd.cpu(), p, 1e-5, 1e-6));
  EXPECT_TRUE(out.equal(pd.to(at::kBFloat16)));
}

// Muon's device halves against the CPU ones (FMA contraction aside).
TEST_F(CudaKernels, MuonMatchesTheCpuKernel) {
  at::manual_seed(9);
  const int64_t n = 300001;
  const MuonHyper h{0.02f, 0.95f, 0.1f};
  auto m = at::zeros({n}), p = at::randn({n}), in = at::empty({n});
  auto md = m.cuda(), pd = p.cuda(), ind = in.cuda();
  auto out = at::empty({n}, pd.options().dtype(at::kBFloat16));
  for (int t = 0; t < 5; ++t) {
    const auto g = at::randn({n}), u = at::randn({n});
    const auto gd = g.cuda(), ud = u.cuda();
    muon_momentum(g.data_ptr<float>(), m.data_ptr<float>(), in.data_ptr<float>(), n, h, 1.0f);
    muon_apply(p.data_ptr<float>(), u.data_ptr<float>(), n, h);
    cuda::muon_momentum(gd.data_ptr<float>(), md.data_ptr<float>(), ind.data_ptr<float>(), n, h, 1.0f, nullptr);
    cuda::muon_apply(pd.data_ptr<float>(), ud.data_ptr<float>(), n, h, out.data_ptr(), Out16::BF16, nullptr);
  }
  EXPECT_TRUE(at::allclose(md.cpu(), m, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(ind.cpu(), in, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(pd.cpu(), p, 1e-5, 1e-6));
  EXPECT_TRUE(out.equal(pd.to(at::kBFloat16)));
}

TEST_F(CudaKernels, DowncastAndFusedWriteBitExactWithATen) {
  at::manual_seed(3);
  const auto x = (at::randn({100003}) * 1000).cuda();
  for (auto [kind, dt] : {std::pair{Out16::BF16, at::kBFloat16}, std::pair{Out16::FP16, at::kHalf}}) {
    auto out = at::empty({x.numel()}, x.options().dtype(dt));
    cuda::downcast(x.data_ptr<float>(), out.data_ptr(), x.numel(), kind, nullptr);
    EXPECT_TRUE(out.view(at::kShort).equal(x.to(dt).view(at::kShort))) << c10::toString(dt);
  }
  auto p = at::randn({5000}).cuda(), g = at::randn({5000}).cuda();
  auto m = at::zeros_like(p), v = at::zeros_like(p), out = at::empty_like(p, at::kBFloat16);
  cuda::adam_update(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), p.numel(),
                    AdamHyper{}, 1.0f, out.data_ptr(), Out16::BF16, nullptr);
  EXPECT_TRUE(out.equal(p.to(at::kBFloat16)));
  auto widened = at::empty_like(p);
  cuda::downcast(p.data_ptr<float>(), widened.data_ptr(), p.numel(), Out16::FP16Widened, nullptr);
  EXPECT_TRUE(widened.equal(p.to(at::kHalf).to(at::kFloat)));
}
#endif

}  // namespace
