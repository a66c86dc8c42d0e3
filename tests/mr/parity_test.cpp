// Stages 0-3 against their oracles on real ranks: parity (N ranks x micro-batch b equal
// one process with batch N*b, each rank running that reference itself on a group of one),
// the model-state bytes and the counted communication each stage's formula gives, unused
// params and odd sizes, and 16-bit precision (overflow skipping the step everywhere).
#include <algorithm>
#include <fstream>
#include <sstream>
#include <gtest/gtest.h>

#include "comm/shm_transport.h"
#include "fixtures.h"
#include "memory/shared_arena.h"

namespace {

using namespace zero::test;

TEST(Parity, StagesMatchSingleProcess) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    RunSpec s;
    s.stage = stage;
    auto dist = train(s, dp_group());
    auto ref = reference(s);
    EXPECT_LT(max_rel_loss_diff(dist.losses, ref.losses), kLossRelTol);
    expect_params_close(dist.params, ref.params);
    EXPECT_LT(dist.losses.back(), dist.losses.front() - 0.5) << "the loss falls";
  }
}

TEST(Parity, GradientAccumulationMatchesLargerBatch) {
  for (int stage : {0, 1, 2, 3})
    for (bool contiguous : {true, false}) {
    SCOPED_TRACE("stage " + std::to_string(stage) + " contiguous " + std::to_string(contiguous));
    RunSpec s;
    s.stage = stage;
    s.gas = 2;
    s.contiguous = contiguous;
    auto dist = train(s, dp_group());
    RunSpec big = s;
    big.gas = 1;
    big.micro = s.micro * s.gas;
    auto ref = reference(big);
    EXPECT_LT(max_rel_loss_diff(dist.losses, ref.losses), kLossRelTol);
    expect_params_close(dist.params, ref.params);
  }
}

TEST(Parity, StagesAgreeWithEachOtherAcrossOptions) {
  // Same ranks, same reduction order: stages and overlap/contiguous options
  // change where grads live and when they move, not the arithmetic.
  RunSpec base;
  base.clip = 0.0;  // the norm is summed per shard in stages 1/2; without clipping it is not used
  auto s0 = train(base, dp_group(), 8);
  for (int stage : {1, 2, 3})
    for (bool overlap : {false, true})
      for (bool contiguous : {false, true}) {
        RunSpec s = base;
        s.stage = stage, s.overlap = overlap, s.contiguous = contiguous;
        SCOPED_TRACE("stage " + std::to_string(stage) + " overlap " + std::to_string(overlap) + " contiguous " +
                     std::to_string(contiguous));
        auto r = train(s, dp_group(), 8);
        EXPECT_EQ(r.losses, s0.losses);
        EXPECT_EQ(max_abs_diff(r.params, s0.params), 0.0);
      }
}

TEST(Parity, OneHugeBucketAndTinyBuckets) {
  // A param larger than the bucket gets a group of its own; one bucket holds everything.
  for (int64_t bucket : {int64_t{100}, int64_t{1} << 30}) {
    SCOPED_TRACE("bucket " + std::to_string(bucket));
    RunSpec s;
    s.stage = 2;
    s.bucket = bucket;
    auto dist = train(s, dp_group(), 10);
    auto ref = reference(s, 10);
    EXPECT_LT(max_rel_loss_diff(dist.losses, ref.losses), kLossRelTol);
    EXPECT_LT(max_abs_diff(dist.params, ref.params), kParamAbsTol);
  }
}

TEST(MixedPrecision, Bf16AndFp16TrackFp32) {
  RunSpec s;
  s.stage = 2;
  auto fp32 = train(s, dp_group());
  for (const char* dt : {"bf16", "fp16"})
    for (const char* compute : {dt, "fp32"}) {
      SCOPED_TRACE(std::string(dt) + " computing in " + compute);
      RunSpec m = s;
      m.dtype = dt;
      m.compute = compute;
      GptTrainer t(small_gpt(), make_config(m), corpus(), 7, world().comm(), dp_group());
      RunResult r;
      for (int i = 0; i < 20; ++i) r.losses.push_back(t.train_step().loss);
      EXPECT_EQ(t.engine().skipped_steps(), 0);
      // 16-bit params round each update to 8 (bf16) or 11 (fp16) mantissa bits;
      // the loss curve stays within a few hundredths of fp32's over 20 steps.
      double worst = 0;
      for (size_t i = 0; i < r.losses.size(); ++i) worst = std::max(worst, std::fabs(r.losses[i] - fp32.losses[i]));
      EXPECT_LT(worst, 0.05);
      EXPECT_LT(r.losses.back(), r.losses.front() - 0.5);
    }
}

