// What users' own models do that the bundled GPT does not: stock torch::nn
// layers, frozen parts, buffers (BatchNorm), weights shared or used twice,
// and ranks that disagree. Each test holds the engine to an oracle -- a
// single-process reference, rank 0's own values, a local replay -- and each
// failed on the code before the fix it guards.
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <set>

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "ckpt/checkpoint_dir.h"
#include "fixtures.h"
#include "zero/init.h"
#include "zero/unit.h"

namespace {

using namespace zero::test;

// Every rank's copy of `t`, stacked: row q is rank q's.
at::Tensor gather_from_all(const at::Tensor& t) {
  const auto& g = *dp_group();
  auto flat = t.detach().reshape(-1).contiguous();
  auto all = at::empty({g.size() * flat.numel()}, flat.options());
  world().comm().all_gather(g, all, flat)->wait();
  return all.view({g.size(), flat.numel()});
}

bool same_on_all_ranks(const at::Tensor& t) {
  auto all = gather_from_all(t);
  for (int q = 1; q < all.size(0); ++q)
    if (!all[q].equal(all[0])) return false;
  return true;
}

// Every registered tensor (params, frozen or not, and buffers) by name.
std::map<std::string, at::Tensor> module_state(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  for (const auto& b : m.named_buffers()) out[b.key()] = b.value().detach().clone();
  return out;
}

// ---- 1. frozen params and buffers ----------------------------------------------

// Stock layers: a frozen Linear backbone, a BatchNorm, a trainable head.
// `seed` differs per rank in the tests, as it does in users' programs that
// forget to seed alike; BatchNorm's running mean is set from it too.
struct FrozenBnNet : torch::nn::Module {
  explicit FrozenBnNet(uint64_t seed) {
    at::manual_seed(seed);
    backbone = register_module("backbone", torch::nn::Linear(8, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    head = register_module("head", torch::nn::Linear(16, 1));
    for (auto& p : backbone->parameters()) p.set_requires_grad(false);
    bn->running_mean.fill_(0.01 * static_cast<double>(seed % 100));
  }
  at::Tensor features(const at::Tensor& x) { return backbone->forward(x); }
  at::Tensor loss(const at::Tensor& x) { return head->forward(torch::relu(bn->forward(features(x)))).pow(2).mean(); }
  torch::nn::Linear backbone{nullptr}, head{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

uint64_t rank_seed() { return 100 + static_cast<uint64_t>(dp_group()->rank()); }

// Ranks seeded differently train rank 0's model: frozen params and buffers
// are broadcast at construction, as trainable ones always were. (BatchNorm
// in eval mode, so the single-process reference sees the same statistics.)
TEST(FrozenAndBuffers, StartFromRankZeroAndTrainWithParity) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    FrozenBnNet m(rank_seed()), ref(100);
    m.bn->eval();
    ref.bn->eval();
    zero::Engine e(m, toy_config(stage, 4), world().comm(), dp_group());
    zero::Engine er(ref, toy_config(0, 4 * world().size()), world().comm(), solo_group());
    const auto frozen_before = module_state(ref);
    for (int step = 0; step < 5; ++step) step_with_reference(e, m, er, ref, 600 + step, 8);
    const auto got = module_state(m), want = module_state(ref);
    EXPECT_TRUE(got.at("backbone.weight").equal(frozen_before.at("backbone.weight")));
    EXPECT_TRUE(got.at("bn.running_mean").equal(want.at("bn.running_mean")));
    EXPECT_LT(max_abs_diff(got, want), 1e-5);
  }
}

// In training mode each rank's BatchNorm updates its statistics from its own
// rows; at each step boundary they become rank 0's (DDP's broadcast_buffers).
// The oracle replays rank 0's rows (or, with the switch off, this rank's)
// through a BatchNorm of its own.
TEST(FrozenAndBuffers, BuffersFollowRankZeroAtEachStep) {
  for (bool broadcast : {true, false}) {
    SCOPED_TRACE(broadcast ? "broadcast_buffers" : "broadcast_buffers off");
    auto j = nlohmann::json{{"train_micro_batch_size_per_gpu", 4},
                            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                            {"zero_optimization", {{"stage", 2}}},
                            {"zero_cpp", {{"broadcast_buffers", broadcast}}}};
    FrozenBnNet m(100);
    zero::Engine e(m, Config::from_json(j), world().comm(), dp_group());
    torch::nn::BatchNorm1d shadow(16);
    {
      at::NoGradGuard no_grad;
      shadow->running_mean.copy_(m.bn->running_mean);
    }
    const int r = dp_group()->rank();
    for (int step = 0; step < 3; ++step) {
      at::manual_seed(700 + step);
      auto x = at::randn({4 * world().size(), 8});
      e.backward(m.loss(x.narrow(0, 4 * r, 4)));
      e.step();
      at::NoGradGuard no_grad;
      shadow->forward(m.features(x.narrow(0, broadcast ? 0 : 4 * r, 4)));
      EXPECT_TRUE(m.bn->running_mean.equal(shadow->running_mean)) << "step " << step;
      EXPECT_TRUE(m.bn->running_var.equal(shadow->running_var)) << "step " << step;
      EXPECT_EQ(m.bn->num_batches_tracked.item<int64_t>(), step + 1);
      if (world().size() > 1) EXPECT_EQ(same_on_all_ranks(m.bn->running_mean), broadcast);
    }
  }
}

// A resumed run keeps its BatchNorm statistics and frozen params (saved by
// rank 0, restored on every rank) and goes on bit for bit; the consolidated
// file holds every tensor of the plain model under its name, and
// load_weights puts them all back.
TEST(FrozenAndBuffers, CheckpointsConsolidationAndLoadWeightsCarryThem) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const auto dir = ckpt_dir("frozen-bn-" + std::to_string(stage));
    auto run = [&](FrozenBnNet& m, zero::Engine& e, int from, int to) {
      std::vector<double> losses;
      for (int step = from; step < to; ++step) {
        at::manual_seed(800 + step);
        auto x = at::randn({4 * world().size(), 8}).narrow(0, 4 * dp_group()->rank(), 4);
        auto loss = m.loss(x);
        losses.push_back(loss.item<double>());
        e.backward(loss);
        e.step();
      }
      return losses;
    };
    FrozenBnNet full(100);
    zero::Engine ef(full, toy_config(stage, 4), world().comm(), dp_group());
    const auto want = run(full, ef, 0, 6);
    {
      FrozenBnNet first(100);
      zero::Engine e1(first, toy_config(stage, 4), world().comm(), dp_group());
      run(first, e1, 0, 3);
      e1.save_checkpoint(dir, "step3");
    }
    FrozenBnNet resumed(999);  // other weights, other statistics
    zero::Engine er(resumed, toy_config(stage, 4), world().comm(), dp_group());
    er.load_checkpoint(dir);
    EXPECT_EQ(run(resumed, er, 3, 6), std::vector<double>(want.begin() + 3, want.end()));
    const auto state = module_state(resumed);
    EXPECT_EQ(max_abs_diff(state, module_state(full)), 0.0);

    const std::string out = dir + "-weights.safetensors";
    er.save_checkpoint(dir, "final");
    if (world().rank() == 0) zero::ckpt::consolidate(dir, "", out, "fp32");
    world().comm().barrier(world().group())->wait();
    {
      zero::ckpt::SafetensorsFile f(out);
      EXPECT_EQ(f.entries().size(), state.size());
      for (const auto& [name, t] : state) {
        ASSERT_TRUE(f.has(name)) << name;
        EXPECT_EQ(f.entry(name).shape, t.sizes().vec()) << name;
        EXPECT_EQ(std::memcmp(f.data(name), t.contiguous().data_ptr(), t.nbytes()), 0) << name;
      }
      EXPECT_EQ(f.entry("bn.num_batches_tracked").dtype, "I64");
    }
    FrozenBnNet fresh(555);
    zero::Engine ew(fresh, toy_config(stage, 4), world().comm(), dp_group());
    ew.load_weights(out);
    EXPECT_EQ(max_abs_diff(module_state(fresh), state), 0.0);
    world().comm().barrier(world().group())->wait();
    if (world().rank() == 0) std::filesystem::remove(out);
    remove_dir(dir);
  }
}

// A unit built under zero::Init with a frozen part and a BatchNorm: its
// frozen params and buffers are rank 0's as soon as the unit is built.
struct BnBlockImpl : torch::nn::Module {
  BnBlockImpl() {
    frozen = register_module("frozen", torch::nn::Linear(8, 8));
    for (auto& p : frozen->parameters()) p.set_requires_grad(false);
    fc = register_module("fc", torch::nn::Linear(8, 8));
    bn = register_module("bn", torch::nn::BatchNorm1d(8));
    bn->running_var.fill_(1.0 + dp_group()->rank());
  }
  at::Tensor forward(const at::Tensor& x) { return bn->forward(fc->forward(frozen->forward(x))); }
  torch::nn::Linear frozen{nullptr}, fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(BnBlock);

struct InitNet : torch::nn::Module {
  InitNet() {
    block = register_module("block", zero::Unit<BnBlock>());
    head = register_parameter("head", at::randn({8, 1}));
  }
  at::Tensor loss(const at::Tensor& x) { return at::matmul(block->forward(x), head).pow(2).mean(); }
  zero::Unit<BnBlock> block{nullptr};
  at::Tensor head;
};

TEST(FrozenAndBuffers, ZeroInitSyncsThemFromRankZero) {
  const auto cfg = toy_config(3, 4, 0);
  at::manual_seed(rank_seed());
  std::shared_ptr<InitNet> m;
  {
    zero::Init init(world().comm(), dp_group(), cfg);
    m = std::make_shared<InitNet>();
  }
  auto& inner = m->block->inner;
  EXPECT_TRUE(same_on_all_ranks(inner->frozen->weight));
  EXPECT_TRUE(same_on_all_ranks(inner->bn->running_var));
  zero::Engine e(*m, cfg, world().comm(), dp_group());
  e.backward(m->loss(at::randn({4, 8})));
  e.step();
  EXPECT_TRUE(same_on_all_ranks(inner->bn->running_mean));
}

// ---- 2. a grad that arrives twice in one backward ------------------------------

using Piece = std::function<at::Tensor(const at::Tensor&)>;

// Recompute-style activation checkpointing, as torch.utils.checkpoint's
// reentrant variant (the C++ frontend has none): forward runs the piece
// without keeping its graph; backward runs it again with grad and
// backpropagates through it in a nested backward, where the params it uses
// get their grads -- a weight used in two pieces gets two.
struct Recompute : torch::autograd::Function<Recompute> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor x, int64_t piece) {
    ctx->save_for_backward({x});
    ctx->saved_data["piece"] = piece;
    return (*reinterpret_cast<const Piece*>(piece))(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    const auto* piece = reinterpret_cast<const Piece*>(ctx->saved_data["piece"].toInt());
    at::Tensor y;
    {
      at::AutoGradMode grad(true);
      y = (*piece)(x);
    }
    torch::autograd::backward({y}, {grad_out[0]});
    return {x.grad(), at::Tensor()};
  }
};

// `shared` is used in both checkpointed pieces (at stage 3 it is a unit of
// its own, gathered again for each recompute); the rest is plain.
struct RecomputeNet : torch::nn::Module {
  explicit RecomputeNet(bool checkpoint) : checkpoint(checkpoint) {
    at::manual_seed(21);
    in = register_module("in", torch::nn::Linear(8, 8));
    shared = register_module("shared", zero::Unit<torch::nn::Linear>(8, 8));
    b = register_module("b", torch::nn::Linear(8, 8));
    head = register_module("head", torch::nn::Linear(8, 1));
    first = [this](const at::Tensor& h) { return at::tanh(shared->forward(h)); };
    second = [this](const at::Tensor& h) { return at::tanh(b->forward(shared->forward(h))); };
  }
  at::Tensor run(const Piece& p, const at::Tensor& h) {
    return checkpoint ? Recompute::apply(h, reinterpret_cast<int64_t>(&p)) : p(h);
  }
  at::Tensor loss(const at::Tensor& x) { return head->forward(run(second, run(first, in->forward(x)))).pow(2).mean(); }
  bool checkpoint;
  torch::nn::Linear in{nullptr}, b{nullptr}, head{nullptr};
  zero::Unit<torch::nn::Linear> shared{nullptr};
  Piece first, second;
};

// Grads equal the same model's without checkpointing, at every stage, with
// overlap on and off. The first backward learns that `shared` gets two
// arrivals (its group was reduced at the first and is reduced again);
// later steps issue exactly the plain model's collectives.
TEST(RepeatedGrads, RecomputedPiecesSharingAWeightMatchThePlainModel) {
  for (int stage : {0, 1, 2, 3})
    for (bool overlap : {false, true}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + (overlap ? " overlap" : ""));
      auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                    {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                                    {"zero_optimization", {{"stage", stage}, {"overlap_comm", overlap},
                                                           {"reduce_bucket_size", 100},
                                                           {"stage3_param_persistence_threshold", 0}}}});
      std::map<std::string, at::Tensor> params[2];
      zero::comm::OpCounts first_step[2], later_steps[2];
      for (bool checkpoint : {false, true}) {
        RecomputeNet m(checkpoint);
        zero::Engine e(m, cfg, world().comm(), dp_group());
        for (int step = 0; step < 4; ++step) {
          at::manual_seed(1000 + step);
          auto x = at::randn({4 * world().size(), 8}).narrow(0, 4 * dp_group()->rank(), 4);
          const auto before = world().comm().counters().totals();
          e.backward(m.loss(x));
          e.step();
          for (auto& [op, c] : zero::comm::diff(world().comm().counters().totals(), before))
            (step == 0 ? first_step : later_steps)[checkpoint][op] += c;
        }
        params[checkpoint] = e.full_parameters();
      }
      EXPECT_LT(max_abs_diff(params[1], params[0]), 1e-6);
      // With overlap, the first step reduced `shared`'s group at its first
      // arrival and again after the second: the late path ran.
      const char* reduce_op = stage == 0 ? "all_reduce" : "reduce_scatter";
      if (overlap) EXPECT_GT(first_step[1].at(reduce_op).calls, first_step[0].at(reduce_op).calls);
      for (const char* op : {"all_reduce", "reduce_scatter", "allgather"}) {
        const auto calls = [&](int k) {
          return later_steps[k].count(op) ? later_steps[k].at(op).calls : int64_t{0};
        };
        // Stage 3 gathers `shared` again for each recompute: more allgathers, by design.
        if (!(stage == 3 && std::string(op) == "allgather")) EXPECT_EQ(calls(1), calls(0)) << op;
      }
    }
}

