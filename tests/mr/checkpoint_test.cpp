// Checkpoints: exact resume, resharding to another world size and stage, consolidated weights,
// mismatches named on every rank, resuming with another batching, optimizer or compute dtype,
// and saves that fail (a full disk, one rank's write) undone on every rank.
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <tuple>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <set>

#include <gtest/gtest.h>

#include "fixtures.h"
#include "ckpt/checkpoint_dir.h"

namespace {

using namespace zero::test;

// Save at step 3, load into a fresh engine, steps 4..6: losses and params
// bit for bit those of an uninterrupted run (data order, LR schedule, Adam
// moments, loss scale all restored).
TEST(Checkpoint, ResumeIsExact) {
  for (const char* dtype : {"fp32", "bf16"})
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE(std::string(dtype) + " stage " + std::to_string(stage));
      RunSpec s;
      s.stage = stage;
      s.dtype = dtype;
      const auto dir = ckpt_dir(std::string("exact-") + dtype + std::to_string(stage));
      GptTrainer full(small_gpt(), make_config(s), corpus(), 7, world().comm(), dp_group());
      std::vector<double> want;
      for (int i = 0; i < 6; ++i) want.push_back(full.train_step().loss);
      {
        GptTrainer first(small_gpt(), make_config(s), corpus(), 7, world().comm(), dp_group());
        for (int i = 0; i < 3; ++i) first.train_step();
        first.save(dir);
      }
      GptTrainer resumed(small_gpt(), make_config(s), corpus(), 7, world().comm(), dp_group());
      resumed.resume(dir);
      EXPECT_EQ(resumed.steps_done(), 3);
      EXPECT_EQ(resumed.engine().global_steps(), 3);
      for (int i = 3; i < 6; ++i) EXPECT_EQ(resumed.train_step().loss, want[i]) << "step " << i + 1;
      EXPECT_EQ(max_abs_diff(resumed.engine().full_parameters(), full.engine().full_parameters()), 0.0);
      remove_dir(dir);
    }
}

TEST(Checkpoint, ReshardsToAnotherWorldSizeAndStage) {
  const int n = world().size();
  if (n == 2) {
    expect_reshard(dp_group(), 2, solo_group(), 0, "2to1");
    expect_reshard(dp_group(), 3, dp_group(), 1, "stage3to1");
  } else if (n == 4) {
    expect_reshard(first_ranks(2), 1, dp_group(), 3, "2to4");
    expect_reshard(dp_group(), 3, first_ranks(2), 2, "4to2");
  }
}

// The consolidated file of a stage-3 bf16 run holds its fp32 master weights
// by name; of a stage-3 fp32 run, exactly a stage-0 run's params (the stages
// are bit-identical at 2 ranks); load_weights() puts them back.
TEST(Checkpoint, ConsolidatedWeightsAreTheParams) {
  if (world().size() != 2) GTEST_SKIP() << "the stage-0 identity is exact at 2 ranks";
  RunSpec s0, s3;
  s0.clip = s3.clip = 0.0;  // with clipping the norm's per-group sums differ in the last bit
  s3.stage = 3;
  GptTrainer t0(small_gpt(), make_config(s0), corpus(), 7, world().comm(), dp_group());
  GptTrainer t3(small_gpt(), make_config(s3), corpus(), 7, world().comm(), dp_group());
  for (int i = 0; i < 3; ++i) t0.train_step(), t3.train_step();
  const auto dir = ckpt_dir("consolidate");
  t3.save(dir);
  const std::string out = dir + "-weights.safetensors";
  if (world().rank() == 0) zero::ckpt::consolidate(dir, "", out, "fp32");
  world().comm().barrier(world().group())->wait();
  {
    zero::ckpt::SafetensorsFile f(out);
    const auto want = t0.engine().full_parameters();
    EXPECT_EQ(f.entries().size(), want.size());
    for (const auto& [name, t] : want) {
      ASSERT_TRUE(f.has(name)) << name;
      EXPECT_EQ(f.entry(name).shape, t.sizes().vec()) << name;
      EXPECT_EQ(std::memcmp(f.data(name), t.data_ptr<float>(), t.numel() * 4), 0) << name;
    }
  }
  GptTrainer fresh(small_gpt(), make_config(s3), corpus(), 99, world().comm(), dp_group());
  fresh.engine().load_weights(out);
  EXPECT_EQ(max_abs_diff(fresh.engine().full_parameters(), t0.engine().full_parameters()), 0.0);
  world().comm().barrier(world().group())->wait();
  if (world().rank() == 0) std::filesystem::remove(out);
  remove_dir(dir);
}