// communication_data_type "fp32" with 16-bit grads: a widened copy of each
// bucket travels -- twice the grads' bytes on the wire -- and, since the
// host transports already sum 16-bit grads in fp32 and round once, the run
// is the same bit for bit (NCCL, which sums them in 16 bits otherwise, is
// where it changes the sums).
TEST(MixedPrecision, Fp32CommunicationOfSixteenBitGrads) {
  for (int stage : {0, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    RunSpec s;
    s.stage = stage;
    s.dtype = "bf16";
    std::vector<double> losses[2];
    int64_t grad_bytes[2] = {};
    const char* op = stage == 0 ? "all_reduce" : "reduce_scatter";
    for (int wide = 0; wide <= 1; ++wide) {
      Config c = make_config(s);
      if (wide) c.communication_data_type = zero::DType::fp32;
      GptTrainer t(small_gpt(), c, corpus(), 7, world().comm(), dp_group());
      for (int i = 0; i < 4; ++i) {
        const auto rec = t.train_step();
        losses[wide].push_back(rec.loss);
        grad_bytes[wide] = rec.comm.at(op).bytes;
      }
    }
    EXPECT_EQ(losses[0], losses[1]);
    // Twice the grads' bytes; the op's count also holds a scalar or two
    // (the grad norm's all-reduce), the same in both runs.
    EXPECT_NEAR(static_cast<double>(grad_bytes[1]), 2.0 * grad_bytes[0], 64) << op;
    EXPECT_GT(grad_bytes[0], 100000) << op;
  }
  // A 16-bit wire for fp32 grads stays an error naming the key.
  RunSpec f;
  f.stage = 2;
  Config c = make_config(f);
  c.communication_data_type = zero::DType::bf16;
  expect_error<zero::ConfigError>(
      [&] { GptTrainer t(small_gpt(), c, corpus(), 7, world().comm(), dp_group()); }, "communication_data_type");
}

// Formulas in Ψ (unpadded params); padding to 16·N elements per group stays
// well under the 1% tolerance.
TEST(Memory, ModelStateBytesMatchTheStageFormula) {
  const double N = world().size();
  for_each_dtype_and_stage([&](GptTrainer& t, const zero::train::StepRecord&, int stage, double p) {
    const double psi = static_cast<double>(t.engine().num_params());
    // p: param and grad bytes. In fp32 the master weights are the params themselves.
    const double master = p == 4 ? 0 : 4;
    double expect = 0;
    switch (stage) {
      case 0: expect = p * psi + p * psi + master * psi + 8 * psi; break;
      case 1: expect = p * psi + p * psi + (p == 4 ? 0 : 4 * psi / N) + (master + 8) * psi / N; break;
      case 2: expect = p * psi + 4 * psi / N + (master + 8) * psi / N; break;
      // Stage 3: everything sharded, but the persistent groups (root unit)
      // also keep their full params.
      case 3: expect = (p + 4 + master + 8) * psi / N + p * t.engine().persistent_params(); break;
    }
    const double got = static_cast<double>(t.engine().state_bytes().total());
    EXPECT_NEAR(got / expect, 1.0, 0.01) << "got " << got << " expected " << expect;
  });
}

// Stage 2 with overlap_comm reduce-scatters each group during the backward
// and frees its full grad buffer: a later group's buffer of the same size
// takes those pages (memory/shared_arena.h KeepFreedSharedPages), as stage
// 3's grad buffers do. The same losses and params as one process (a reused
// buffer starts from zeros: a stale grad would show), nothing kept once a
// backward is over but the last freed buffer of each size it asked for.
TEST(Memory, Stage2OverlappedGradBuffersTakeFreedPagesWithParity) {
  zero::models::GPTConfig model = small_gpt();
  model.n_layer = 6;  // six blocks of one size
  RunSpec s;
  s.stage = 2;
  s.overlap = true;
  s.bucket = 1;  // a group per param: the blocks' params give groups of equal sizes
  const int steps = 4;
  auto run = [&](const RunSpec& spec, std::shared_ptr<zero::comm::Group> g) {
    GptTrainer t(model, make_config(spec), corpus(), /*seed=*/7, world().comm(), g);
    RunResult r;
    size_t first_carried = 0;
    for (int i = 0; i < steps; ++i) {
      r.losses.push_back(t.train_step().loss);
      const auto arena = zero::memory::shared_arena_stats();
      // After the first step a size is served first from what the one
      // before carried, not mapped afresh: the same buffers are carried on.
      if (i == 0) {
        EXPECT_LE(arena.kept_bytes, arena.fresh_bytes) << "kept past the first backward";
        first_carried = arena.kept_bytes;
      } else {
        EXPECT_EQ(arena.kept_bytes, first_carried) << "step " << i << ": carried other buffers than step 0";
      }
    }
    r.params = t.engine().full_parameters();
    return r;
  };
  const uint64_t before = zero::memory::shared_arena_stats().kept_reuses;
  const RunResult got = run(s, dp_group());
  const uint64_t reuses = zero::memory::shared_arena_stats().kept_reuses - before;
  RunSpec ref = s;
  ref.stage = 0;
  ref.micro *= world().size();
  const RunResult want = run(ref, solo_group());
  // 139 in 4 steps at 2 and 4 ranks when written; 0 with ZERO_KEEP_FREED_PAGES=off.
  EXPECT_GE(reuses, 20u * steps) << "groups' grad buffers took freed ones' pages";
  EXPECT_LT(max_rel_loss_diff(got.losses, want.losses), kLossRelTol);
  expect_params_close(got.params, want.params);
}

// The KiB of peers' shared flat buffers resident in this process's mappings
// (/proc/self/smaps: ranges of another process's "zero-cpp-flat" memfd). They
// are the peers' pages, but a rank's RSS counts every page it has mapped.
int64_t peers_flat_rss_kib() {
  // Read, not made: mapping a range here to learn it would give back the
  // pages carried to the next backward (memory/shared_arena.h).
  const uint64_t own_inode = zero::memory::shared_arena_stats().memfd_inode;
  if (own_inode == 0) return 0;
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool peers = false;
  int64_t kib = 0;
  while (std::getline(smaps, line)) {
    std::istringstream fields(line);
    std::string first;
    fields >> first;
    if (first.empty()) continue;
    if (first.back() != ':') {  // a mapping's header: range, perms, offset, device, inode, path
      std::string perms, offset, device, path;
      uint64_t inode = 0;
      fields >> perms >> offset >> device >> inode;
      std::getline(fields, path);
      peers = path.find("zero-cpp-flat") != std::string::npos && inode != own_inode;
    } else if (peers && first == "Rss:") {
      int64_t value = 0;
      fields >> value;
      kib += value;
    }
  }
  return kib;
}

// Once a step is over no rank holds a view of a peer's pages, at any stage:
// each zero-copy collective drops what it read when it ends
// (comm/shm/peer_buffers.h release_read_pages) -- the peers' param shards
// gathered at stage 3, their grad buffers reduced at every stage. Kept, they
// were 13-15% of a rank's RSS on the ~101M GPT (docs/performance.md, "Where
// a rank's bytes are"); with ZERO_COMM_PEER_PAGES=keep this fails.
TEST(Memory, NoPeersPagesStayInARanksRssAfterAStep) {
  if (!zero::comm::shm_zero_copy(*dp_group())) GTEST_SKIP() << "no zero-copy here";
  for (int stage : {0, 1, 2, 3}) {
    RunSpec s;
    s.stage = stage;
    GptTrainer t(small_gpt(), make_config(s), corpus(), /*seed=*/7, world().comm(), dp_group());
    for (int step = 0; step < 2; ++step) {
      t.train_step();
      EXPECT_EQ(peers_flat_rss_kib(), 0) << "KiB of peers' buffers mapped, stage " << stage << ", step " << step;
    }
  }
}

TEST(Communication, BytesPerStepMatchTheFormula) {
  for_each_dtype_and_stage([&](GptTrainer& t, const zero::train::StepRecord& r, int stage, double e) {
    const double psi = static_cast<double>(t.engine().num_params());
    auto near = [&](const char* op, double want) {
      const double got = r.comm.count(op) ? static_cast<double>(r.comm.at(op).bytes) : 0.0;
      EXPECT_NEAR(got / want, 1.0, 0.01) << op << ": " << got << " bytes, formula " << want;
    };
    if (stage == 0) {
      near("all_reduce", e * psi);  // the grads, once
      EXPECT_EQ(r.comm.count("reduce_scatter"), 0u);
    } else if (stage == 3) {
      // Units: gathered for forward and again for backward; the persistent
      // root is refreshed once after the step. Grads reduce-scattered once: ≈3Ψ.
      const double persistent = static_cast<double>(t.engine().persistent_params());
      near("allgather", e * (2 * (psi - persistent) + persistent));
      near("reduce_scatter", e * psi);
    } else {
      near("reduce_scatter", e * psi);  // grads in
      near("allgather", e * psi);       // updated params out
      EXPECT_EQ(r.comm.at("reduce_scatter").calls, r.comm.at("allgather").calls);
    }
  });
}

// The shared-memory fast path serves every collective of a training step
// at every stage (all ranks of these tests share a host): stage 3's many
// per-unit gathers included, not just the big buckets.
TEST(Communication, FastPathServesEveryCollectiveOfAStep) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    RunSpec s;
    s.stage = stage;
    GptTrainer t(small_gpt(), make_config(s), corpus(), /*seed=*/7, world().comm(), dp_group());
    t.train_step();
    const int64_t zero_copy_before = zero::comm::shm_zero_copy_collectives(*dp_group());
    const auto r = t.train_step();
    const int64_t zero_copy = zero::comm::shm_zero_copy_collectives(*dp_group()) - zero_copy_before;
    ASSERT_FALSE(r.comm.empty());
    for (const auto& [op, c] : r.comm) {
      const auto shm = c.calls_by_transport.find("shm");
      EXPECT_EQ(shm == c.calls_by_transport.end() ? 0 : shm->second, c.calls) << op;
    }
    if (stage == 3) {
      EXPECT_GE(r.comm.at("allgather").calls, 2 * small_gpt().n_layer);
    }
    // The engine's buffers are shared: its gathers and reductions read the
    // peers' in place (the grad norm and the logged loss, small tensors of
    // their own, are staged).
    if (zero::comm::shm_zero_copy(*dp_group())) {
      const auto calls = [&](const char* op) { return r.comm.count(op) ? r.comm.at(op).calls : 0; };
      if (stage == 0) EXPECT_GE(zero_copy, 1);
      else EXPECT_EQ(zero_copy, calls("allgather") + calls("reduce_scatter"));
    }
  }
}

