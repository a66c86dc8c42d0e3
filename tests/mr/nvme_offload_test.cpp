// ZeRO-Infinity's optimizer offload to NVMe (offload_optimizer.device
// "nvme"): the fp32 master and optimizer state live in a swap file and in
// memory only during the step. Oracles:
// - the in-memory run of the same config: the swapped state goes to disk
//   and back unchanged and the update is the same kernel over the same
//   values, so losses and params are equal bit for bit, at stages 0-3,
//   fp32 and bf16, with and without the read/write pipelines;
// - Engine::state_bytes(): between steps no master or optimizer byte is
//   resident (bf16), and the swap file holds all of them;
// - checkpoints: a run saved and resumed (on NVMe, and onto the in-memory
//   configuration) continues exactly as the unbroken run;
// - bad paths and a full disk: errors naming the path, at construction;
// - a save's own peak RSS (reset before it): about one group's state.
// Grads go to NVMe with the optimizer's state at stages 2/3 (as DeepSpeed
// swaps them): between the last backward and the step no grad byte is in
// memory, and the run (gradient accumulation, clipping, bf16) is the
// in-memory run bit for bit, the grad norm included.
// Param offload (offload_param.device "nvme", stage 3's shards on disk)
// has the same oracles: the in-memory run bit for bit, alone and with the
// optimizer's state on NVMe too; state_bytes() (no shard resident between
// steps); checkpoints; gathered-params write-backs; buffer_size and
// max_in_cpu as DeepSpeed's.
#include <ATen/CPUGeneratorImpl.h>
#include <sys/mount.h>
#include <system_error>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fixtures.h"