TEST(Checkpoint, MismatchesAreNamedOnEveryRank) {
  RunSpec s;
  s.stage = 2;
  const auto dir = ckpt_dir("mismatch");
  {
    GptTrainer t(small_gpt(), make_config(s), corpus(), 7, world().comm(), dp_group());
    t.train_step();
    t.save(dir);
  }
  auto other = small_gpt();
  other.d_model = 32;
  GptTrainer t(other, make_config(s), corpus(), 7, world().comm(), dp_group());
  try {
    t.resume(dir);
    ADD_FAILURE() << "loaded a checkpoint of another model";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("different model"), std::string::npos) << e.what();
  }
  t.train_step();  // refused before anything was written: the engine trains on
  // Truncate one rank's file: every rank fails (none hangs), naming it.
  world().comm().barrier(world().group())->wait();
  const std::string victim = dir + "/step1/rank_1.safetensors";
  if (world().rank() == 0) std::filesystem::resize_file(victim, std::filesystem::file_size(victim) - 100);
  world().comm().barrier(world().group())->wait();
  GptTrainer same(small_gpt(), make_config(s), corpus(), 7, world().comm(), dp_group());
  try {
    same.resume(dir);
    ADD_FAILURE() << "loaded a truncated checkpoint";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("rank_1.safetensors") != std::string::npos || msg.find("another rank") != std::string::npos)
        << msg;
  }
  // Rank 0 had already loaded its shards: the ranks disagree, so training is refused.
  try {
    same.train_step();
    ADD_FAILURE() << "trained on after a load that failed part way";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("load again"), std::string::npos) << e.what();
  }
  remove_dir(dir);
}

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

// DeepSpeed's exclude_frozen_parameters and load_module_strict=False
// (Engine::SaveOptions, LoadOptions::strict): an adapter's checkpoint
// without its frozen base; a strict load names the frozen param missing, a
// non-strict one keeps the model's own.
TEST(Checkpoint, FrozenParamsLeftOutAndKeptOnLoad) {
  const auto dir = ckpt_dir("without-frozen");
  std::map<std::string, at::Tensor> saved;
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    {
      WithUnused m;
      m.unused.set_requires_grad(false);
      zero::Engine e(m, toy_config(stage, 4), world().comm(), dp_group());
      e.backward(m.loss(at::randn({4, 13})));
      e.step();
      e.save_checkpoint(dir, "adapter", nlohmann::json::object(), {/*exclude_frozen_params=*/true});
      saved = e.state_dict();
    }
    WithUnused m;
    m.unused.set_requires_grad(false);
    {
      at::NoGradGuard no_grad;
      m.unused.fill_(7.0);  // this model's own frozen base
      m.used.fill_(0.5);
    }
    zero::Engine e(m, toy_config(stage, 4), world().comm(), dp_group());
    expect_error([&] { e.load_checkpoint(dir, "adapter"); }, "has no frozen param unused");
    zero::Engine::LoadOptions lenient;
    lenient.strict = false;
    e.load_checkpoint(dir, "adapter", lenient);
    const auto now = e.state_dict();
    EXPECT_TRUE(at::equal(now.at("used"), saved.at("used")));
    EXPECT_TRUE(at::equal(now.at("unused"), at::full({5}, 7.0)));
    remove_dir(dir);
  }
}

// DeepSpeed's load_optimizer_states=False and load_module_only=True
// (Engine::LoadOptions): the weights come back either way; the step
// counters too without the optimizer's state, neither in the module-only
// load. Even another optimizer's checkpoint gives its weights.
TEST(Resume, WeightsAloneOrWithTheStepCounters) {
  const auto dir = ckpt_dir("weights-only");
  std::map<std::string, at::Tensor> saved;
  {
    WithUnused m;
    zero::Engine e(m, toy_config(2, 4), world().comm(), dp_group());
    for (int s = 0; s < 3; ++s) {
      at::manual_seed(40 + s);
      e.backward(m.loss(at::randn({4, 13})));
      e.step();
    }
    e.save_checkpoint(dir, "three");
    saved = e.full_parameters();
  }
  for (bool counters : {true, false}) {
    SCOPED_TRACE(counters ? "weights and step counters" : "weights alone");
    WithUnused m;
    zero::Engine e(m, toy_config(2, 4), world().comm(), dp_group());
    at::manual_seed(60);
    e.backward(m.loss(at::randn({4, 13})));
    e.step();  // this engine's own step and state
    e.load_checkpoint(dir, "three", {/*optimizer_state=*/false, /*step_counters=*/counters});
    EXPECT_EQ(max_abs_diff(e.full_parameters(), saved), 0.0);
    EXPECT_EQ(e.global_steps(), counters ? 3 : 1);
  }
  {
    WithUnused m;
    auto sgd = Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                                  {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.01}}}}},
                                  {"zero_optimization", {{"stage", 1}}}});
    zero::Engine e(m, sgd, world().comm(), dp_group());
    e.load_checkpoint(dir, "three", {false, false});
    EXPECT_EQ(max_abs_diff(e.full_parameters(), saved), 0.0) << "an AdamW checkpoint's weights, into SGD";
  }
  remove_dir(dir);
}