// ---- 3. a weight shared between a unit and code outside it ----------------------

// An embedding in a unit whose weight the LM head, outside every unit, also
// uses (registered there as "head", as tied weights are).
struct TiedUnitNet : torch::nn::Module {
  TiedUnitNet() {
    at::manual_seed(41);
    emb = register_module("emb", zero::Unit<torch::nn::Embedding>(16, 8));
    block = register_module("block", zero::Unit<Lin>(at::randn({8, 8}) * 0.5, false));
    head = register_parameter("head", emb->inner->weight);
  }
  at::Tensor loss(const at::Tensor& tokens) {
    auto logits = at::linear(block->forward(emb->forward(tokens)), head);
    return at::cross_entropy_loss(logits.view({-1, 16}), tokens.roll(1, 1).reshape(-1));
  }
  zero::Unit<torch::nn::Embedding> emb{nullptr};
  zero::Unit<Lin> block{nullptr};
  at::Tensor head;
};

// The tied weight belongs to the root (which outlives all its uses): stage 3
// trains with parity to a single process, with or without zero::Init.
TEST(SharedWeights, TiedAcrossAUnitTrainsWithParity) {
  for (int stage : {0, 1, 2, 3})
    for (bool zero_init : {false, true}) {
      if (zero_init && stage != 3) continue;
      SCOPED_TRACE("stage " + std::to_string(stage) + (zero_init ? " zero::Init" : ""));
      const auto cfg = toy_config(stage, 4, 0);
      std::shared_ptr<TiedUnitNet> m;
      if (zero_init) {
        zero::Init init(world().comm(), dp_group(), cfg);
        m = std::make_shared<TiedUnitNet>();
      } else {
        m = std::make_shared<TiedUnitNet>();
      }
      TiedUnitNet ref;
      zero::Engine e(*m, cfg, world().comm(), dp_group());
      zero::Engine er(ref, toy_config(0, 4 * world().size()), world().comm(), solo_group());
      for (int step = 0; step < 4; ++step) {
        at::manual_seed(1200 + step);
        auto tokens = at::randint(16, {4 * world().size(), 6}, at::kLong);
        e.backward(m->loss(tokens.narrow(0, 4 * dp_group()->rank(), 4)));
        e.step();
        er.backward(ref.loss(tokens));
        er.step();
      }
      EXPECT_LT(max_abs_diff(e.full_parameters(), er.full_parameters()), 1e-5);
    }
}