// zero_optimization.compute_grad_norm = false (stages 1-2, no clipping): the
// norm's all-reduce is gone and nothing else changes, bit for bit.
TEST(Communication, SkippingTheGradNormDropsOnlyItsAllReduce) {
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    std::map<std::string, at::Tensor> params[2];
    int64_t all_reduces[2];
    double norm[2];
    for (bool compute : {true, false}) {
      RunSpec s;
      s.stage = stage;
      s.clip = 0;
      s.compute_grad_norm = compute;
      GptTrainer t(small_gpt(), make_config(s), corpus(), /*seed=*/7, world().comm(), dp_group());
      t.train_step();
      const auto r = t.train_step();
      all_reduces[compute] = r.comm.count("all_reduce") ? r.comm.at("all_reduce").calls : 0;
      norm[compute] = t.engine().last_grad_norm();
      params[compute] = t.engine().full_parameters();
    }
    EXPECT_EQ(all_reduces[true] - all_reduces[false], 1);
    EXPECT_TRUE(std::isfinite(norm[true]) && norm[true] > 0);
    EXPECT_TRUE(std::isnan(norm[false]));
    EXPECT_EQ(max_abs_diff(params[true], params[false]), 0.0);
  }
}

TEST(Robustness, UnusedParamsAndOddSizesTrain) {
  for (int stage : {0, 1, 2, 3}) {  // at stage 3 this unit-less model is one root unit
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                  {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
                                  {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 6}}}});
    WithUnused m, ref;
    zero::Engine e(m, cfg, world().comm(), dp_group());
    zero::Engine er(ref, cfg, world().comm(), solo_group());  // reference: the whole batch here
    const auto unused_before = m.unused.clone();
    for (int step = 0; step < 5; ++step) step_with_reference(e, m, er, ref, 100 + step, 13);
    EXPECT_TRUE(at::allclose(m.used, ref.used, 0, 1e-5));
    EXPECT_TRUE(at::allclose(m.bias, ref.bias, 0, 1e-5));
    // No grad ever reached it: Adam with zero grads and no weight decay leaves it.
    EXPECT_TRUE(m.unused.equal(unused_before));
  }
}

TEST(MixedPrecision, Fp16OverflowSkipsTheStepOnAllRanks) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto cfg = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                  {"fp16", {{"enabled", true}, {"initial_scale_power", 8}, {"hysteresis", 1}}},
                                  {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                                  {"zero_optimization", {{"stage", stage}}}});
    WithUnused m;
    zero::Engine e(m, cfg, world().comm(), dp_group());
    auto x = at::randn({4, 13});
    e.backward(m.loss(x));
    EXPECT_TRUE(e.step());
    const auto before = m.used.clone();
    // Only rank 0's grads overflow; every rank must skip.
    auto loss = m.loss(x);
    if (dp_group()->rank() == 0) loss = loss * std::numeric_limits<float>::infinity();
    e.backward(loss);
    EXPECT_FALSE(e.step());
    EXPECT_EQ(e.skipped_steps(), 1);
    EXPECT_EQ(e.loss_scale(), 128.0);  // 2^8 halved
    EXPECT_TRUE(m.used.equal(before));
    e.backward(m.loss(x));
    EXPECT_TRUE(e.step());
    EXPECT_EQ(e.global_steps(), 2);
  }
}

}  // namespace
