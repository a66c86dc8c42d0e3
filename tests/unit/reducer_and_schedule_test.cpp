// The grad reducer and the stage-3 schedule on their own, without an
// engine: a transport for a group of one records every collective asked of
// it (completing it at once), and markers placed in the autograd graph show
// *when* during backward each reduction was launched.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "partition/flat_group.h"
#include "zero/grad_reducer.h"
#include "zero/stage3.h"

namespace {

using namespace zero;

// What a group of one would do, and a log of what was asked.
struct Recorder : comm::Transport {
  std::vector<std::string> log;
  std::string name() const override { return "recorder"; }
  bool supports(const comm::Group&, comm::CollectiveOp, at::ScalarType, int64_t) const override { return true; }
  int64_t wire_bytes(const comm::Group&, comm::CollectiveOp, at::ScalarType, int64_t) const override { return 0; }
  comm::WorkHandle all_gather(const comm::Group&, at::Tensor out, at::Tensor in, const comm::Signature& s) override {
    if (!out.is_same(in)) out.copy_(in);
    return done(s);
  }
  comm::WorkHandle reduce_scatter(const comm::Group&, at::Tensor out, at::Tensor in, comm::ReduceOp,
                                  const comm::Signature& s) override {
    out.copy_(in);  // the sum (and mean) over one rank
    return done(s);
  }
  comm::WorkHandle all_reduce(const comm::Group&, at::Tensor, comm::ReduceOp, const comm::Signature& s) override {
    return done(s);
  }
  comm::WorkHandle broadcast(const comm::Group&, at::Tensor, int, const comm::Signature& s) override { return done(s); }
  comm::WorkHandle barrier(const comm::Group&, const comm::Signature& s) override { return done(s); }

 private:
  struct Done : comm::Work {
    void wait() override {}
    bool is_completed() override { return true; }
  };
  comm::WorkHandle done(const comm::Signature& s) {
    log.push_back(s.text);
    return std::make_shared<Done>();
  }
};

struct Solo {
  std::shared_ptr<Recorder> recorder = std::make_shared<Recorder>();
  comm::Comm comm{recorder};
  comm::Group group{"solo", {0}, 0, nullptr};
  std::vector<std::string>& log() { return recorder->log; }
};

// One flat group per param, of `numel` elements each (so the log tells them apart by size).
std::vector<partition::FlatGroup> groups_of(const std::vector<at::Tensor>& params) {
  std::vector<partition::FlatGroup> groups;
  for (size_t i = 0; i < params.size(); ++i) {
    partition::FlatGroup g;
    g.params = {params[i]};
    g.names = {"p" + std::to_string(i)};
    g.layout = partition::make_group_layout({params[i].numel()}, {0}, 1, partition::kShardAlignElements);
    partition::flatten_into_group(g, at::kFloat);
    groups.push_back(std::move(g));
  }
  return groups;
}

// Appends `what` to the log when the backward reaches it.
struct Marker : torch::autograd::Function<Marker> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor x, int64_t log, int64_t what) {
    ctx->saved_data["log"] = log;
    ctx->saved_data["what"] = what;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    auto* log = reinterpret_cast<std::vector<std::string>*>(ctx->saved_data["log"].toInt());
    log->push_back("marker " + std::to_string(ctx->saved_data["what"].toInt()));
    return {g[0], at::Tensor(), at::Tensor()};
  }
};

at::Tensor mark(const at::Tensor& x, std::vector<std::string>& log, int what) {
  return Marker::apply(x, reinterpret_cast<int64_t>(&log), what);
}

ReducerOptions stage2(bool overlap) {
  ReducerOptions o;
  o.policy = StagePolicy::for_stage(2);
  o.overlap_comm = overlap;
  return o;
}

// Three groups of 20, 40 and 60 elements (padded to 32, 48 and 64). The
// backward reaches their params in the order 1, 0, 2 (later forward ops
// backpropagate first), each branch passing a marker on its way.
struct ThreeGroups {
  at::Tensor a = at::ones({20}).requires_grad_(), b = at::ones({40}).requires_grad_(),
             c = at::ones({60}).requires_grad_();
  std::vector<partition::FlatGroup> groups = groups_of({a, b, c});
  void backward(std::vector<std::string>& log) {
    auto from_c = mark((c * 2).sum(), log, 3);
    auto from_a = mark((a * 2).sum(), log, 2);
    auto from_b = mark((b * 2).sum(), log, 1);
    torch::autograd::backward({from_b + from_a + from_c});
  }
};

std::string rs(int padded) { return "reduce_scatter of " + std::to_string(padded) + " Float (avg) [grads]"; }