namespace zero::test {
namespace {

namespace fs = std::filesystem;

// A directory every rank of this job names alike, made by rank 0 and seen by all.
std::string swap_dir(const std::string& name) {
  const std::string dir = ckpt_dir("nvme-" + name);
  if (world().rank() == 0) fs::create_directories(dir);
  world().comm().barrier(world().group())->wait();
  return dir;
}

Config with_nvme(const Config& c, const std::string& dir, bool pipeline_read = false, bool pipeline_write = false) {
  nlohmann::json j = c.to_json();
  j["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"},
                                                 {"nvme_path", dir},
                                                 {"pipeline_read", pipeline_read},
                                                 {"pipeline_write", pipeline_write}};
  // Small pieces and a shallow queue: a group's transfer crosses several.
  j["aio"] = {{"block_size", 8192}, {"queue_depth", 4}};
  return Config::from_json(j);
}
Config with_nvme(const RunSpec& s, const std::string& dir, bool pipeline_read = false, bool pipeline_write = false) {
  return with_nvme(make_config(s), dir, pipeline_read, pipeline_write);
}

// offload_param on NVMe in `dir` (every shard on disk: max_in_cpu 0), on
// top of whatever `c` offloads already.
Config with_nvme_params(const Config& c, const std::string& dir, int64_t max_in_cpu = 0, int64_t buffer_count = 5) {
  nlohmann::json j = c.to_json();
  j["zero_optimization"]["offload_param"] = {
      {"device", "nvme"}, {"nvme_path", dir}, {"max_in_cpu", max_in_cpu}, {"buffer_count", buffer_count}};
  j["aio"] = {{"block_size", 8192}, {"queue_depth", 4}};
  return Config::from_json(j);
}

// The same losses and params, bit for bit (state that went to disk and back
// unchanged, updated by the same kernels).
void expect_bitwise_equal(const RunResult& got, const RunResult& want) {
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(max_abs_diff(got.params, want.params), 0.0) << worst_param(got.params, want.params);
}

RunResult train_with(const Config& c, int steps, const std::function<void(Engine&)>& between_steps = {}) {
  GptTrainer t(small_gpt(), c, corpus(), /*seed=*/7, world().comm(), dp_group());
  RunResult r;
  for (int i = 0; i < steps; ++i) {
    r.losses.push_back(t.train_step().loss);
    if (between_steps) between_steps(t.engine());
  }
  r.params = t.engine().full_parameters();
  return r;
}

TEST(NvmeOffload, MatchesTheInMemoryRunBitForBit) {
  const std::string dir = swap_dir("parity");
  for (const char* dtype : {"fp32", "bf16"})
    for (int stage = 1; stage <= 3; ++stage)  // DeepSpeed offloads at stages 1-3
      for (auto [read, write] : {std::pair{false, false}, std::pair{true, true}, std::pair{true, false}}) {
        if ((read || write) && stage != 2 && stage != 3) continue;  // the pipelines at the stages that shard
        SCOPED_TRACE(std::string(dtype) + " stage " + std::to_string(stage) + (read ? " pipeline_read" : "") +
                     (write ? " pipeline_write" : ""));
        RunSpec s;
        s.stage = stage;
        s.dtype = dtype;
        const RunResult want = train_with(make_config(s), 4);
        const RunResult got = train_with(with_nvme(s, dir, read, write), 4, [&](Engine& e) {
          const StateBytes b = e.state_bytes();
          EXPECT_GT(b.nvme, 0);
          // The optimizer state is on disk between steps; so is the master
          // where it is not the params themselves (fp32 on the host).
          EXPECT_EQ(b.optimizer, 0);
          EXPECT_EQ(b.master, 0);
          // The swap files have no name while in use: a rank killed now
          // leaves nothing behind, nothing a resume could read.
          EXPECT_TRUE(fs::is_empty(dir));
        });
        expect_bitwise_equal(got, want);
      }
  EXPECT_TRUE(fs::is_empty(dir));
  remove_dir(dir);
}

// One forward and backward of `t`'s model on random tokens drawn from
// `seed` (the same on every run, so two runs see the same batches); its loss.
double backward_on_random_tokens(GptTrainer& t, uint64_t seed) {
  Engine& e = t.engine();
  const auto& mc = t.model()->config();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor tokens = at::randint(mc.vocab, {e.batch().micro_batch_per_gpu, mc.seq_len + 1}, gen);
  return e.backward(e.forward([&] { return t.model()->loss(tokens.narrow(1, 0, mc.seq_len), tokens.narrow(1, 1, mc.seq_len)); }))
      .item<double>();
}

// Trains `steps` steps by hand (GptTrainer's batches are its own) so that
// `before_step` sees the engine between the last backward and the step,
// when the reduced grads are all there and nothing has read them yet.
struct HandRun {
  RunResult result;
  std::vector<double> grad_norms;
};
HandRun train_by_hand(const Config& c, int steps, const std::function<void(Engine&)>& before_step) {
  GptTrainer t(small_gpt(), c, corpus(), /*seed=*/7, world().comm(), dp_group());
  Engine& e = t.engine();
  HandRun run;
  for (int i = 0; i < steps; ++i) {
    double loss = 0.0;
    for (int64_t j = 0; j < e.batch().gradient_accumulation_steps; ++j) {
      loss += backward_on_random_tokens(t, 1000 * i + 10 * j + world().rank());
      if (e.is_gradient_accumulation_boundary() && before_step) before_step(e);
      e.step();
    }
    run.result.losses.push_back(loss);
    run.grad_norms.push_back(e.last_grad_norm());
  }
  run.result.params = e.full_parameters();
  return run;
}

TEST(NvmeOffload, GradsLeaveMemoryFromReductionToStep) {
  const std::string dir = swap_dir("grads");
  for (const char* dtype : {"fp32", "bf16"})
    for (int stage : {2, 3})
      for (bool overlap : {true, false}) {
        SCOPED_TRACE(std::string(dtype) + " stage " + std::to_string(stage) + (overlap ? " overlap_comm" : ""));
        RunSpec s;
        s.stage = stage;
        s.dtype = dtype;
        s.gas = 3;        // the shards are read back and added to twice per step
        s.clip = 0.05;    // clipped every step: the norm the reductions took is used
        s.overlap = overlap;
        int64_t in_memory = 0;
        const HandRun want = train_by_hand(make_config(s), 3, [&](Engine& e) { in_memory = e.state_bytes().grads; });
        EXPECT_GT(in_memory, 0) << "the oracle: in memory the reduced grads are resident here";
        const HandRun got = train_by_hand(with_nvme(s, dir, true, true), 3, [&](Engine& e) {
          EXPECT_EQ(e.state_bytes().grads, 0) << "a reduced grad shard is still in memory before the step";
        });
        expect_bitwise_equal(got.result, want.result);
        EXPECT_EQ(got.grad_norms, want.grad_norms);
        EXPECT_TRUE(fs::is_empty(dir));
      }
  remove_dir(dir);
}

// /proc/self/status's VmRSS or VmHWM in bytes (-1 if absent).
int64_t status_bytes(const std::string& key) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return -1;
}