// ---- 6. stage 3: params outside their unit's forward ------------------------------

// Read, modify and write back: the modifier rank's values land in every
// rank's params and in the fp32 masters (16-bit params: only the elements
// that changed, so the others keep their fp32 bits), and training goes on
// as in a single process given the same change.
TEST(GatheredParameters, ReadModifyAndWriteBackAtEveryStage) {
  for (const char* dtype : {"fp32", "bf16"})
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE(std::string(dtype) + " stage " + std::to_string(stage));
      auto config = [&](int st, int64_t micro) {
        nlohmann::json j = {{"train_micro_batch_size_per_gpu", micro},
                            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                            {"zero_optimization", {{"stage", st}, {"stage3_param_persistence_threshold", 0}}}};
        if (std::string(dtype) == "bf16") j["bf16"] = {{"enabled", true}};
        return Config::from_json(j);
      };
      UnitNet m, ref;
      zero::Engine e(m, config(stage, 4), world().comm(), dp_group());
      zero::Engine er(ref, config(0, 4 * world().size()), world().comm(), solo_group());
      step_with_reference(e, m, er, ref, 1300, 8);
      const auto before = e.state_dict();
      const int modifier = world().size() - 1;
      {
        auto full = e.gathered_parameters({m.a->inner->w, m.d->inner->s}, modifier);
        // Full values on every rank, equal to the reference's.
        EXPECT_LT((m.a->inner->w.to(at::kFloat) - ref.a->inner->w.to(at::kFloat)).abs().max().item<double>(), 1e-5);
        at::NoGradGuard no_grad;
        m.a->inner->w.fill_(dp_group()->rank() == modifier ? 0.25 : -7.0);  // only the modifier's survives
        m.d->inner->s[0] = dp_group()->rank() == modifier ? 2.0 : -7.0;
        full.finish();
      }
      {
        auto full = er.gathered_parameters({ref.a->inner->w, ref.d->inner->s}, 0);
        at::NoGradGuard no_grad;
        ref.a->inner->w.fill_(0.25);
        ref.d->inner->s[0] = 2.0;
      }
      const auto after = e.state_dict();
      EXPECT_TRUE(after.at("a.inner.w").eq(0.25).all().item<bool>());
      EXPECT_EQ(after.at("d.inner.s")[0].item<float>(), 2.0f);
      EXPECT_TRUE(after.at("d.inner.s").narrow(0, 1, 7).equal(before.at("d.inner.s").narrow(0, 1, 7)))
          << "untouched elements keep their fp32 master bits";
      EXPECT_TRUE(after.at("head").equal(before.at("head")));
      for (int step = 0; step < 3; ++step) step_with_reference(e, m, er, ref, 1301 + step, 8);
      EXPECT_LT(max_abs_diff(e.state_dict(), er.state_dict()), std::string(dtype) == "bf16" ? 2e-2 : 1e-5);
    }
}