TEST(GradReducer, LaunchesReadyGroupsStrictlyInGroupOrder) {
  Solo solo;
  ThreeGroups m;
  auto r = std::make_shared<GradReducer>(m.groups, solo.comm, solo.group, stage2(/*overlap=*/true));
  r->install_hooks();
  r->begin_backward(true);
  m.backward(solo.log());
  r->end_backward();
  // Group 1 is complete first but waits for group 0; both go as soon as
  // group 0's grad is in -- before the backward reaches c's branch (marker
  // 3) -- and group 2 right after c's grad. Then the ranks agree whether any
  // group got grads after its reduction (none here).
  const std::vector<std::string> want = {"marker 1", "marker 2", rs(32), rs(48), "marker 3", rs(64),
                                         "all_reduce of 3 Float (sum) [grads that arrived after their group's reduction]"};
  EXPECT_EQ(solo.log(), want);
}

TEST(GradReducer, WithoutOverlapEverythingIsReducedAtTheEnd) {
  Solo solo;
  ThreeGroups m;
  auto r = std::make_shared<GradReducer>(m.groups, solo.comm, solo.group, stage2(/*overlap=*/false));
  r->install_hooks();
  r->begin_backward(true);
  m.backward(solo.log());
  EXPECT_EQ(solo.log(), (std::vector<std::string>{"marker 1", "marker 2", "marker 3"}));
  r->end_backward();
  EXPECT_EQ(solo.log(), (std::vector<std::string>{"marker 1", "marker 2", "marker 3", rs(32), rs(48), rs(64)}));
}

TEST(GradReducer, FlushReducesWhatBackwardsLeftOnceInOrder) {
  Solo solo;
  ThreeGroups m;
  ReducerOptions o = stage2(true);
  auto r = std::make_shared<GradReducer>(m.groups, solo.comm, solo.group, o);
  r->install_hooks();
  for (int k = 0; k < 2; ++k) {  // two backwards that do not reduce (as inside coalesce_grad_reduction)
    r->begin_backward(false);
    m.backward(solo.log());
    r->end_backward();
  }
  EXPECT_TRUE(r->has_unreduced());
  solo.log().clear();
  r->flush();
  EXPECT_EQ(solo.log(), (std::vector<std::string>{rs(32), rs(48), rs(64)}));
  EXPECT_FALSE(r->has_unreduced());
  // The shard holds both backwards' grads of a (d(2a)/da = 2, twice).
  EXPECT_TRUE(m.groups[0].grad_shard.narrow(0, 0, 20).eq(4.0).all().item<bool>());
}

// `w` used in two recomputed pieces gets its grad twice per backward (two
// nested backwards). The first backward learns it: its group, reduced at
// the first arrival, is reduced again once (a late reduction); the second
// expects two arrivals and reduces once, after both.
TEST(GradReducer, LearnsHowManyTimesAGradArrives) {
  Solo solo;
  at::Tensor w = at::ones({20}).requires_grad_();
  auto groups = groups_of({w});
  auto r = std::make_shared<GradReducer>(groups, solo.comm, solo.group, stage2(true));
  r->install_hooks();
  auto twice = [&] {
    // Each piece backpropagates on its own, as a reentrant checkpoint does.
    for (int piece = 0; piece < 2; ++piece) torch::autograd::backward({(w * 3).sum()});
  };
  r->begin_backward(true);
  twice();
  r->end_backward();
  EXPECT_EQ(r->expected_arrivals(0, 0), 2);
  EXPECT_EQ(r->late_reductions(), 1);
  EXPECT_TRUE(groups[0].grad_shard.narrow(0, 0, 20).eq(6.0).all().item<bool>()) << "both arrivals counted";
  r->zero_grads();
  solo.log().clear();
  r->begin_backward(true);
  twice();
  r->end_backward();
  EXPECT_EQ(r->late_reductions(), 1) << "no late reduction once the count is known";
  EXPECT_EQ(std::count(solo.log().begin(), solo.log().end(), rs(32)), 1);
  EXPECT_TRUE(groups[0].grad_shard.narrow(0, 0, 20).eq(6.0).all().item<bool>());
}

// ---- the stage-3 schedule --------------------------------------------------------

TEST(UnitSchedule, RecordsTheFirstStepAndFollowsItAfter) {
  using Phase = UnitSchedule::Phase;
  UnitSchedule s;
  for (size_t u : {0, 1, 2}) s.use(u, Phase::Forward);
  for (size_t u : {2, 1, 0}) s.use(u, Phase::Backward);
  EXPECT_TRUE(s.recording());
  s.end_step();
  EXPECT_EQ(s.trace().size(), 6u);
  s.use(0, Phase::Forward);
  EXPECT_TRUE(s.following());
  s.use(2, Phase::Forward);  // unit 1 skipped: the order changed
  EXPECT_FALSE(s.following());
  s.reset_position();
  EXPECT_TRUE(s.following());
  // From position 1 (unit 1's forward): unit 0's next use is its backward,
  // after units 1, 2, 2 and 1 are gathered (10 elements each).
  EXPECT_EQ(s.reuse_distance(0, 1, [](size_t) { return 10; }), 40);
  EXPECT_EQ(s.reuse_distance(1, 1, [](size_t) { return 10; }), 0);
  EXPECT_EQ(s.reuse_distance(7, 0, [](size_t) { return 10; }), -1);
}

