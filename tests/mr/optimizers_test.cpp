// Lion, Adagrad, LAMB and Muon at every stage, against references in plain torch
// on the whole batch in one process: torch's own Adagrad, Lion written here
// from the paper's update (Chen et al. 2023, Algorithm 2) in DeepSpeed's
// FusedLion order, LAMB from You et al. 2020 as DeepSpeed's FusedLamb. Both with the weight-decay recipe's two param
// groups (a second lr on the no-decay group) and clipping; 16-bit runs
// track fp32; checkpoints resume exactly and refuse another type's state.
//
// Tolerances: each step moves an element by at most lr (Lion: lr * sign;
// Adagrad: lr * |g| / sqrt(sum g^2) <= lr). The sharded runs' grads differ
// from the reference's only in summation order (~1e-7 relative), which
// moves an Adagrad update by ~lr * 1e-7 and a param by an ulp (~1e-7) per
// step; Lion's sign() is exact unless its argument is within rounding of 0
// (never, in these few steps). 6 steps then stay far under 2e-5, the AdamW
// oracles' bound, which the oracles below show the groups and clipping exceed.
#include <algorithm>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adagrad.h>

#include "engine/muon_step.h"
#include "fixtures.h"

namespace zero::test {
namespace {

StockMlp mlp() { return StockMlp(8, 16); }

constexpr double kLr = 0.01, kNoDecayLr = 0.02, kDecay = 0.1, kClip = 0.5;
constexpr int kSteps = 6;

std::pair<at::Tensor, at::Tensor> batch(int step) {
  at::manual_seed(700 + step);
  const at::Tensor x = at::randn({4 * dp_group()->size(), 8});
  return {x, x.sum(1, true).sin()};
}

// Lion on whole tensors: decoupled decay, the sign of the interpolation,
// then the momentum update (Chen et al. 2023, Alg. 2; DeepSpeed's FusedLion).
struct TorchLion {
  struct Group {
    std::vector<at::Tensor> params;
    double lr, weight_decay;
  };
  std::vector<Group> groups;
  double beta1 = 0.9, beta2 = 0.999;
  std::map<const void*, at::Tensor> exp_avg;

  void step() {
    at::NoGradGuard no_grad;
    for (auto& g : groups)
      for (auto& p : g.params) {
        at::Tensor& m = exp_avg.try_emplace(p.unsafeGetTensorImpl(), at::zeros_like(p)).first->second;
        const at::Tensor grad = p.grad();
        p.mul_(1.0 - g.lr * g.weight_decay);
        p.sub_((m * beta1 + grad * (1.0 - beta1)).sign() * g.lr);
        m.mul_(beta2).add_(grad, 1.0 - beta2);
      }
  }
};

// LAMB per param, as DeepSpeed's FusedLamb (You et al. 2020, with the
// bias correction in the step size): u = m / (sqrt(v) + eps) + wd p, the
// trust ratio ||p|| / ||u|| clamped to [0.01, 10] (1 if either is 0).
struct TorchLamb {
  std::vector<TorchLion::Group> groups;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::map<const void*, std::pair<at::Tensor, at::Tensor>> state;
  int step_count = 0;

