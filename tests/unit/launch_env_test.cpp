// The launcher environment: torchrun, mpirun and srun variables, and errors
// that name the variable at fault.
#include <fcntl.h>
#include <stdexcept>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>

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

// A collective's error that says a peer went away is noted on
// ZERO_RUN_NOTE_FD for zero-run (once); others are not.
TEST(LaunchEnv, PeerLossIsNotedForZeroRun) {
  using zero::comm::says_peer_lost;
  EXPECT_TRUE(says_peer_lost("all_reduce on group 'dp0' (ranks 1,3) failed: [pair.cc:547] Connection closed by "
                             "peer [10.231.0.2]:5345"));
  EXPECT_TRUE(says_peer_lost("x failed: Connection reset by peer"));
  EXPECT_TRUE(says_peer_lost("allgather (shared memory) failed: rank 1 (pid 7) exited while this rank waited for it "
                             "to publish"));
  EXPECT_FALSE(says_peer_lost("all_reduce on group 'dp0' failed (collective timeout 300 s): Timed out"));
  EXPECT_FALSE(says_peer_lost("injected fault: throw at forward #3"));
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_NONBLOCK), 0);
  setenv(zero::comm::kRunNoteFdVariable, std::to_string(fds[1]).c_str(), 1);
  zero::comm::note_peer_lost("reduce failed: Connection closed by peer\nbacktrace...");
  zero::comm::note_peer_lost("a second one is not written");
  unsetenv(zero::comm::kRunNoteFdVariable);
  char buf[512];
  const ssize_t n = ::read(fds[0], buf, sizeof(buf));
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), "peer-lost reduce failed: Connection closed by peer\n");
  close(fds[0]);
  close(fds[1]);
}

}  // namespace