// A save streams the state group by group: the memory it adds is about one
// group's state, not the whole rank's (the checkpoint of a model larger
// than memory must not need it all in memory at once). The oracle is the
// save's own peak: the high-water mark is reset just before it (Linux's
// clear_refs 5) and read after it.
TEST(NvmeOffload, ASaveHoldsOneGroupAtATime) {
  const std::string dir = swap_dir("save-memory"), ckpt = ckpt_dir("nvme-save-memory");
  RunSpec s;
  s.stage = 3;
  s.dtype = "bf16";
  zero::models::GPTConfig model = small_gpt();
  model.n_layer = 8;
  model.d_model = 384;  // ~1.8M params a block: ~85 MB of master and moments a rank, a group's ~11 MB
  GptTrainer t(model, with_nvme_params(with_nvme(s, dir), dir), corpus(), 7, world().comm(), dp_group());
  t.train_step();
  const int64_t state = t.engine().state_bytes().nvme;  // master, moments, grads and param shards
  std::ofstream reset("/proc/self/clear_refs");
  reset << "5" << std::flush;
  const int64_t before = status_bytes("VmRSS");
  // The reset took if the high-water mark is now about the current RSS; all ranks agree to go on.
  auto agreed = at::tensor({reset && status_bytes("VmHWM") - before < (8 << 20) ? 0.0 : 1.0}, at::kDouble);
  world().comm().all_reduce(world().group(), agreed)->wait();
  if (agreed.item<double>() != 0) {
    remove_dir(dir);
    GTEST_SKIP() << "this kernel does not let a process reset its peak RSS";
  }
  t.save(ckpt);
  const int64_t added = status_bytes("VmHWM") - before;
  EXPECT_LT(added, state / 4) << "the save added " << (added >> 20) << " MiB to memory for " << (state >> 20)
                              << " MiB of state on NVMe";
  // And it is whole: a fresh engine resumes from it.
  GptTrainer resumed(model, with_nvme_params(with_nvme(s, dir), dir), corpus(), 7, world().comm(), dp_group());
  resumed.resume(ckpt);
  const double want = t.train_step().loss;
  EXPECT_EQ(resumed.train_step().loss, want);
  remove_dir(ckpt);
  remove_dir(dir);
}

// Lion, Adagrad and SGD with momentum keep one state tensor, not two.
TEST(NvmeOffload, OtherOptimizersMatchTheInMemoryRun) {
  const std::string dir = swap_dir("optimizers");
  for (const char* type : {"Lion", "Adagrad", "SGD"}) {
    SCOPED_TRACE(type);
    RunSpec s;
    s.stage = 2;
    s.dtype = "bf16";
    nlohmann::json memory = make_config(s).to_json();
    memory["optimizer"] = {{"type", type}, {"params", {{"lr", 1e-3}}}};
    if (std::string(type) == "SGD") memory["optimizer"]["params"]["momentum"] = 0.9;
    nlohmann::json nvme = with_nvme(s, dir).to_json();
    nvme["optimizer"] = memory["optimizer"];
    const RunResult want = train_with(Config::from_json(memory), 3);
    const RunResult got = train_with(Config::from_json(nvme), 3);
    expect_bitwise_equal(got, want);
  }
  remove_dir(dir);
}

// Trained `steps` steps with `saved` and saved, then `steps` more; resumed
// from the save with each of `onto`: the same steps as the run that never
// stopped, losses and params bit for bit.
void expect_resumes_exactly(const Config& saved, const std::vector<Config>& onto, int steps, const std::string& name) {
  const std::string ckpt = ckpt_dir(name);
  RunResult whole;
  {
    GptTrainer t(small_gpt(), saved, corpus(), 7, world().comm(), dp_group());
    for (int i = 0; i < steps; ++i) t.train_step();
    t.save(ckpt);
    for (int i = 0; i < steps; ++i) whole.losses.push_back(t.train_step().loss);
    whole.params = t.engine().full_parameters();
  }
  for (size_t k = 0; k < onto.size(); ++k) {
    SCOPED_TRACE("resumed onto config " + std::to_string(k));
    GptTrainer t(small_gpt(), onto[k], corpus(), 7, world().comm(), dp_group());
    t.resume(ckpt);
    RunResult resumed;
    for (int i = 0; i < steps; ++i) resumed.losses.push_back(t.train_step().loss);
    resumed.params = t.engine().full_parameters();
    expect_bitwise_equal(resumed, whole);
  }
  remove_dir(ckpt);
}