  void step() {
    at::NoGradGuard no_grad;
    ++step_count;
    const double step_size =
        std::sqrt(1 - std::pow(beta2, step_count)) / (1 - std::pow(beta1, step_count));
    for (auto& g : groups)
      for (auto& p : g.params) {
        auto& [m, v] = state.try_emplace(p.unsafeGetTensorImpl(), at::zeros_like(p), at::zeros_like(p)).first->second;
        const at::Tensor grad = p.grad();
        m.mul_(beta1).add_(grad, 1 - beta1);
        v.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
        const at::Tensor u = m / (v.sqrt() + eps) + g.weight_decay * p;
        const double w_norm = p.norm().item<double>(), u_norm = u.norm().item<double>();
        const double ratio = w_norm == 0 || u_norm == 0 ? 1.0 : std::clamp(w_norm / u_norm, 0.01, 10.0);
        p.sub_(u * (g.lr * step_size * ratio));
      }
  }
};

// Muon as DeepSpeed's MuonWithAuxAdam (Jordan et al. 2024): for 2-D
// weights not named embed / lm_head, momentum m = lerp(m, g, 1 - 0.95), the
// Nesterov input lerp(g, m, 0.95) orthogonalised by 5 steps of the quintic
// Newton-Schulz iteration (a, b, c = 3.4445, -4.7750, 2.0315, the wide
// orientation, over its Frobenius norm + 1e-7), times sqrt(max(1, rows /
// cols)); p = p (1 - lr wd) - lr u. Every other param: AdamW with betas
// (0.9, 0.95), eps 1e-10, the same decoupled decay. Written from the rule,
// in fp32 as the engine computes it (DeepSpeed's GPUs run the iteration in
// bf16 / fp16).
struct TorchMuon {
  struct Group {
    std::vector<std::pair<std::string, at::Tensor>> params;
    double lr, weight_decay;
  };
  std::vector<Group> groups;
  double momentum = 0.95, beta1 = 0.9, beta2 = 0.95, eps = 1e-10;
  std::map<const void*, std::pair<at::Tensor, at::Tensor>> state;
  int step_count = 0;

  static at::Tensor orthogonalize(at::Tensor g) {
    const bool tall = g.size(0) > g.size(1);
    at::Tensor x = tall ? g.t() : g;
    x = x / (x.norm() + 1e-7);
    for (int i = 0; i < 5; ++i) {
      const at::Tensor a = x.mm(x.t());
      x = 3.4445 * x + (-4.7750 * a + 2.0315 * a.mm(a)).mm(x);
    }
    return (tall ? x.t() : x) * std::sqrt(std::max(1.0, static_cast<double>(g.size(0)) / g.size(1)));
  }

