// Which transport a group's CUDA collectives take, from where its ranks'
// GPUs are (comm/device_placement.h): NCCL when each rank has its own,
// CUDA IPC only where ranks of one host share one, an error where neither
// can serve them.
#include <gtest/gtest.h>

#include "comm/device_placement.h"

namespace {

using zero::comm::choose_cuda_route;
using zero::comm::CudaRoute;
using zero::comm::RankGpu;

TEST(CudaRoute, EachRankWithItsOwnGpuTakesNccl) {
  const auto r = choose_cuda_route({{"h", "GPU-a"}, {"h", "GPU-b"}, {"h", "GPU-c"}, {"h", "GPU-d"}}, true);
  EXPECT_EQ(r.via, CudaRoute::Via::Nccl) << r.why;
  EXPECT_NE(r.why.find("own"), std::string::npos) << r.why;
  // Across hosts too.
  EXPECT_EQ(choose_cuda_route({{"h1", "GPU-a"}, {"h2", "GPU-b"}}, true).via, CudaRoute::Via::Nccl);
  // A single rank.
  EXPECT_EQ(choose_cuda_route({{"h", "GPU-a"}}, true).via, CudaRoute::Via::Nccl);
}

TEST(CudaRoute, RanksSharingAGpuOnOneHostTakeCudaIpcNamingThePair) {
  const auto r = choose_cuda_route({{"h", "GPU-a"}, {"h", "GPU-b"}, {"h", "GPU-a"}}, true);
  EXPECT_EQ(r.via, CudaRoute::Via::CudaIpc);
  EXPECT_NE(r.why.find("ranks 0 and 2 share GPU GPU-a"), std::string::npos) << r.why;
  // The one-GPU machine: every rank on it.
  EXPECT_EQ(choose_cuda_route({{"h", "GPU-a"}, {"h", "GPU-a"}}, true).via, CudaRoute::Via::CudaIpc);
}

TEST(CudaRoute, SharingThatNeitherTransportServesIsNamed) {
  // IPC serves one host only.
  auto r = choose_cuda_route({{"h1", "GPU-a"}, {"h1", "GPU-a"}, {"h2", "GPU-b"}}, true);
  EXPECT_EQ(r.via, CudaRoute::Via::Neither);
  EXPECT_NE(r.why.find("spans hosts"), std::string::npos) << r.why;
  // NCCL refuses a shared GPU, and IPC is off.
  r = choose_cuda_route({{"h", "GPU-a"}, {"h", "GPU-a"}}, false);
  EXPECT_EQ(r.via, CudaRoute::Via::Neither);
  EXPECT_NE(r.why.find("ZERO_CUDA_IPC=off"), std::string::npos) << r.why;
  // Off, but nothing shared: NCCL.
  EXPECT_EQ(choose_cuda_route({{"h", "GPU-a"}, {"h", "GPU-b"}}, false).via, CudaRoute::Via::Nccl);
}

}  // namespace
