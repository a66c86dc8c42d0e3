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
// - bad paths and a full disk: errors naming the path, at construction.
#include <sys/mount.h>
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

Config with_nvme(const RunSpec& s, const std::string& dir, bool pipeline_read = false, bool pipeline_write = false) {
  nlohmann::json j = make_config(s).to_json();
  j["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"},
                                                 {"nvme_path", dir},
                                                 {"pipeline_read", pipeline_read},
                                                 {"pipeline_write", pipeline_write}};
  // Small pieces and a shallow queue: a group's transfer crosses several.
  j["aio"] = {{"block_size", 8192}, {"queue_depth", 4}};
  return Config::from_json(j);
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
        EXPECT_EQ(got.losses, want.losses);
        EXPECT_EQ(max_abs_diff(got.params, want.params), 0.0) << worst_param(got.params, want.params);
      }
  EXPECT_TRUE(fs::is_empty(dir));
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
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_EQ(max_abs_diff(got.params, want.params), 0.0) << worst_param(got.params, want.params);
  }
  remove_dir(dir);
}

// Saved with the state on NVMe, resumed on NVMe and in memory: the same
// steps as the run that never stopped.
TEST(NvmeOffload, CheckpointsResumeExactlyOnNvmeAndInMemory) {
  const std::string dir = swap_dir("ckpt"), ckpt = ckpt_dir("nvme-ckpt-save");
  RunSpec s;
  s.stage = 3;
  s.dtype = "bf16";
  const Config nvme = with_nvme(s, dir);
  RunResult whole;
  {
    GptTrainer t(small_gpt(), nvme, corpus(), 7, world().comm(), dp_group());
    for (int i = 0; i < 3; ++i) t.train_step();
    t.save(ckpt);
    for (int i = 0; i < 3; ++i) whole.losses.push_back(t.train_step().loss);
    whole.params = t.engine().full_parameters();
  }
  for (const Config& c : {nvme, make_config(s)}) {
    SCOPED_TRACE(c.zero.offload_optimizer.device == OffloadDevice::NVMe ? "onto nvme" : "onto memory");
    GptTrainer t(small_gpt(), c, corpus(), 7, world().comm(), dp_group());
    t.resume(ckpt);
    RunResult resumed;
    for (int i = 0; i < 3; ++i) resumed.losses.push_back(t.train_step().loss);
    resumed.params = t.engine().full_parameters();
    EXPECT_EQ(resumed.losses, whole.losses);
    EXPECT_EQ(max_abs_diff(resumed.params, whole.params), 0.0) << worst_param(resumed.params, whole.params);
  }
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
}

// A disk too small for the state: the error comes at construction, naming
// the directory and the space needed, never mid-step.
TEST(NvmeOffload, AFullDiskIsAnErrorAtConstruction) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a small filesystem needs root";
  const std::string dir = ckpt_dir("nvme-small-" + std::to_string(world().rank()));
  fs::create_directories(dir);
  // 256 KiB: the small GPT's state (~200k params x 12 bytes per rank) does not fit.
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=256k") != 0) GTEST_SKIP() << "cannot mount a tmpfs here";
  RunSpec s;
  s.stage = 2;
  s.dtype = "bf16";
  try {
    train_with(with_nvme(s, dir), 1);
    ADD_FAILURE() << "trained with the state on a 256 KiB disk";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(dir), std::string::npos) << what;
    EXPECT_NE(what.find("No space left"), std::string::npos) << what;
  }
  umount(dir.c_str());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zero::test