  void step() {
    at::NoGradGuard no_grad;
    ++step_count;
    for (auto& g : groups)
      for (auto& [name, p] : g.params) {
        auto& [m, v] = state.try_emplace(p.unsafeGetTensorImpl(), at::zeros_like(p), at::zeros_like(p)).first->second;
        const at::Tensor grad = p.grad().clone();
        at::Tensor u;
        if (muon_uses(name, p.dim())) {
          m.lerp_(grad, 1 - momentum);
          u = orthogonalize(grad.lerp(m, momentum));
        } else {
          m.lerp_(grad, 1 - beta1);
          v.lerp_(grad * grad, 1 - beta2);
          u = (m / (1 - std::pow(beta1, step_count))) / ((v / (1 - std::pow(beta2, step_count))).sqrt() + eps);
        }
        p.mul_(1 - g.lr * g.weight_decay);
        p.sub_(u * g.lr);
      }
  }
};

// The reference: the whole batch, torch's clip_grad_norm_ (DeepSpeed's
// clip: max_norm / (norm + 1e-6) when under 1), the optimizer's step.
// `grouped` false: one group at kLr with decay everywhere (the oracle's
// sensitivity check); `clip` 0: no clipping.
std::map<std::string, at::Tensor> reference(OptimizerType type, bool grouped, double clip) {
  StockMlp ref = mlp();
  auto recipe = weight_decay_groups(*ref, kDecay);
  if (!grouped) recipe = {{ref->parameters(), kLr, kDecay}};
  else recipe[1].lr = kNoDecayLr;
  TorchLion lion;
  TorchLamb lamb;
  TorchMuon muon;
  std::map<const void*, std::string> name_of;
  for (const auto& item : ref->named_parameters()) name_of[item.value().unsafeGetTensorImpl()] = item.key();
  std::vector<torch::optim::OptimizerParamGroup> adagrad_groups;
  for (const auto& g : recipe) {
    const double lr = g.lr.value_or(kLr), wd = g.weight_decay.value_or(kDecay);
    lion.groups.push_back({g.params, lr, wd});
    lamb.groups.push_back({g.params, lr, wd});
    muon.groups.push_back({{}, lr, wd});
    for (const auto& p : g.params) muon.groups.back().params.emplace_back(name_of.at(p.unsafeGetTensorImpl()), p);
    adagrad_groups.emplace_back(g.params, std::make_unique<torch::optim::AdagradOptions>(
                                              torch::optim::AdagradOptions(lr).weight_decay(wd).eps(1e-10)));
  }
  torch::optim::Adagrad adagrad(std::move(adagrad_groups), torch::optim::AdagradOptions(kLr));
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = batch(s);
    for (auto& p : ref->parameters()) p.mutable_grad() = at::Tensor();
    (ref->forward(x) - y).pow(2).mean().backward();
    if (clip > 0) torch::nn::utils::clip_grad_norm_(ref->parameters(), clip);
    if (type == OptimizerType::Lion) lion.step();
    else if (type == OptimizerType::Lamb) lamb.step();
    else if (type == OptimizerType::Muon) muon.step();
    else adagrad.step();
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& item : ref->named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

Config config(OptimizerType type, int stage, const char* dtype = "fp32") {
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", 4},
                      {"gradient_clipping", kClip},
                      {"optimizer", {{"type", to_string(type)}, {"params", {{"lr", kLr}, {"weight_decay", kDecay}}}}},
                      {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 0}}},
                      {"zero_cpp", {{"compute_dtype", "fp32"}}}};
  if (std::string(dtype) == "bf16") j["bf16"] = {{"enabled", true}};
  // A start scale these grads never overflow at: no step is skipped.
  if (std::string(dtype) == "fp16") j["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}};
  return Config::from_json(j);
}

// Trains steps [from, to) of the batches on this rank's quarter of each.
void train(zero::Engine& engine, StockMlp& model, int from, int to) {
  for (int s = from; s < to; ++s) {
    auto [x, y] = batch(s);
    const int r = dp_group()->rank();
    engine.backward((engine.forward(model, x.narrow(0, 4 * r, 4)) - y.narrow(0, 4 * r, 4)).pow(2).mean());
    engine.step();
  }
}

std::vector<ParamGroup> groups_of(StockMlp& model) {
  auto groups = weight_decay_groups(*model, kDecay);
  groups[1].lr = kNoDecayLr;
  return groups;
}

void expect_matches_reference(OptimizerType type, double tol = 2e-5) {
  const auto want = reference(type, true, kClip);
  ASSERT_GT(max_abs_diff(want, reference(type, false, kClip)), 1e-3) << "the groups must matter for this oracle";
  ASSERT_GT(max_abs_diff(want, reference(type, true, 0.0)), 1e-4) << "clipping must matter for this oracle";
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    StockMlp model = mlp();
    zero::Engine engine(*model, config(type, stage), world().comm(), dp_group(), groups_of(model));
    train(engine, model, 0, kSteps);
    EXPECT_LT(max_abs_diff(engine.full_parameters(), want), tol) << worst_param(engine.full_parameters(), want);
  }
}

// The same update in one process (a group of one: whole params, no
// collective) against the sharded runs from `first_stage` to 3.
void expect_matches_one_process(OptimizerType type, int first_stage, double tol) {
  StockMlp solo_model = mlp();
  zero::Engine solo(*solo_model, config(type, 0), world().comm(), solo_group(), groups_of(solo_model));
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = batch(s);
    solo.backward((solo.forward(solo_model, x) - y).pow(2).mean());
    solo.step();
  }
  const auto one_process = solo.full_parameters();
  for (int stage = first_stage; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    StockMlp model = mlp();
    zero::Engine engine(*model, config(type, stage), world().comm(), dp_group(), groups_of(model));
    train(engine, model, 0, kSteps);
    EXPECT_LT(max_abs_diff(engine.full_parameters(), one_process), tol)
        << worst_param(engine.full_parameters(), one_process);
  }
}

