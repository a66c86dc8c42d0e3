// Optimizer param groups: per-group lr and weight decay, the standard
// recipe (no decay on biases and norms), at every stage -- against
// torch::optim::AdamW given the same groups on the whole batch in one
// process. The oracle can fail: the same reference without groups is far off.
#include <torch/optim/adamw.h>

#include "fixtures.h"
#include "optim/lr_schedule.h"

namespace zero::test {
namespace {

// The model: a stock MLP (8 -> 16 -> 1) with a LayerNorm, whose biases and
// norm weights are the recipe's no-decay group.
StockMlp mlp() { return StockMlp(8, 16); }

constexpr double kLr = 0.01, kNoDecayLr = 0.02, kDecay = 0.1;

// The config's optimizer: AdamW at kLr with weight decay kDecay, no clipping
// or schedule (torch's AdamW has neither).
Config group_config(int stage) {
  return Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                            {"gradient_clipping", 0.0},
                            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", kLr}, {"weight_decay", kDecay}}}}},
                            {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 0}}}});
}

std::pair<at::Tensor, at::Tensor> batch(int step) {
  at::manual_seed(900 + step);
  const at::Tensor x = at::randn({4 * dp_group()->size(), 8});
  return {x, x.sum(1, true).sin()};
}

// torch's AdamW on the whole batch: with the recipe's two groups, or one.
std::map<std::string, at::Tensor> torch_reference(bool grouped, int steps) {
  StockMlp ref = mlp();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (grouped) {
    auto recipe = weight_decay_groups(*ref, kDecay);
    groups.emplace_back(recipe[0].params, std::make_unique<torch::optim::AdamWOptions>(
                                              torch::optim::AdamWOptions(kLr).weight_decay(kDecay).eps(1e-8)));
    groups.emplace_back(recipe[1].params, std::make_unique<torch::optim::AdamWOptions>(
                                              torch::optim::AdamWOptions(kNoDecayLr).weight_decay(0).eps(1e-8)));
  } else {
    groups.emplace_back(ref->parameters(), std::make_unique<torch::optim::AdamWOptions>(
                                               torch::optim::AdamWOptions(kLr).weight_decay(kDecay).eps(1e-8)));
  }
  torch::optim::AdamW opt(std::move(groups), torch::optim::AdamWOptions(kLr));
  return train_in_one_process(ref, opt, steps, batch);
}

TEST(ParamGroups, MatchTorchAdamWWithTheSameGroupsAtEveryStage) {
  const int steps = 6;
  const auto want = torch_reference(true, steps);
  const auto ungrouped = torch_reference(false, steps);
  ASSERT_GT(max_abs_diff(want, ungrouped), 1e-3) << "the groups must matter for this oracle";
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    StockMlp model = mlp();
    auto groups = weight_decay_groups(*model, kDecay);
    ASSERT_EQ(groups[1].params.size(), 4u);  // fc1.bias, ln.weight, ln.bias, fc2.bias
    groups[1].lr = kNoDecayLr;
    zero::Engine engine(*model, group_config(stage), world().comm(), dp_group(), groups);
    for (int s = 0; s < steps; ++s) {
      auto [x, y] = batch(s);
      const int r = dp_group()->rank();
      const at::Tensor out = engine.forward(model, x.narrow(0, 4 * r, 4));
      engine.backward((out - y.narrow(0, 4 * r, 4)).pow(2).mean());
      engine.step();
    }
    // fp32 throughout; the kernel and torch's AdamW differ only in rounding.
    EXPECT_LT(max_abs_diff(engine.full_parameters(), want), 2e-5) << worst_param(engine.full_parameters(), want);
  }
}

// The optimizer passed from code (a ds_config without an "optimizer"
// block) trains as the config's: the same torch AdamW reference.
TEST(ParamGroups, ClientOptimizerFromCodeMatchesTheReference) {
  const int steps = 6;
  const auto want = torch_reference(true, steps);
  nlohmann::json j = group_config(1).to_json();
  j.erase("optimizer");
  const Config c = zero::with_optimizer(Config::from_json(j), zero::OptimizerConfig::adamw(kLr, kDecay));
  StockMlp model = mlp();
  auto groups = weight_decay_groups(*model, kDecay);
  groups[1].lr = kNoDecayLr;
  zero::Engine engine(*model, c, world().comm(), dp_group(), groups);
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = batch(s);
    const int r = dp_group()->rank();
    engine.backward((engine.forward(model, x.narrow(0, 4 * r, 4)) - y.narrow(0, 4 * r, 4)).pow(2).mean());
    engine.step();
  }
  EXPECT_LT(max_abs_diff(engine.full_parameters(), want), 2e-5);
}

