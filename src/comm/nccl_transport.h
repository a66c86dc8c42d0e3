// The CUDA backend: c10d's ProcessGroupNCCL, one per group, made on the
// group's first CUDA collective (NCCL then builds its communicator for the
// tensor's device). The dispatcher (Comm) routes every CUDA tensor here and
// CPU tensors to the shared-memory fast path or Gloo, as before.
//
// Stream semantics are NCCL's through c10d, FSDP2's pattern: a collective
// runs on NCCL's own stream after waiting for the caller's current stream
// (so it reads what was queued before it), and Work::wait() makes the
// caller's current stream wait for it without blocking the host. The
// tensors stay alive in the c10d work item until it is waited for; no
// recordStream, so the caching allocator cannot hand a buffer that a
// collective still reads to another stream (pytorch #147168).
//
// Exactness as the CPU transports: a 16-bit reduction (reduce-scatter into
// fp32, or an all-reduce) runs in fp32 and rounds once; a widening
// all-gather gathers the 16 bits that travel and converts on the stream.
//
// Built with ZERO_CUDA only (make_nccl_transport() is null otherwise).
// STATUS: compiled and linked in CI; not yet run on a GPU (README, "GPU").
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