TEST(Optimizers, LionMatchesThePapersUpdateAtEveryStage) { expect_matches_reference(OptimizerType::Lion); }

TEST(Optimizers, AdagradMatchesTorchAdagradAtEveryStage) { expect_matches_reference(OptimizerType::Adagrad); }

// LAMB's trust ratio needs each param's norms summed over the shards that
// hold its pieces: against the torch reference, and against the same
// update in one process (a group of one: whole params, no all-reduce).
// Tighter bounds than above, as ratios from each shard's own norms (no
// all-reduce) move the params by only ~1e-4 here: the sharded runs differ
// from one process in
// summation order only (the norms' and the grads', ~1e-7 relative: an ulp
// of p per step, 6 steps < 1e-6); torch's reference rounds its norms in
// fp32 (ours are summed in fp64), which moves each step by ~1e-7 of lr *
// ratio * |u| more: < 2e-6. Measured when written: 3e-7 and 1.5e-8.
TEST(Optimizers, LambMatchesItsReferenceAndOneProcessAtEveryStage) {
  expect_matches_reference(OptimizerType::Lamb, 2e-6);
  expect_matches_one_process(OptimizerType::Lamb, 1, 1e-6);
}

// Muon's orthogonalisation needs each whole matrix, whose pieces lie on
// several shards at stages 1-3 (fc1.weight's 128 elements straddle shards
// at 2 and 4 ranks): against the torch reference and against one process.
// Bounds: the sharded runs' grads differ from one process's in summation
// order (~1e-7 relative); the momentum is element-wise (the same float ops)
// and the owner's Newton-Schulz runs the same at:: ops on the same shape,
// so only that input difference propagates. Each quintic step multiplies a
// relative perturbation by at most its slope at 0, 3.4445 (5 steps: < 500);
// the update's elements are at most sqrt(rows / cols) * 1.2 (~1.2 here), so
// a step moves a param by < lr * 1.2 * 500 * 1e-7 = 6e-7, 6 steps < 4e-6.
// The reference computes the same formulas (its lerp_ is the kernel's
// torch_lerp; its AdamW params' step the fused one's, ~1 ulp per step
// apart), so the same bound holds for it. Measured when written, at 2 and
// 4 ranks: 9e-8 against the reference, 6e-8 against one process.
TEST(Optimizers, MuonMatchesItsReferenceAndOneProcessAtEveryStage) {
  expect_matches_reference(OptimizerType::Muon, 4e-6);
  expect_matches_one_process(OptimizerType::Muon, 0, 4e-6);
}

// DeepSpeed's set_optimizer_flags: Muon for params of 2+ dims whose name
// holds neither "embed" nor "lm_head" (any case); AdamW for the rest.
TEST(Optimizers, MuonParamsAreDeepSpeedsHiddenMatrices) {
  EXPECT_TRUE(muon_uses("blocks.0.attn.qkv.weight", 2));
  EXPECT_TRUE(muon_uses("conv.weight", 4));
  EXPECT_FALSE(muon_uses("blocks.0.attn.qkv.bias", 1));
  EXPECT_FALSE(muon_uses("tok_embed.weight", 2));
  EXPECT_FALSE(muon_uses("wte_Embedding.weight", 2));
  EXPECT_FALSE(muon_uses("lm_head.weight", 2));
  EXPECT_FALSE(muon_uses("LM_HEAD.weight", 2));
  // The orthogonalised update of a matrix: singular values near 1 (the
  // quintic leaves them in about [0.7, 1.2]), whatever the input's scale.
  at::manual_seed(3);
  const at::Tensor g = at::randn({24, 40}) * 1e3;
  const at::Tensor sv = at::linalg_svdvals(muon_orthogonalize(g, g.sizes()));
  EXPECT_GT(sv.min().item<double>(), 0.5);
  EXPECT_LT(sv.max().item<double>(), 1.3);
  // A tall one is scaled by sqrt(rows / cols).
  const at::Tensor tall = at::randn({40, 10});
  const at::Tensor tsv = at::linalg_svdvals(muon_orthogonalize(tall, tall.sizes()));
  EXPECT_GT(tsv.min().item<double>(), 0.5 * 2);
  EXPECT_LT(tsv.max().item<double>(), 1.3 * 2);
}

