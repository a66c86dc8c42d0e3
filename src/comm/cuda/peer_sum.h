// The reduction of the CUDA IPC transport (comm/cuda_ipc_transport.h): sum
// the group's staged copies of a chunk -- device pointers, peers' mapped
// through CUDA IPC -- in rank order with fp32 accumulation (fp64 for
// doubles), optionally divided by their number, written in the output's
// type: the same arithmetic as the host's shm::sum_in_rank_order, so every
// rank gets identical bits. No CUDA or torch headers here.
#pragma once

#include <cstdint>

#include "comm/shm/reduce_kernels.h"

namespace zero::comm::cuda {

constexpr int kMaxPeers = 64;  // shm::Lane::kMaxRanks

// Asynchronous on `stream` (a cudaStream_t). `out` may be any one source
// (the same elements, the same type): each element is read from every
// source before it is written. Throws std::runtime_error if the launch fails.
void peer_sum(const void* const* srcs, int n_src, shm::Elem in, void* out, shm::Elem out_type, int64_t count,
              bool average, void* stream);

}  // namespace zero::comm::cuda
