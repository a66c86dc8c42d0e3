// The CUDA backend: c10d's ProcessGroupNCCL, two per group -- one for
// reduce-scatters, one for the rest, as the Gloo lanes are two: hook-driven
// reductions must never interleave with unit gathers in a rank-dependent
// order on one communicator -- each made on its lane's first CUDA
// collective. The dispatcher (Comm) routes CUDA tensors here unless ranks
// share a GPU (CUDA IPC, comm/device_placement.h).
//
// Stream semantics are NCCL's through c10d, FSDP2's pattern: a collective
// runs on NCCL's own stream after waiting for the caller's current stream
// (so it reads what was queued before it), and Work::wait() makes the
// caller's current stream wait for it without blocking the host. The
// tensors stay alive in the c10d work item until it is waited for; no
// recordStream, so the caching allocator cannot hand a buffer that a
// collective still reads to another stream (pytorch #147168).
//
// 16-bit reductions run in 16 bits, NCCL's way and DeepSpeed's: no fp32
// copy of the bucket (a reduce-scatter into an fp32 shard reduces in 16
// bits into a 16-bit shard, then widens that). The host transports and CUDA
// IPC accumulate in fp32 instead; communication_data_type "fp32" makes the
// engine widen the grads before they travel, on every transport.
//
// Signatures: NCCL has no check that the ranks run the same collective; a
// disagreement hangs until the watchdog's timeout. With
// TORCH_DISTRIBUTED_DEBUG=DETAIL (or ZERO_CHECK_DEVICE_COLLECTIVES=on) each
// one's signature is first compared on the group's Gloo lane of the same
// kind (comm/gloo_lane.h: check()), so ranks that disagree fail on every
// rank naming both sides. It costs one host round trip per collective and
// ties the host to its peers, so it is a debug mode (README, "GPU").
//
// Built with ZERO_CUDA only (make_nccl_transport() is null otherwise).
// STATUS: ran on an H100 at world size 1 (2026-11-26, the device suite); not yet
// between ranks on separate GPUs (docs/gpu.md).
#pragma once

#include <memory>

#include "zero/comm.h"

namespace zero::comm {

#ifdef ZERO_WITH_CUDA
std::shared_ptr<Transport> make_nccl_transport();
#else
inline std::shared_ptr<Transport> make_nccl_transport() { return nullptr; }
#endif

}  // namespace zero::comm