// A schedule function replaces the config's: lr(k) after k steps, and an
// lr of 0 leaves the params where they were (the update reads it).
TEST(ParamGroups, UserScheduleFunctionDrivesTheLr) {
  StockMlp model = mlp();
  zero::Engine engine(*model, group_config(2), world().comm(), dp_group());
  engine.set_lr_schedule([](int64_t k) { return k < 2 ? 0.0 : 0.001 * static_cast<double>(k); });
  EXPECT_EQ(engine.lr(), 0.0);
  const auto before = engine.full_parameters();
  for (int s = 0; s < 3; ++s) {
    auto [x, y] = batch(s);
    const int r = dp_group()->rank();
    engine.backward((engine.forward(model, x.narrow(0, 4 * r, 4)) - y.narrow(0, 4 * r, 4)).pow(2).mean());
    engine.step();
    if (s == 1) {
      EXPECT_EQ(max_abs_diff(engine.full_parameters(), before), 0.0) << "lr 0 for the first two steps";
    }
  }
  EXPECT_DOUBLE_EQ(engine.lr(), 0.003);
  EXPECT_GT(max_abs_diff(engine.full_parameters(), before), 0.0);
}

// A schedule begun part way (the config's last_batch_iteration k, a resumed
// run's): as DeepSpeed's, nothing is written until its first step, so step 1
// takes the optimizer's own lr, and step s > 1 the schedule's lr(k + s - 1)
// (python_parity "schedule_resumed" holds the same to DeepSpeed's).
TEST(ParamGroups, ScheduleBegunPartWayTakesTheOptimizersLrFirst) {
  StockMlp model = mlp();
  Config c = group_config(1);
  nlohmann::json j = {{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", kLr}}}}},
                      {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_max_lr", 2e-3},
                                                                        {"warmup_num_steps", 8},
                                                                        {"last_batch_iteration", 3}}}}}};
  c.scheduler = Config::from_json(j).scheduler;
  ASSERT_EQ(c.scheduler.last_batch_iteration, 3);
  zero::Engine engine(*model, c, world().comm(), dp_group());
  EXPECT_DOUBLE_EQ(engine.lr(), kLr) << "before its first step";
  for (int s = 1; s <= 3; ++s) {
    auto [x, y] = batch(s);
    const int r = dp_group()->rank();
    engine.backward((engine.forward(model, x.narrow(0, 4 * r, 4)) - y.narrow(0, 4 * r, 4)).pow(2).mean());
    engine.step();
    EXPECT_DOUBLE_EQ(engine.lr(), zero::optim::scheduled_lr(c.scheduler, kLr, 3 + s)) << "after step " << s;
  }
}

// Each group's lr set before every step (set_param_group_lrs, as the Python
// front end pushes torch's param_groups) against torch's AdamW whose two
// groups take the same lrs; ratios between the groups change from step to
// step, which the config's lr scale cannot express.
TEST(ParamGroups, LrsSetPerGroupBeforeEachStepAtEveryStage) {
  const int steps = 5;
  const double decay_lr[steps] = {0.01, 0.005, 0.02, 0.0, 0.01}, no_decay_lr[steps] = {0.02, 0.0, 0.01, 0.03, 0.01};
  StockMlp ref = mlp();
  auto recipe = weight_decay_groups(*ref, kDecay);
  std::vector<torch::optim::OptimizerParamGroup> tg;
  tg.emplace_back(recipe[0].params, std::make_unique<torch::optim::AdamWOptions>(
                                        torch::optim::AdamWOptions(kLr).weight_decay(kDecay).eps(1e-8)));
  tg.emplace_back(recipe[1].params, std::make_unique<torch::optim::AdamWOptions>(
                                        torch::optim::AdamWOptions(kLr).weight_decay(0).eps(1e-8)));
  torch::optim::AdamW opt(std::move(tg), torch::optim::AdamWOptions(kLr));
  const auto want = train_in_one_process<torch::optim::AdamW>(ref, opt, steps, batch, [&](int s, torch::optim::AdamW& o) {
    static_cast<torch::optim::AdamWOptions&>(o.param_groups()[0].options()).lr(decay_lr[s]);
    static_cast<torch::optim::AdamWOptions&>(o.param_groups()[1].options()).lr(no_decay_lr[s]);
  });
  ASSERT_GT(max_abs_diff(want, torch_reference(true, steps)), 1e-4) << "the lrs must matter for this oracle";
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    StockMlp model = mlp();
    auto groups = weight_decay_groups(*model, kDecay);
    zero::Engine engine(*model, group_config(stage), world().comm(), dp_group(), groups);
    for (int s = 0; s < steps; ++s) {
      engine.set_param_group_lrs({kLr, decay_lr[s], no_decay_lr[s]});  // the config's (no params), then each group
      EXPECT_DOUBLE_EQ(engine.lr(), kLr);
      auto [x, y] = batch(s);
      const int r = dp_group()->rank();
      engine.backward((engine.forward(model, x.narrow(0, 4 * r, 4)) - y.narrow(0, 4 * r, 4)).pow(2).mean());
      engine.step();
    }
    EXPECT_LT(max_abs_diff(engine.full_parameters(), want), 2e-5) << worst_param(engine.full_parameters(), want);
    expect_error<std::invalid_argument>([&] { engine.set_param_group_lrs({0.1}); }, "1 lrs given for 3 param groups");
  }
}