// ---- another compute dtype ------------------------------------------------------

// bf16 params, computing in `compute` (zero_cpp.compute_dtype; "auto" picks
// per machine, so a checkpoint may be saved under one and loaded under the other).
Config bf16_config(const char* compute, int stage) {
  return Config::from_json({{"train_micro_batch_size_per_gpu", 4},
                            {"bf16", {{"enabled", true}}},
                            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                            {"zero_optimization", {{"stage", stage}}},
                            {"zero_cpp", {{"compute_dtype", compute}}}});
}

// Steps [from, to) of FrozenBnNet in training mode (BatchNorm's statistics
// move), each rank on its rows of one global batch per step; the losses.
// (Also the failing saves' model, below.)
std::vector<double> train_bn(FrozenBnNet& m, zero::Engine& e, int from, int to) {
  std::vector<double> losses;
  for (int step = from; step < to; ++step) {
    at::manual_seed(900 + step);
    auto x = at::randn({4 * world().size(), 8}).narrow(0, 4 * dp_group()->rank(), 4);
    auto loss = m.loss(x.to(e.compute_dtype()));  // the module computes in that dtype
    losses.push_back(loss.item<double>());
    e.backward(loss);
    e.step();
  }
  return losses;
}

// Frozen params and floating-point buffers follow the compute dtype in the
// module (bf16 compute: bf16). Saved under bf16 compute and loaded under
// fp32, and the reverse: the checkpoint holds them in fp32 (widened, so
// nothing is lost), the load converts them to the loading model's dtype,
// trainable params come back exactly, and training goes on from the saved
// state: its losses are those of the saving run going on within 4% (the two
// compute in different dtypes; they differed by up to 2%), and three steps
// later its params are within 1e-2 of that run's (they were 2.4e-4 apart),
// while a model that had not loaded the checkpoint is more than 0.1 off
// (0.4).
TEST(Checkpoint, LoadsUnderAnotherComputeDtype) {
  const std::vector<std::tuple<const char*, const char*, int>> cases = {{"bf16", "fp32", 3}, {"fp32", "bf16", 1}};
  for (const auto& [from, to, stage] : cases) {
    SCOPED_TRACE(std::string("saved computing in ") + from + ", loaded in " + to + ", stage " + std::to_string(stage));
    const auto dir = ckpt_dir(std::string("compute-") + from);
    FrozenBnNet first(100);
    zero::Engine e1(first, bf16_config(from, stage), world().comm(), dp_group());
    ASSERT_EQ(e1.compute_dtype(), std::string(from) == "bf16" ? at::kBFloat16 : at::kFloat);
    train_bn(first, e1, 0, 3);
    e1.save_checkpoint(dir, "step3");
    const auto saved = module_state(first);
    const auto saved_params = e1.full_parameters();
    if (world().rank() == 0) {
      zero::ckpt::CheckpointReader r(dir, "");
      for (const char* n : {"backbone.weight", "backbone.bias", "bn.running_mean", "bn.running_var"})
        EXPECT_EQ(r.find_replicated(n)->dtype, "F32") << n;
      EXPECT_EQ(r.find_replicated("bn.num_batches_tracked")->dtype, "I64");
    }
    const auto going_on = train_bn(first, e1, 3, 6);

    FrozenBnNet resumed(999);  // other weights, other statistics
    zero::Engine e2(resumed, bf16_config(to, stage), world().comm(), dp_group());
    ASSERT_EQ(e2.compute_dtype(), std::string(to) == "bf16" ? at::kBFloat16 : at::kFloat);
    FrozenBnNet fresh(999);
    zero::Engine e3(fresh, bf16_config(to, stage), world().comm(), dp_group());
    const auto not_loaded = train_bn(fresh, e3, 3, 6);
    try {
      e2.load_checkpoint(dir);
    } catch (const std::exception& err) {
      ADD_FAILURE() << err.what();
      remove_dir(dir);
      continue;
    }
    EXPECT_EQ(e2.global_steps(), 3);
    EXPECT_EQ(max_abs_diff(e2.full_parameters(), saved_params), 0.0);
    const auto got = module_state(resumed);
    for (const char* n : {"backbone.weight", "backbone.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}) {
      const auto& t = got.at(n);
      EXPECT_EQ(t.scalar_type(), std::string(n) == "bn.num_batches_tracked" ? at::kLong : e2.compute_dtype()) << n;
      EXPECT_TRUE(t.equal(saved.at(n).to(t.scalar_type()))) << n;
    }
    const auto losses = train_bn(resumed, e2, 3, 6);
    for (size_t i = 0; i < losses.size(); ++i)
      EXPECT_NEAR(losses[i], going_on[i], 0.04 * std::fabs(going_on[i])) << "step " << i + 4;
    const double d_resumed = max_abs_diff(e2.full_parameters(), e1.full_parameters());
    const double d_fresh = max_abs_diff(e3.full_parameters(), e1.full_parameters());
    EXPECT_LT(d_resumed, 1e-2);
    EXPECT_GT(d_fresh, 0.1);
    remove_dir(dir);
  }
}

// ---- saves that fail --------------------------------------------------------------

// How a save is made to fail, and what its error must say on every rank.
struct Fault {
  std::string cause;                            // in every rank's error, e.g. strerror's text
  std::function<void(const std::string&)> arm;  // before the save (given the checkpoint directory)
  std::function<void()> disarm;                 // right after it
};

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

std::string read_latest(const std::string& dir) {
  std::ifstream f(dir + "/latest");
  std::string t;
  f >> t;
  return t;
}

// Saves step2, trains step 3, then a save of step3 made to fail: every rank
// throws within seconds naming the cause, and nothing of it is left
// (.partial-step3, latest.tmp: on every rank the directory holds what it
// held before). The engine trains on (steps 4, 5); the next save succeeds.
// step2 still loads and resumes exactly: a fresh engine from it takes steps
// 3..5 bit for bit as the engine that saw the failure (so that save left
// its state alone), and the new save loads as that engine's state.
void expect_failed_save_undone(const std::string& dir, const Fault& fault) {
  const auto same_everywhere = [] { world().comm().barrier(world().group())->wait(); };
  FrozenBnNet m(100);
  zero::Engine e(m, toy_config(2, 4), world().comm(), dp_group());
  train_bn(m, e, 0, 2);
  e.save_checkpoint(dir, "step2");
  same_everywhere();
  const auto before = entries(dir);
  ASSERT_EQ(before, (std::set<std::string>{"latest", "step2"}));
  auto losses = train_bn(m, e, 2, 3);

  fault.arm(dir);
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    e.save_checkpoint(dir, "step3");
  } catch (const std::runtime_error& err) {
    error = err.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fault.disarm();
  EXPECT_NE(error.find(fault.cause), std::string::npos) << "rank " << world().rank() << "'s error: " << error;
  EXPECT_LT(seconds, 10.0);
  EXPECT_EQ(entries(dir), before) << "left behind by the failed save";
  EXPECT_EQ(read_latest(dir), "step2");

  for (double l : train_bn(m, e, 3, 5)) losses.push_back(l);
  EXPECT_NO_THROW(e.save_checkpoint(dir, "step5"));
  EXPECT_EQ(read_latest(dir), "step5");
  same_everywhere();
  EXPECT_EQ(entries(dir), (std::set<std::string>{"latest", "step2", "step5"}));

  FrozenBnNet from_good(999);
  zero::Engine eg(from_good, toy_config(2, 4), world().comm(), dp_group());
  eg.load_checkpoint(dir, "step2");
  EXPECT_EQ(train_bn(from_good, eg, 2, 5), losses);
  EXPECT_EQ(max_abs_diff(module_state(from_good), module_state(m)), 0.0);
  FrozenBnNet from_new(555);
  zero::Engine en(from_new, toy_config(2, 4), world().comm(), dp_group());
  en.load_checkpoint(dir);
  EXPECT_EQ(en.global_steps(), 5);
  EXPECT_EQ(max_abs_diff(module_state(from_new), module_state(m)), 0.0);
}

// Only the last rank's shard cannot be written (a file-size limit on that
// process: write() fails with EFBIG): the failure is undone on every rank,
// and every rank's error says what went wrong there.
TEST(SaveFailure, OneRanksWriteFailsAndEveryRankUndoesTheSave) {
  if (world().size() < 2) GTEST_SKIP() << "needs a rank besides the one that fails";
  const bool victim = dp_group()->rank() == dp_group()->size() - 1;
  rlimit saved_limit{};
  sighandler_t saved_handler = SIG_DFL;
  Fault f;
  f.cause = std::strerror(EFBIG);
  f.arm = [&](const std::string&) {
    if (!victim) return;
    getrlimit(RLIMIT_FSIZE, &saved_limit);
    saved_handler = signal(SIGXFSZ, SIG_IGN);  // write() then fails instead of the signal ending the process
    rlimit tiny = saved_limit;
    tiny.rlim_cur = 64;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &tiny), 0);
  };
  f.disarm = [&] {
    if (!victim) return;
    setrlimit(RLIMIT_FSIZE, &saved_limit);
    signal(SIGXFSZ, saved_handler);
  };
  const auto dir = ckpt_dir("one-rank-fails");
  remove_dir(dir);
  expect_failed_save_undone(dir, f);
  remove_dir(dir);
}