// The whole model by name -- tied params under each name, frozen params and
// buffers -- as the plain model registers it; rank0_only leaves the others
// empty; save_weights writes what zero-ckpt consolidate would, and
// load_weights reads it back.
TEST(GatheredParameters, StateDictAndSaveWeightsHoldTheWholeModel) {
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TiedUnitNet m, plain;
    zero::Engine e(m, toy_config(stage, 4, 0), world().comm(), dp_group());
    const auto sd = e.state_dict();
    std::set<std::string> want;
    for (const auto& p : plain.named_parameters()) want.insert(p.key());
    std::set<std::string> got;
    for (const auto& [name, t] : sd) got.insert(name);
    EXPECT_EQ(got, want);
    EXPECT_TRUE(sd.at("head").equal(sd.at("emb.inner.weight")));
    EXPECT_TRUE(sd.at("head").equal(plain.head));
    const auto r0 = e.state_dict(/*rank0_only=*/true);
    EXPECT_EQ(r0.empty(), dp_group()->rank() != 0);
    const std::string path = ckpt_dir("save-weights-" + std::to_string(stage)) + ".safetensors";
    e.save_weights(path);
    TiedUnitNet other;
    {
      at::NoGradGuard no_grad;
      other.head.mul_(2);
    }
    zero::Engine eo(other, toy_config(stage, 4, 0), world().comm(), dp_group());
    eo.load_weights(path);
    EXPECT_EQ(max_abs_diff(eo.state_dict(), sd), 0.0);
    world().comm().barrier(world().group())->wait();
    if (world().rank() == 0) std::filesystem::remove(path);
  }
}