// The collectives Muon adds (docs/design.md, "Muon over flat shards"): at
// stages 1-3 two all-gathers -- the Nesterov inputs to the owners, the
// updates back -- beyond AdamW's step; none at stage 0 (whole matrices).
// Muon's matrices here: fc1.weight (128) and fc2.weight (16), so owners'
// segments are 128 elements (fc1's owner); holders' segments are each
// rank's share of the 144 Muon elements, at least 144 / N.
TEST(Optimizers, MuonAddsTwoAllGathersAtStagesOneToThree) {
  const auto step_counts = [](OptimizerType type, int stage) {
    StockMlp model = mlp();
    zero::Engine engine(*model, config(type, stage), world().comm(), dp_group(), groups_of(model));
    auto [x, y] = batch(0);
    const int r = dp_group()->rank();
    engine.backward((engine.forward(model, x.narrow(0, 4 * r, 4)) - y.narrow(0, 4 * r, 4)).pow(2).mean());
    const auto before = world().comm().counters().totals();
    engine.step();
    return comm::diff(world().comm().counters().totals(), before);
  };
  const int64_t n = dp_group()->size();
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto adam = step_counts(OptimizerType::AdamW, stage), muon = step_counts(OptimizerType::Muon, stage);
    for (const char* op : {"all_reduce", "reduce_scatter", "broadcast"}) {
      EXPECT_EQ(muon[op].calls, adam[op].calls) << op;
      EXPECT_EQ(muon[op].bytes, adam[op].bytes) << op;
    }
    const int64_t calls = muon["allgather"].calls - adam["allgather"].calls;
    const int64_t bytes = muon["allgather"].bytes - adam["allgather"].bytes;
    if (stage == 0) {
      EXPECT_EQ(calls, 0);
      EXPECT_EQ(bytes, 0);
      continue;
    }
    EXPECT_EQ(calls, 2);
    ASSERT_EQ(bytes % (4 * n), 0);
    const int64_t in_segment = bytes / (4 * n) - 128;
    EXPECT_GE(in_segment, (144 + n - 1) / n);
    EXPECT_LE(in_segment, 144);
  }
}

// The optimizer from code trains as the config's.
TEST(Optimizers, FromCodeMatchTheReferences) {
  for (auto [type, opt] : {std::pair{OptimizerType::Lion, OptimizerConfig::lion(kLr, kDecay)},
                           std::pair{OptimizerType::Adagrad, OptimizerConfig::adagrad(kLr, kDecay)},
                           std::pair{OptimizerType::Lamb, OptimizerConfig::lamb(kLr, kDecay)},
                           std::pair{OptimizerType::Muon, OptimizerConfig::muon(kLr, kDecay, 0.95, kLr)}}) {
    SCOPED_TRACE(to_string(type));
    nlohmann::json j = config(type, 2).to_json();
    j.erase("optimizer");
    StockMlp model = mlp();
    zero::Engine engine(*model, with_optimizer(Config::from_json(j), opt), world().comm(), dp_group(),
                        groups_of(model));
    train(engine, model, 0, kSteps);
    const auto want = reference(type, true, kClip);
    EXPECT_LT(max_abs_diff(engine.full_parameters(), want), 2e-5) << worst_param(engine.full_parameters(), want);
  }
}

// Elements where |a - b| exceeds rel |b| + tol.
int64_t count_beyond(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b,
                     double rel, double tol) {
  int64_t n = 0;
  for (const auto& [name, t] : a)
    n += (t - b.at(name)).abs().gt(rel * b.at(name).abs() + tol).sum().item<int64_t>();
  return n;
}