// A small tmpfs (root only) filled so that the save runs out of space at
// each of its writes: the shards (every rank), rank 0's manifest, and
// `latest`'s new copy. Each time: ENOSPC named on every rank, nothing left,
// the previous checkpoint intact, and the next save (space freed) succeeds.
TEST(SaveFailure, DiskFullIsUndoneOnEveryRank) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  const std::string mnt = ckpt_dir("disk-full");
  const std::string dir = mnt + "/ckpt", filler = mnt + "/filler";
  auto all_ok = [](bool ok) {
    auto t = at::tensor({ok ? 0.0 : 1.0}, at::kDouble);
    world().comm().all_reduce(world().group(), t)->wait();
    return t.item<double>() == 0;
  };
  std::string why;
  if (world().rank() == 0) {
    std::filesystem::create_directories(mnt);
    if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=512k") != 0) why = std::strerror(errno);
  }
  if (!all_ok(why.empty())) GTEST_SKIP() << "cannot mount a tmpfs: " << why;
  struct Unmount {
    std::string mnt;
    ~Unmount() {
      world().comm().barrier(world().group())->wait();
      if (world().rank() == 0) {
        ::umount2(mnt.c_str(), MNT_DETACH);
        std::filesystem::remove(mnt);
      }
    }
  } unmount{mnt};

  const int64_t page = 4096;
  auto pages = [&](const std::string& path) { return (std::filesystem::file_size(path) + page - 1) / page; };
  // Free space to leave: none; the shards' pages (step2's, the same size);
  // those and the manifest's.
  for (int leave : {0, 1, 2}) {
    SCOPED_TRACE("space left for " + std::string(leave == 0 ? "nothing" : leave == 1 ? "the shards" : "the shards and manifest"));
    Fault f;
    f.cause = std::strerror(ENOSPC);
    f.arm = [&](const std::string& d) {
      if (world().rank() == 0) {
        int64_t keep = 0;
        for (int q = 0; leave >= 1 && q < dp_group()->size(); ++q)
          keep += pages(d + "/step2/" + zero::ckpt::rank_file_name(q)) * page;
        if (leave >= 2) keep += pages(d + "/step2/manifest.json") * page;
        struct statvfs st {};
        ASSERT_EQ(statvfs(mnt.c_str(), &st), 0);
        const int64_t fill = static_cast<int64_t>(st.f_bavail) * st.f_frsize - keep;
        ASSERT_GT(fill, 0);
        std::ofstream(filler) << std::string(static_cast<size_t>(fill), '\0');
        ASSERT_EQ(statvfs(mnt.c_str(), &st), 0);
        ASSERT_EQ(static_cast<int64_t>(st.f_bavail) * st.f_frsize, keep);
      }
      world().comm().barrier(world().group())->wait();
    };
    f.disarm = [&] {
      world().comm().barrier(world().group())->wait();
      if (world().rank() == 0) std::filesystem::remove(filler);
    };
    expect_failed_save_undone(dir, f);
    remove_dir(dir);
  }
}

}  // namespace