// Outside a gathered scope a released param cannot be read: the process
// stops with a message naming it and the way out, instead of a
// segmentation fault or garbage.
TEST(GatheredParametersDeathTest, ReadingAReleasedParamNamesIt) {
  GTEST_FLAG_SET(death_test_style, "fast");
  UnitNet m;
  zero::Engine e(m, toy_config(3, 4, 0), world().comm(), dp_group());
  EXPECT_DEATH(std::printf("%f\n", m.a->inner->w.sum().item<double>()),
               "param 'a.inner.w' \\(unit 'a'\\) was read or written while released.*gathered_parameters");
}

// ---- 4. ranks that disagree -----------------------------------------------------

// A model whose shape depends on the rank (or which params are frozen) is
// refused at construction on every rank, naming the first difference --
// before it could train garbage with mismatched shards.
struct RankDependentNet : torch::nn::Module {
  RankDependentNet(int64_t width, bool freeze_head) {
    fc = register_module("fc", torch::nn::Linear(8, width));
    head = register_module("head", torch::nn::Linear(width, 1));
    if (freeze_head) head->weight.set_requires_grad(false);
  }
  torch::nn::Linear fc{nullptr}, head{nullptr};
};

TEST(RankMismatch, DifferentModelsAreNamedAtConstruction) {
  if (world().size() < 2) GTEST_SKIP();
  const bool odd = dp_group()->rank() == world().size() - 1;
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    RankDependentNet wider(odd ? 9 : 8, false);
    expect_error([&] { zero::Engine e(wider, toy_config(stage, 4), world().comm(), dp_group()); },
                 "hold different models (every rank must build the same one): entry #1 of the model's params and "
                 "buffers is param 'fc.weight' [8, 8] Float (trainable) on rank 0 but param 'fc.weight' [9, 8] Float");
    RankDependentNet frozen(8, odd);
    expect_error([&] { zero::Engine e(frozen, toy_config(stage, 4), world().comm(), dp_group()); },
                 "param 'head.weight' [1, 8] Float (trainable) on rank 0 but param 'head.weight' [1, 8] Float (frozen)");
  }
  // The group is intact: training goes on.
  WithUnused m;
  zero::Engine e(m, toy_config(2, 4), world().comm(), dp_group());
  e.backward(m.loss(at::randn({4, 13})));
  EXPECT_TRUE(e.step());
}