// 16-bit params (the update writes them in the same pass as the master):
// they are the master rounded to 8 (bf16) or 11 (fp16) mantissa bits
// (2^-9 or 2^-12 of |p|), and the master drifts from fp32's as the grads
// of rounded params differ (~2^-8 relative): by far less than lr over these
// steps, except where a step is a sign -- Lion's every step, Adagrad's
// first (g / sqrt(g^2)) -- and a grad near 0 takes the other one, a 2 lr
// move. Those are counted: a few of the 193 elements (2 at bf16, 0 at fp16
// when written), beyond the rounding and a tenth of lr.
TEST(Optimizers, SixteenBitTracksTheReference) {
  for (OptimizerType type : {OptimizerType::Lion, OptimizerType::Adagrad, OptimizerType::Lamb, OptimizerType::Muon}) {
    const auto want = reference(type, true, kClip);
    for (const char* dtype : {"bf16", "fp16"})
      for (int stage : {1, 3}) {
        SCOPED_TRACE(std::string(to_string(type)) + " " + dtype + " stage " + std::to_string(stage));
        StockMlp model = mlp();
        zero::Engine engine(*model, config(type, stage, dtype), world().comm(), dp_group(), groups_of(model));
        train(engine, model, 0, kSteps);
        EXPECT_EQ(engine.skipped_steps(), 0);
        const auto got = engine.full_parameters();
        const double rounding = std::string(dtype) == "bf16" ? 1.0 / 512 : 1.0 / 4096;
        EXPECT_LE(count_beyond(got, want, rounding, 0.1 * kLr), 10) << worst_param(got, want);
      }
  }
}

// The collective LAMB adds (docs/design.md): one all-reduce of 2 doubles
// per param per step, beside the grad norm's 8 bytes, at stages 1-3; none
// at stage 0 (whole params there). Lion and Adagrad add none.
TEST(Optimizers, LambAddsOneAllReduceOfTwoDoublesPerParam) {
  for (OptimizerType type : {OptimizerType::Lion, OptimizerType::Adagrad, OptimizerType::Lamb})
    for (int stage : {0, 2, 3}) {
      SCOPED_TRACE(std::string(to_string(type)) + " stage " + std::to_string(stage));
      StockMlp model = mlp();
      zero::Engine engine(*model, config(type, stage), world().comm(), dp_group(), groups_of(model));
      auto [x, y] = batch(0);
      const int r = dp_group()->rank();
      engine.backward((engine.forward(model, x.narrow(0, 4 * r, 4)) - y.narrow(0, 4 * r, 4)).pow(2).mean());
      const auto before = world().comm().counters().totals();
      engine.step();
      const auto step = comm::diff(world().comm().counters().totals(), before);
      const int64_t params = static_cast<int64_t>(model->parameters().size());  // 6
      const bool lamb_reduce = type == OptimizerType::Lamb && stage > 0;
      const int64_t norm_bytes = stage > 0 ? 8 : 0;  // stage 0's grads are whole: no norm all-reduce
      const auto it = step.find("all_reduce");
      const int64_t calls = it == step.end() ? 0 : it->second.calls, bytes = it == step.end() ? 0 : it->second.bytes;
      EXPECT_EQ(calls, (stage > 0 ? 1 : 0) + (lamb_reduce ? 1 : 0));
      EXPECT_EQ(bytes, norm_bytes + (lamb_reduce ? 16 * params : 0));
    }
}

