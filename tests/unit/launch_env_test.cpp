// The launcher environment: torchrun, mpirun and srun variables, and errors
// that name the variable at fault.
#include <map>

#include <gtest/gtest.h>

#include "zero/launch_env.h"

namespace {

using zero::comm::LaunchEnv;
using zero::comm::read_launch_env;

LaunchEnv read(const std::map<std::string, std::string>& vars) {
  return read_launch_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

void expect_error(const std::map<std::string, std::string>& vars, const std::string& part) {
  try {
    read(vars);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(LaunchEnv, Torchrun) {
  auto e = read({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RUN_ID", "job7"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.job_id, "job7");
}

TEST(LaunchEnv, Mpirun) {
  auto e = read({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                 {"MASTER_ADDR", "h0"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(e.launcher, "mpirun");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
}

TEST(LaunchEnv, Srun) {
  auto e = read({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                 {"SLURM_NTASKS_PER_NODE", "2(x4)"}, {"SLURM_JOB_ID", "991"},
                 {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(e.launcher, "srun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_world_size, 0);  // a list, not a number: unknown
  EXPECT_EQ(e.job_id, "991");
}

TEST(LaunchEnv, SingleProcessWithoutLauncher) {
  auto e = read({});
  EXPECT_EQ(e.launcher, "none");
  EXPECT_EQ(e.world_size, 1);
  EXPECT_TRUE(e.master_addr.empty());
}

TEST(LaunchEnv, ErrorsNameTheVariable) {
  expect_error({{"RANK", "0"}}, "WORLD_SIZE is not set");
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}, "MASTER_ADDR is not set");
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}}, "MASTER_PORT is not set");
  expect_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}},
               "RANK=2 is not below WORLD_SIZE=2");
  expect_error({{"RANK", "one"}, {"WORLD_SIZE", "2"}}, "RANK=one is not an integer");
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "70000"}},
               "MASTER_PORT=70000");
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "2"},
                {"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}},
               "LOCAL_RANK=3 is not below LOCAL_WORLD_SIZE=2");
  expect_error({{"OMPI_COMM_WORLD_RANK", "0"}}, "(mpirun): OMPI_COMM_WORLD_SIZE is not set");
}

}  // namespace