// Each group's weight decay set before a step (a weight-decay schedule, as
// the Python front end pushes param_groups[i]["weight_decay"]): decay 0 for
// every group gives exactly the run configured with none, where the
// groups' own decay (0.1) is far off.
TEST(ParamGroups, WeightDecaySetPerGroupBeforeEachStep) {
  auto run = [&](bool zero_by_override, double config_decay) {
    StockMlp model = mlp();
    auto c = group_config(2).to_json();
    c["optimizer"]["params"]["weight_decay"] = config_decay;
    zero::Engine engine(*model, Config::from_json(c), world().comm(), dp_group(), weight_decay_groups(*model, config_decay));
    for (int s = 0; s < 4; ++s) {
      if (zero_by_override) engine.set_param_group_weight_decays({0.0, 0.0, 0.0});
      auto [x, y] = batch(s);
      const int r = dp_group()->rank();
      engine.backward((engine.forward(model, x.narrow(0, 4 * r, 4)) - y.narrow(0, 4 * r, 4)).pow(2).mean());
      engine.step();
    }
    return engine.full_parameters();
  };
  const auto none = run(false, 0.0), overridden = run(true, kDecay), decayed = run(false, kDecay);
  EXPECT_EQ(max_abs_diff(overridden, none), 0.0);
  EXPECT_GT(max_abs_diff(decayed, none), 1e-5) << "the decay must matter for this oracle";
}

// DeepSpeed's OneCycle moves the lr and Adam's beta1 every step: against
// torch's AdamW whose lr and betas are set before each step to the values
// DeepSpeed's scheduler gives (worked by hand for a 2 + 2 step cycle; step
// k runs on the scheduler's iteration k - 2). Fixed betas would be far off.
TEST(ParamGroups, OneCycleMovesLrAndBeta1AsDeepSpeeds) {
  const int steps = 6;
  constexpr double kMin = 0.002, kMax = 0.02, kMid = (kMin + kMax) / 2;
  const double lrs[steps] = {kMin, kMid, kMax, kMid, kMin, kMin};  // iterations -1 .. 4
  const double beta1s[steps] = {0.8, 0.85, 0.8, 0.85, 0.9, 0.9};
  auto reference = [&](bool cycle_betas) {
    StockMlp ref = mlp();
    torch::optim::AdamW opt(ref->parameters(), torch::optim::AdamWOptions(kMin).weight_decay(kDecay).eps(1e-8));
    return train_in_one_process<torch::optim::AdamW>(ref, opt, steps, batch, [&](int s, torch::optim::AdamW& o) {
      auto& options = static_cast<torch::optim::AdamWOptions&>(o.param_groups()[0].options());
      options.lr(lrs[s]);
      if (cycle_betas) options.betas({beta1s[s], 0.99});
    });
  };
  const auto want = reference(true);
  ASSERT_GT(max_abs_diff(want, reference(false)), 1e-4) << "the betas must matter for this oracle";
  nlohmann::json j = group_config(3).to_json();
  j["scheduler"] = {{"type", "OneCycle"},
                    {"params", {{"cycle_min_lr", kMin}, {"cycle_max_lr", kMax}, {"cycle_first_step_size", 2}}}};
  StockMlp model = mlp();
  zero::Engine engine(*model, Config::from_json(j), world().comm(), dp_group());
  for (int s = 0; s < steps; ++s) {
    EXPECT_DOUBLE_EQ(engine.lr(), lrs[s]) << "step " << s + 1;
    auto [x, y] = batch(s);
    const int r = dp_group()->rank();
    engine.backward((engine.forward(model, x.narrow(0, 4 * r, 4)) - y.narrow(0, 4 * r, 4)).pow(2).mean());
    engine.step();
  }
  EXPECT_LT(max_abs_diff(engine.full_parameters(), want), 2e-5) << worst_param(engine.full_parameters(), want);
}

TEST(ParamGroups, BadGroupsAreNamed) {
  StockMlp model = mlp();
  StockMlp other = mlp();
  expect_error<std::invalid_argument>(
      [&] { zero::Engine(*model, group_config(2), world().comm(), dp_group(), {{{other->fc1->weight}, 0.1, {}}}); },
      "not a trainable param of the model");
  expect_error<std::invalid_argument>(
      [&] {
        zero::Engine(*model, group_config(2), world().comm(), dp_group(),
                     {{{model->fc1->weight}, {}, {}}, {{model->fc1->weight}, {}, 0.0}});
      },
      "param 'fc1.weight' is in param group 0 and in group 1");
}

}  // namespace
}  // namespace zero::test