// Save after 3 steps, resume in a fresh engine: steps 4..6 bit for bit as
// an uninterrupted run (the momentum or the sum of squares restored;
// Muon's momentum and its AdamW params' moments).
TEST(Optimizers, CheckpointsResumeExactly) {
  for (OptimizerType type : {OptimizerType::Lion, OptimizerType::Adagrad, OptimizerType::Lamb, OptimizerType::Muon})
    for (const char* dtype : {"fp32", "bf16"})
      for (int stage : {0, 3}) {
        SCOPED_TRACE(std::string(to_string(type)) + " " + dtype + " stage " + std::to_string(stage));
        const auto dir = ckpt_dir(std::string("optim-") + to_string(type) + dtype + std::to_string(stage));
        StockMlp full = mlp();
        zero::Engine whole(*full, config(type, stage, dtype), world().comm(), dp_group(), groups_of(full));
        train(whole, full, 0, kSteps);
        {
          StockMlp first = mlp();
          zero::Engine e(*first, config(type, stage, dtype), world().comm(), dp_group(), groups_of(first));
          train(e, first, 0, 3);
          e.save_checkpoint(dir, "step3");
        }
        StockMlp model = mlp();
        zero::Engine resumed(*model, config(type, stage, dtype), world().comm(), dp_group(), groups_of(model));
        resumed.load_checkpoint(dir);
        train(resumed, model, 3, kSteps);
        EXPECT_EQ(max_abs_diff(resumed.full_parameters(), whole.full_parameters()), 0.0);
        remove_dir(dir);
      }
}

// Muon's momentum lives beside the master in the flat layout (exp_avg), so
// a checkpoint saved at stage 3 resumes at stage 1 (and 0): 3 + 3 steps
// equal one process's 6 within the one-process bound above.
TEST(Optimizers, MuonMomentumResumesAtAnotherStage) {
  StockMlp solo_model = mlp();
  zero::Engine solo(*solo_model, config(OptimizerType::Muon, 0), world().comm(), solo_group(), groups_of(solo_model));
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = batch(s);
    solo.backward((solo.forward(solo_model, x) - y).pow(2).mean());
    solo.step();
  }
  const auto dir = ckpt_dir("optim-muon-reshard");
  {
    StockMlp first = mlp();
    zero::Engine e(*first, config(OptimizerType::Muon, 3), world().comm(), dp_group(), groups_of(first));
    train(e, first, 0, 3);
    e.save_checkpoint(dir, "step3");
  }
  for (int stage : {1, 0}) {
    SCOPED_TRACE("resumed at stage " + std::to_string(stage));
    StockMlp model = mlp();
    zero::Engine resumed(*model, config(OptimizerType::Muon, stage), world().comm(), dp_group(), groups_of(model));
    resumed.load_checkpoint(dir);
    train(resumed, model, 3, kSteps);
    EXPECT_LT(max_abs_diff(resumed.full_parameters(), solo.full_parameters()), 4e-6)
        << worst_param(resumed.full_parameters(), solo.full_parameters());
  }
  remove_dir(dir);
}

// Lion's exp_avg is not SGD's momentum nor Adam's moment, though the
// buffers share a name: another type's state is refused, naming both.
TEST(Optimizers, AnotherTypesStateIsRefused) {
  const auto dir = ckpt_dir("optim-lion-state");
  {
    StockMlp model = mlp();
    zero::Engine e(*model, config(OptimizerType::Lion, 2), world().comm(), dp_group());
    train(e, model, 0, 1);
    e.save_checkpoint(dir, "lion");
  }
  for (OptimizerType other : {OptimizerType::SGD, OptimizerType::Adagrad, OptimizerType::AdamW, OptimizerType::Lamb,
                              OptimizerType::Muon}) {
    nlohmann::json j = config(OptimizerType::Lion, 2).to_json();
    j["optimizer"] = {{"type", to_string(other)}, {"params", {{"lr", kLr}, {"momentum", 0.9}}}};
    if (other != OptimizerType::SGD) j["optimizer"]["params"].erase("momentum");
    StockMlp model = mlp();
    zero::Engine e(*model, Config::from_json(j), world().comm(), dp_group());
    expect_error([&] { e.load_checkpoint(dir); },
                 std::string("holds optimizer state of Lion; this engine's optimizer is ") + to_string(other));
  }
  remove_dir(dir);
}

}  // namespace
}  // namespace zero::test