// ---- 11. fp16 overflow, reported as DeepSpeed reports it -------------------------

TEST(Reporting, SkippedFp16StepSaysSoWithTheNewScale) {
  auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                {"fp16", {{"enabled", true}, {"initial_scale_power", 8}, {"hysteresis", 1}}},
                                {"optimizer", {{"type", "AdamW"}}},
                                {"zero_optimization", {{"stage", 2}}}});
  WithUnused m;
  zero::Engine e(m, cfg, world().comm(), dp_group());
  e.backward(m.loss(at::randn({4, 13})) * std::numeric_limits<float>::infinity());
  testing::internal::CaptureStderr();
  EXPECT_FALSE(e.step());
  const std::string said = testing::internal::GetCapturedStderr();
  if (dp_group()->rank() == 0)
    EXPECT_NE(said.find("OVERFLOW! Skipping step 1. Attempted loss scale: 256, reducing to 128"), std::string::npos)
        << said;
  else
    EXPECT_EQ(said, "") << "one line, from rank 0";
}

// ---- 5. stage 3: unit order diverging after the first step ------------------------

// Four units of one size, so only the unit a gather is for tells them apart.
struct SameUnitsNet : torch::nn::Module {
  SameUnitsNet() {
    at::manual_seed(31);
    for (int i = 0; i < 4; ++i)
      units.push_back(register_module("u" + std::to_string(i), zero::Unit<Lin>(at::randn({8, 8}) * 0.5, false)));
    head = register_parameter("head", at::randn({8, 1}));
  }
  at::Tensor loss(const at::Tensor& x, bool swap_middle) {
    auto h = units[0]->forward(x);
    h = swap_middle ? units[1]->forward(units[2]->forward(h)) : units[2]->forward(units[1]->forward(h));
    return at::matmul(units[3]->forward(h), zero::compute(head)).pow(2).mean();
  }
  std::vector<zero::Unit<Lin>> units;
  at::Tensor head;
};

// Two steps in the same order (the second prefetching along the first's
// record), then the last rank swaps two units: every rank fails within
// seconds, naming the units, on shared memory and on Gloo -- not a generic
// timeout after ZERO_COLLECTIVE_TIMEOUT_S.
TEST(UnitOrder, DivergingInALaterStepIsNamedOnEveryRankWithinSeconds) {
  if (world().size() < 2) GTEST_SKIP();
  for (bool fast_path : {true, false}) {
    SCOPED_TRACE(fast_path ? "shared memory" : "gloo");
    const int64_t unit = 64 + 16 * world().size();  // a unit's padded size
    auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                  {"optimizer", {{"type", "AdamW"}}},
                                  {"zero_optimization", {{"stage", 3}, {"stage3_param_persistence_threshold", 0},
                                                         {"stage3_max_reuse_distance", 0},
                                                         {"stage3_prefetch_bucket_size", 2 * unit},
                                                         {"stage3_max_live_parameters", 3 * unit}}},
                                  {"zero_cpp", {{"comm_fast_path", fast_path}}}});
    SameUnitsNet m;
    zero::Engine e(m, cfg, world().comm(), fresh_dp_group());
    const bool odd = dp_group()->rank() == world().size() - 1;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      for (int step = 0; step < 3; ++step) {
        auto x = at::randn({4, 8});
        e.backward(m.loss(x, step == 2 && odd));
        e.step();
      }
      ADD_FAILURE() << "no error";
    } catch (const zero::comm::CollectiveMismatch& err) {
      const std::string msg = err.what();
      EXPECT_NE(msg.find("different orders"), std::string::npos) << msg;
      EXPECT_NE(msg.find("unit 'u"), std::string::npos) << msg;
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    world().comm().set_fast_paths_enabled(true);
  }
}