// Saved with the state on NVMe, resumed on NVMe (0) and in memory (1).
TEST(NvmeOffload, CheckpointsResumeExactlyOnNvmeAndInMemory) {
  const std::string dir = swap_dir("ckpt");
  RunSpec s;
  s.stage = 3;
  s.dtype = "bf16";
  expect_resumes_exactly(with_nvme(s, dir), {with_nvme(s, dir), make_config(s)}, 3, "nvme-ckpt-save");
  remove_dir(dir);
}

// Stage 3's param shards on disk: read in for each gather (ahead along the
// recorded order), written by the step. Alone and with the optimizer's
// state on NVMe; a read-ahead window of 1 and of 5 shards.
TEST(NvmeOffload, ParamsOnNvmeMatchTheInMemoryRunBitForBit) {
  const std::string dir = swap_dir("params");
  for (const char* dtype : {"fp32", "bf16"})
    for (bool optimizer_too : {false, true})
      for (int64_t buffers : {1, 5}) {
        SCOPED_TRACE(std::string(dtype) + (optimizer_too ? " params and optimizer" : " params") + " buffer_count " +
                     std::to_string(buffers));
        RunSpec s;
        s.stage = 3;
        s.dtype = dtype;
        const Config memory = make_config(s);
        const Config nvme =
            with_nvme_params(optimizer_too ? with_nvme(s, dir, true, true) : memory, dir, 0, buffers);
        StateBytes in_memory;
        const RunResult want = train_with(memory, 4, [&](Engine& e) { in_memory = e.state_bytes(); });
        const RunResult got = train_with(nvme, 4, [&](Engine& e) {
          const StateBytes b = e.state_bytes();
          // Between steps no shard is in memory: at least this rank's share
          // of every param (its shards, padded) has left.
          int64_t numel = 0;
          for (const auto& [name, t] : want.params) numel += t.numel();
          const int64_t elem = std::string(dtype) == "fp32" ? 4 : 2;
          EXPECT_GE(in_memory.params - b.params, numel / world().size() * elem);
          EXPECT_GE(b.nvme, numel / world().size() * elem);
          EXPECT_TRUE(fs::is_empty(dir));  // no name: nothing left behind by a killed rank
        });
        expect_bitwise_equal(got, want);
      }
  remove_dir(dir);
}

// The schedules stage 3 users tune, with every shard on disk: gradient
// accumulation (two backwards per step), units kept gathered for reuse,
// prefetch of about one unit with at most two live. (GptTrainer builds the
// model under zero::Init: its units arrive sharded, and the swap adopts each
// as grouping takes it.)
TEST(NvmeOffload, ParamsOnNvmeUnderStage3Schedules) {
  const std::string dir = swap_dir("params-schedules");
  for (int variant = 0; variant < 3; ++variant) {
    RunSpec s;
    s.stage = 3;
    s.dtype = "bf16";
    if (variant == 0) s.gas = 2;
    if (variant == 1) s.reuse_distance = 1'000'000'000;
    if (variant == 2) s.prefetch = 60'000, s.max_live = 120'000;
    SCOPED_TRACE("variant " + std::to_string(variant));
    const RunResult want = train_with(make_config(s), 3);
    const RunResult got = train_with(with_nvme_params(make_config(s), dir, 0, 2), 3);
    expect_bitwise_equal(got, want);
  }
  remove_dir(dir);
}

