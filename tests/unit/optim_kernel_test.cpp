// The flat optimizer kernels against libtorch's own optimizers (the oracle
// users know), and the fused 16-bit write against ATen's casts (bit-exact).
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "optim/kernels.h"

namespace {

using namespace zero::optim;

// Runs `steps` updates of our kernel and of torch's optimizer from the same
// start and grads; returns the largest |difference| of the params.
template <typename MakeTorchOpt, typename OurStep>
double compare(int64_t n, int steps, MakeTorchOpt make_opt, OurStep our_step) {
  at::manual_seed(0);
  auto p0 = at::randn({n});
  auto ours = p0.clone();
  auto theirs = p0.clone().set_requires_grad(true);
  auto opt = make_opt(theirs);
  auto m = at::zeros({n}), v = at::zeros({n});
  for (int t = 1; t <= steps; ++t) {
    auto g = at::randn({n}) * (t % 3 + 0.5);
    our_step(ours, g, m, v, t);
    theirs.mutable_grad() = g.clone();
    opt->step();
  }
  return (ours - theirs.detach()).abs().max().item<double>();
}

TEST(AdamKernel, MatchesTorchAdamW) {
  // Sizes around the chunk and vector widths; round-off of a few ulp of lr.
  for (int64_t n : {1, 15, 17, 1000, (1 << 16) + 3, 300001}) {
    double d = compare(
        n, 10,
        [](at::Tensor& p) {
          return std::make_unique<torch::optim::AdamW>(
              std::vector<at::Tensor>{p}, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
        },
        [&](at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, int t) {
          AdamHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, true, true};
          adam_update(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n, h, 1.0f);
        });
    EXPECT_LT(d, 1e-6) << "n = " << n;
  }
}

TEST(AdamKernel, L2ModeMatchesTorchAdam) {
  const int64_t n = 4099;
  double d = compare(
      n, 10,
      [](at::Tensor& p) {
        return std::make_unique<torch::optim::Adam>(std::vector<at::Tensor>{p},
                                                    torch::optim::AdamOptions(1e-3).weight_decay(0.05));
      },
      [&](at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, int t) {
        AdamHyper h{1e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, t, false, true};
        adam_update(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n, h, 1.0f);
      });
  EXPECT_LT(d, 1e-6);
}

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
  for (bool nesterov : {false, true}) {
    const int64_t n = 70001;
    double d = compare(
        n, 6,
        [&](at::Tensor& p) {
          return std::make_unique<torch::optim::SGD>(
              std::vector<at::Tensor>{p},
              torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01).nesterov(nesterov));
        },
        [&](at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor&, int t) {
          SgdHyper h{0.1f, 0.9f, 0.0f, 0.01f, nesterov, t == 1};
          sgd_update(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), n, h, 1.0f);
        });
    EXPECT_LT(d, 1e-6) << "nesterov " << nesterov;
  }
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

}  // namespace