// ---- 8. resuming with another accumulation count ----------------------------------

// Saved by 2 ranks x 2 micro-batches, resumed on 1 rank x 4 (the same global
// batch of 8): the step boundary falls after 4 micro-batches, training goes
// on as a run on 1 rank from the start, the next save works, and one line
// says what changed.
TEST(Resume, AnotherAccumulationCountResumesAtAStepBoundary) {
  if (world().size() != 2) GTEST_SKIP() << "2 ranks resume as 1";
  const auto dir = ckpt_dir("resume-gas");
  auto spec = [](int64_t gas) {
    RunSpec s;
    s.stage = 2;
    s.micro = 2;
    s.gas = gas;
    return s;
  };
  {
    GptTrainer t(small_gpt(), make_config(spec(2)), corpus(), 7, world().comm(), dp_group());
    for (int i = 0; i < 3; ++i) t.train_step();
    t.save(dir);
  }
  GptTrainer ref(small_gpt(), make_config(spec(4)), corpus(), 7, world().comm(), solo_group());
  std::vector<double> want, got;
  for (int i = 0; i < 6; ++i) {
    const double l = ref.train_step().loss;
    if (i >= 3) want.push_back(l);
  }
  GptTrainer resumed(small_gpt(), make_config(spec(4)), corpus(), 7, world().comm(), solo_group());
  testing::internal::CaptureStderr();
  resumed.resume(dir);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("with 1 rank x 4 micro-batches of 2 per step (saved with 2 ranks x 2 micro-batches of 2 "
                      "per step); global batch 8 unchanged"),
            std::string::npos)
      << said;
  for (int i = 0; i < 3; ++i) got.push_back(resumed.train_step().loss);
  EXPECT_TRUE(resumed.engine().is_gradient_accumulation_boundary() == false);
  EXPECT_EQ(resumed.engine().micro_steps(), 6 * 4);
  EXPECT_LT(max_rel_loss_diff(got, want), kLossRelTol);
  EXPECT_LT(max_abs_diff(resumed.engine().full_parameters(), ref.engine().full_parameters()), kParamAbsTol);
  const auto again = ckpt_dir("resume-gas-again-" + std::to_string(world().rank()));
  EXPECT_NO_THROW(resumed.save(again));
  std::filesystem::remove_all(again);
  remove_dir(dir);
}

// SGD's momentum is not Adam's moments: loading one into the other is an
// error that says so (it used to load exp_avg as momentum silently).
TEST(Resume, AnotherOptimizersStateIsRefused) {
  const auto dir = ckpt_dir("other-optimizer");
  {
    WithUnused m;
    zero::Engine e(m, toy_config(1, 4), world().comm(), dp_group());
    e.backward(m.loss(at::randn({4, 13})));
    e.step();
    e.save_checkpoint(dir, "adamw");
  }
  WithUnused m;
  auto sgd = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.01}, {"momentum", 0.9}}}}},
                                {"zero_optimization", {{"stage", 1}}}});
  zero::Engine e(m, sgd, world().comm(), dp_group());
  expect_error([&] { e.load_checkpoint(dir); }, "holds optimizer state of AdamW; this engine's optimizer is SGD");
  e.backward(m.loss(at::randn({4, 13})));  // refused before anything was read: trains on
  EXPECT_TRUE(e.step());
  remove_dir(dir);
}

// ---- 7. a plain loss.backward() --------------------------------------------------