// Four units of 16 elements. A step drives the runtime as units would:
// each forward gathers and releases, each backward regathers and releases
// once its grads are in.
struct FourUnits {
  std::vector<partition::FlatGroup> groups;
  Solo solo;
  std::unique_ptr<Stage3Runtime> rt;
  explicit FourUnits(Stage3Options o) {
    std::vector<at::Tensor> params;
    for (int i = 0; i < 4; ++i) params.push_back(at::full({16}, i + 1.0).requires_grad_());
    groups = groups_of(params);
    for (auto& g : groups) {
      g.param_shard = g.param_flat.clone();
      partition::release_params(g);
    }
    rt = std::make_unique<Stage3Runtime>(groups, std::vector<bool>(4, false), std::vector<size_t>{0, 1, 2, 3},
                                         std::vector<std::string>{"u0", "u1", "u2", "u3"},
                                         /*root_group=*/static_cast<size_t>(-1), solo.comm, solo.group, o);
  }
  // Returns, per use, how many gathers had been issued when it began.
  std::vector<size_t> step() {
    std::vector<size_t> issued;
    for (size_t u = 0; u < 4; ++u) {
      rt->before_forward(u);
      EXPECT_TRUE(rt->gathered(u));
      EXPECT_TRUE(groups[u].params[0].eq(u + 1.0).all().item<bool>()) << "unit " << u << " holds its values";
      issued.push_back(solo.log().size());
      rt->after_forward(u, at::zeros({1}));
    }
    for (size_t u = 4; u-- > 0;) {
      rt->before_backward(u);
      EXPECT_TRUE(rt->gathered(u));
      issued.push_back(solo.log().size());
      rt->on_grads_complete(u);
    }
    rt->after_backward();
    return issued;
  }
};

TEST(Stage3Schedule, GathersOnDemandInTheFirstStepAndAheadAfter) {
  // Two units in flight at most, three gathered at most, no reuse.
  FourUnits m(Stage3Options{/*prefetch=*/32, /*max_live=*/48, /*reuse=*/0});
  const auto first = m.step();
  EXPECT_EQ(first, (std::vector<size_t>{1, 2, 3, 4, 5, 6, 7, 8})) << "one gather per use, as it comes";
  m.solo.log().clear();
  const auto second = m.step();
  // From the second step gathers run ahead: by unit 0's forward, units 1 and 2 are on their way.
  EXPECT_EQ(second[0], 3u);
  EXPECT_EQ(m.solo.log().size(), 8u) << "still two gathers per unit (no reuse)";
  EXPECT_EQ(m.solo.log()[1], "allgather of 16 Float [params of unit 'u1']");
  EXPECT_LE(m.rt->peak_live_in_forward(), 48);
}

TEST(Stage3Schedule, ReuseKeepsAUnitFromItsForwardToItsBackward) {
  // Unlimited reuse and room: nothing gathered in forward is released
  // before its backward (from the second step), so each unit is gathered once.
  FourUnits m(Stage3Options{/*prefetch=*/0, /*max_live=*/1 << 20, /*reuse=*/1 << 20});
  m.step();
  m.solo.log().clear();
  m.step();
  EXPECT_EQ(m.solo.log().size(), 4u);
}

// Reuse would keep every unit from its forward to its backward, but only
// two fit under the live limit: units kept for reuse are evicted as later
// ones are gathered, and the limit holds.
TEST(Stage3Schedule, EvictsUnitsKeptForReuseToStayUnderTheLimit) {
  FourUnits m(Stage3Options{/*prefetch=*/0, /*max_live=*/32, /*reuse=*/1 << 20});
  m.step();
  m.solo.log().clear();
  m.step();
  EXPECT_GT(m.solo.log().size(), 4u) << "not everything could be kept";
  EXPECT_LE(m.solo.log().size(), 8u);
  EXPECT_LE(m.rt->peak_live_in_forward(), 32);
}

// A unit gathered for its backward stays until its grads are in, whatever
// the live limit: its backward ops read its params (a later unit's gather
// goes over the limit instead of evicting it).
TEST(Stage3Schedule, NeverEvictsAUnitAwaitingItsGrads) {
  FourUnits m(Stage3Options{/*prefetch=*/0, /*max_live=*/16, /*reuse=*/1 << 20});
  m.step();
  m.rt->before_forward(0);
  m.rt->after_forward(0, at::zeros({1}));
  m.rt->before_backward(0);  // gathered for backward, grads not in yet
  m.rt->before_backward(1);  // the next unit's backward starts meanwhile
  EXPECT_TRUE(m.rt->gathered(0));
  EXPECT_TRUE(m.rt->gathered(1));
  m.rt->on_grads_complete(0);
  EXPECT_FALSE(m.rt->gathered(0));
  m.rt->on_grads_complete(1);
  m.rt->after_backward();
}

}  // namespace
