// Which transport carries a group's CUDA collectives, from where its
// ranks' GPUs are: NCCL when every rank has a GPU of its own (NVLink/PCIe
// rings, no staging), CUDA IPC when ranks of one host share a GPU -- which
// NCCL refuses -- and an error when ranks sharing a GPU are spread over
// hosts (neither can serve them). Decided once per group, at its first
// CUDA collective, from every rank's host and GPU identity exchanged
// through the store (comm/cuda_ipc_transport.cpp). No torch, no CUDA.
#pragma once

#include <string>
#include <vector>

namespace zero::comm {

struct RankGpu {
  std::string host;  // host_identity(): host, boot id and network namespace
  std::string gpu;   // the GPU's UUID
};

struct CudaRoute {
  enum class Via { Nccl, CudaIpc, Neither } via = Via::Nccl;
  std::string why;  // for the one log line per group, or the error (Neither)
};

// `ipc_allowed`: ZERO_CUDA_IPC is not "off". Neither: ranks share a GPU
// across hosts, or share one with IPC switched off.
CudaRoute choose_cuda_route(const std::vector<RankGpu>& ranks, bool ipc_allowed);

}  // namespace zero::comm