// loss.backward() instead of engine.backward(loss): the engine notices the
// first grad, scales grads by 1 / gradient_accumulation_steps on their way
// in (what engine.backward does to the loss) and reduces as usual -- bit for
// bit the same as engine.backward with 2 accumulation steps (a power of two:
// the scaling is exact either way).
TEST(PlainBackward, EqualsEngineBackwardAtEveryStage) {
  for (const char* dtype : {"fp32", "bf16"})
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE(std::string(dtype) + " stage " + std::to_string(stage));
      nlohmann::json j = {{"train_micro_batch_size_per_gpu", 4},
                          {"gradient_accumulation_steps", 2},
                          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                          {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 0}}}};
      if (std::string(dtype) == "bf16") j["bf16"] = {{"enabled", true}};
      std::map<std::string, at::Tensor> params[2];
      for (bool plain : {false, true}) {
        UnitNet m;
        zero::Engine e(m, Config::from_json(j), world().comm(), dp_group());
        for (int micro = 0; micro < 6; ++micro) {
          at::manual_seed(1100 + micro);
          auto loss = m.loss(at::randn({4 * world().size(), 8}).narrow(0, 4 * dp_group()->rank(), 4));
          if (plain) loss.backward();
          else e.backward(loss);
          e.step();
        }
        EXPECT_EQ(e.global_steps(), 3);
        params[plain] = e.full_parameters();
      }
      EXPECT_EQ(max_abs_diff(params[1], params[0]), 0.0);
    }
}

// fp16 needs its loss scaled before backward, which only engine.backward
// can do: a plain backward is refused on every rank, naming the fix, and
// the engine trains on (at stage 3 too, whose unit hooks ran first).
TEST(PlainBackward, Fp16IsRefusedWithTheFix) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                  {"fp16", {{"enabled", true}, {"initial_scale_power", 8}}},
                                  {"optimizer", {{"type", "AdamW"}}},
                                  {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 0}}}});
    UnitNet m;
    zero::Engine e(m, cfg, world().comm(), dp_group());
    auto x = at::randn({4, 8});
    expect_error([&] { m.loss(x).backward(); }, "call engine.backward(loss)");
    for (int step = 0; step < 2; ++step) {
      e.backward(m.loss(x));
      EXPECT_TRUE(e.step());
    }
  }
}

// Recompute-style checkpointing under a plain loss.backward(): the grads of
// nested backwards belong to the enclosing one, which ends when its last
// graph task does -- also when the first grad arrives inside a nested one
// (`first_in_nested`: the checkpointed piece is the last op before the loss).
TEST(PlainBackward, NestedBackwardsOfRecomputationEqualEngineBackward) {
  for (bool first_in_nested : {false, true})
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + (first_in_nested ? ", first grad in a nested backward" : ""));
      auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                    {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                                    {"zero_optimization", {{"stage", stage}, {"overlap_comm", true},
                                                           {"reduce_bucket_size", 100},
                                                           {"stage3_param_persistence_threshold", 0}}}});
      std::map<std::string, at::Tensor> params[2];
      for (bool plain : {false, true}) {
        RecomputeNet m(true);
        zero::Engine e(m, cfg, world().comm(), dp_group());
        for (int step = 0; step < 3; ++step) {
          at::manual_seed(1400 + step);
          auto x = at::randn({4 * world().size(), 8}).narrow(0, 4 * dp_group()->rank(), 4);
          auto loss = first_in_nested ? m.run(m.second, m.run(m.first, m.in->forward(x))).pow(2).mean() : m.loss(x);
          if (plain) loss.backward();
          else e.backward(loss);
          e.step();
        }
        params[plain] = e.full_parameters();
      }
      EXPECT_LT(max_abs_diff(params[1], params[0]), 1e-6);
    }
}

// A plain backward that fails inside autograd never reaches its end; the
// retry (or the next step()) drops what it left, and training goes on as if
// it had not happened.
struct FailOnce : torch::autograd::Function<FailOnce> {
  static at::Tensor forward(torch::autograd::AutogradContext*, at::Tensor x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list g) {
    if (armed) {
      armed = false;
      throw std::runtime_error("injected failure in backward");
    }
    return {g[0]};
  }
  static inline bool armed = false;
};

TEST(PlainBackward, RetryAfterAFailedBackward) {
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    UnitNet m, ref;
    zero::Engine e(m, toy_config(stage, 4, 0), world().comm(), dp_group());
    zero::Engine er(ref, toy_config(stage, 4, 0), world().comm(), dp_group());
    for (int step = 0; step < 3; ++step) {
      at::manual_seed(1500 + step);
      auto x = at::randn({4, 8});
      // A loss whose backward first reaches some params (the head), then fails.
      auto loss = [&](UnitNet& net) {
        auto h = FailOnce::apply(net.a->forward(x));
        return at::matmul(net.d->forward(net.c->forward(net.b->forward(h))), zero::compute(net.head)).pow(2).mean();
      };
      FailOnce::armed = step == 1;
      if (step == 1) expect_error([&] { loss(m).backward(); }, "injected failure");
      loss(m).backward();
      e.step();
      loss(ref).backward();
      er.step();
    }
    EXPECT_EQ(max_abs_diff(e.full_parameters(), er.full_parameters()), 0.0);
  }
}

}  // namespace