// max_in_cpu as DeepSpeed's: that many shard elements stay in memory (the
// default, 1e9, keeps a small model whole there); buffer_size bounds a shard.
TEST(NvmeOffload, MaxInCpuKeepsShardsInMemoryAndBufferSizeBoundsThem) {
  const std::string dir = swap_dir("max-in-cpu");
  RunSpec s;
  s.stage = 3;
  const Config memory = make_config(s);
  int64_t all = 0, some = 0, none = 0;
  train_with(with_nvme_params(memory, dir, 0), 1, [&](Engine& e) { all = e.state_bytes().nvme; });
  train_with(with_nvme_params(memory, dir, 20'000), 1, [&](Engine& e) { some = e.state_bytes().nvme; });
  train_with(with_nvme_params(memory, dir, 1'000'000'000), 1, [&](Engine& e) { none = e.state_bytes().nvme; });
  EXPECT_GT(all, some);
  EXPECT_GT(some, 0);
  EXPECT_EQ(none, 0);
  nlohmann::json j = with_nvme_params(memory, dir).to_json();
  j["zero_optimization"]["offload_param"]["buffer_size"] = 1000;
  expect_error<ConfigError>([&] { train_with(Config::from_json(j), 1); },
                            "zero_optimization.offload_param.buffer_size = 1000 elements, but the param shard of");
  remove_dir(dir);
}

// Params changed in a gathered scope reach the shards on disk: training
// goes on as the in-memory run given the same change.
TEST(NvmeOffload, GatheredWriteBacksReachTheShardsOnDisk) {
  const std::string dir = swap_dir("write-back");
  RunSpec s;
  s.stage = 3;
  s.dtype = "bf16";
  const auto halve_after_step_1 = [](GptTrainer& t) {
    t.train_step();
    auto full = t.engine().gathered_parameters({}, 0);
    at::NoGradGuard no_grad;
    for (auto& p : t.model()->parameters()) p.mul_(0.5);
    full.finish();
  };
  std::vector<RunResult> runs;
  for (const Config& c : {make_config(s), with_nvme_params(make_config(s), dir)}) {
    GptTrainer t(small_gpt(), c, corpus(), 7, world().comm(), dp_group());
    halve_after_step_1(t);
    RunResult r;
    for (int i = 0; i < 2; ++i) r.losses.push_back(t.train_step().loss);
    r.params = t.engine().full_parameters();
    runs.push_back(r);
  }
  expect_bitwise_equal(runs[1], runs[0]);
  remove_dir(dir);
}

// Saved with params and optimizer state on NVMe; resumed with both there
// (0), and in memory (1).
TEST(NvmeOffload, CheckpointsOfParamsOnNvmeResumeExactly) {
  const std::string dir = swap_dir("param-ckpt");
  RunSpec s;
  s.stage = 3;
  s.dtype = "fp32";  // the master is the shard itself: only the param swap holds it
  const Config nvme = with_nvme_params(with_nvme(s, dir), dir);
  expect_resumes_exactly(nvme, {nvme, make_config(s)}, 2, "nvme-param-ckpt-save");
  remove_dir(dir);
}

// A checkpoint of state on NVMe (every param shard, the master and the
// moments) loads at another world size: onto NVMe and onto memory, and one
// saved from memory loads onto NVMe, each going on as the run that was
// there from the start (the reference runs in memory: the oracle).
TEST(NvmeOffload, CheckpointsOfNvmeStateReshardToAnotherWorldSize) {
  const std::string dir = swap_dir("reshard");
  const ConfigChange nvme = [&](const Config& c) {
    return c.zero.stage == 3 ? with_nvme_params(with_nvme(c, dir), dir) : with_nvme(c, dir);
  };
  const int n = world().size();
  if (n == 2) {
    expect_reshard(dp_group(), 3, solo_group(), 3, "nvme-2to1", nvme, nvme);
    expect_reshard(dp_group(), 3, solo_group(), 2, "nvme-2to1-memory", nvme, {});
    expect_reshard(first_ranks(1), 2, dp_group(), 3, "memory-1to2-nvme", {}, nvme);  // saved by rank 0 alone
  } else if (n == 4) {
    expect_reshard(dp_group(), 3, first_ranks(2), 3, "nvme-4to2", nvme, nvme);
    expect_reshard(first_ranks(2), 3, dp_group(), 2, "nvme-2to4-memory", nvme, {});
  }
  remove_dir(dir);
}

// This process's swap file whose name holds `tag` ("grad", "optimizer",
// "param"), found by its descriptor (the file itself has no name): its size,
// and cut to `bytes` if that is not negative. -1: none open.
int64_t swap_file_size(const std::string& tag, int64_t cut_to = -1) {
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = fs::read_symlink(e.path(), ec).string();
    if (ec || target.find("zero-cpp-" + tag + "-") == std::string::npos) continue;
    const int fd = std::stoi(e.path().filename().string());
    if (cut_to >= 0 && ::ftruncate(fd, cut_to) != 0) return -1;
    return static_cast<int64_t>(::lseek(fd, 0, SEEK_END));
  }
  return -1;
}

// A disk failure in the middle of a step (the last group's grads cannot be
// read back: the swap file lost its end) is an error naming what and
// where; the groups updated before it make this rank's shards disagree
// with what a retry would assume, so the engine refuses to train on until
// a checkpoint is loaded -- after which it trains on exactly as a fresh
// engine resumed from the same checkpoint.
TEST(NvmeOffload, ADiskFailureMidStepIsNamedAndALoadRecovers) {
  const std::string dir = swap_dir("mid-step"), ckpt = ckpt_dir("nvme-mid-step");
  RunSpec s;
  s.stage = 3;
  s.dtype = "bf16";
  const Config c = with_nvme(s, dir);
  GptTrainer t(small_gpt(), c, corpus(), 7, world().comm(), dp_group());
  t.train_step();
  t.save(ckpt);
  // A backward by hand, then the file loses its end before the step reads
  // the grads back. Every rank loses the same end, so all fail at the same
  // group (no rank is left waiting in a collective).
  Engine& e = t.engine();
  backward_on_random_tokens(t, 99 + world().rank());
  const int64_t size = swap_file_size("grad");
  ASSERT_GT(size, 4096);
  ASSERT_EQ(swap_file_size("grad", size - 4096), size - 4096);
  try {
    e.step();
    ADD_FAILURE() << "a step whose grads could not be read went through";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("reduced grads of group"), std::string::npos) << msg;
    EXPECT_NE(msg.find("swap file"), std::string::npos) << msg;
  }
  try {
    t.train_step();
    ADD_FAILURE() << "trained on after a step that failed part way";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("load again"), std::string::npos) << e.what();
  }
  t.resume(ckpt);
  GptTrainer fresh(small_gpt(), c, corpus(), 7, world().comm(), dp_group());
  fresh.resume(ckpt);
  for (int i = 0; i < 2; ++i) {
    const double want = fresh.train_step().loss;
    EXPECT_EQ(t.train_step().loss, want) << "step " << i << " after the load";
  }
  expect_bitwise_equal({{}, t.engine().full_parameters()}, {{}, fresh.engine().full_parameters()});
  remove_dir(ckpt);
  remove_dir(dir);
}

TEST(NvmeOffload, ABadPathIsNamedOnEveryRank) {
  RunSpec s;
  s.stage = 2;
  const std::string missing = ckpt_dir("nvme-missing") + "/nowhere";
  expect_error([&] { train_with(with_nvme(s, missing), 1); }, "nvme_path \"" + missing + "\" does not exist");
  const std::string file = ckpt_dir("nvme-a-file");
  if (world().rank() == 0) std::ofstream(file) << "x";
  world().comm().barrier(world().group())->wait();
  expect_error([&] { train_with(with_nvme(s, file), 1); }, "is not a directory");
  world().comm().barrier(world().group())->wait();
  if (world().rank() == 0) fs::remove(file);
  nlohmann::json j = make_config(s).to_json();
  j["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"}};
  expect_error<ConfigError>([&] { Config::from_json(j); }, "nvme_path is required");
  s.stage = 3;
  expect_error([&] { train_with(with_nvme_params(make_config(s), missing), 1); },
               "zero_optimization.offload_param.nvme_path \"" + missing + "\" does not exist");
}

// A disk too small for the state: the error comes at construction, naming
// the directory and the space needed, never mid-step.
TEST(NvmeOffload, AFullDiskIsAnErrorAtConstruction) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a small filesystem needs root";
  const std::string dir = ckpt_dir("nvme-small-" + std::to_string(world().rank()));
  fs::create_directories(dir);
  // 64 KiB: neither the small GPT's optimizer state nor its param shards fit.
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64k") != 0) GTEST_SKIP() << "cannot mount a tmpfs here";
  RunSpec s;
  s.dtype = "bf16";
  s.stage = 2;
  const Config optimizer = with_nvme(s, dir);
  s.stage = 3;
  s.dtype = "fp32";  // ~200k params x 4 bytes / 2 ranks of shards
  const Config params = with_nvme_params(make_config(s), dir);
  for (const Config& c : {optimizer, params}) {
    try {
      train_with(c, 1);
      ADD_FAILURE() << "trained with the state on a 64 KiB disk";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(dir), std::string::npos) << what;
      EXPECT_NE(what.find("No space left"), std::string::npos) << what;
    }
  }
  umount(dir.c_str());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zero::test
