// Seed 001's same-host fast path for CUDA tensors: collectives between the
// ranks of one host -- several ranks on one GPU included, which NCCL refuses
// -- through device staging buffers every rank maps with CUDA IPC, moved by
// the copy engines (device-to-device and peer copies between processes)
// and, for reductions, one kernel that reads every rank's staged chunk.
//
// Per group and lane, made on its first CUDA collective: each rank allocates one
// staging buffer (ZERO_CUDA_IPC_STAGING_BYTES, default 32 MiB) on its
// tensor's device, publishes its IPC handle through the group's store and
// opens its peers'. A collective runs chunk by chunk:
//   stage (copy this rank's part into its buffer) -> handshake ->
//   read (copy or sum the peers' parts) -> handshake (buffers free again)
// Each collective runs on the worker of the group's shared-memory lane that
// serves the op on the CPU (reduce-scatters, issued from autograd's
// threads, on their own), in order with that lane's other collectives; the
// handshakes are the lane's rounds and carry the collective's signature, so
// ranks that disagree fail on every rank, and a dead peer is an error
// within the collective timeout, as on the CPU path. The caller gets a
// handle at once (stage 3's prefetch overlaps); the copies run on a stream
// of the transport's own after the caller's stream's work at submission,
// and wait() returns once they are done.
//
// Chosen per group like the shared-memory transport: every rank on this
// host and able to map the segment (and ZERO_CUDA_IPC not "off"); anything
// else, or a group without a segment, goes to NCCL. Sums as the host
// transports: rank order, fp32 accumulation, one rounding.
//
// The direct path (seed 001: the copy engines move the data, peers copy
// straight from each other's buffers; ZERO_CUDA_IPC_DIRECT=on on every
// rank): no staging and no host round per chunk. A collective is
//   record this rank's event where its input is ready -> a round carrying
//   where each rank's input is (comm/cuda/ipc_buffers.h) -> wait on the
//   peers' events (on the device) -> copy or sum from their buffers ->
//   this rank's copies done -> a round (every peer has read this rank's
//   input, which its owner may now reuse)
// -- two host rounds a collective, whatever its size; an all-reduce has a
// third, after each rank has summed its slice in place (its event recorded
// again there). Where some rank's input cannot be shared (not from torch's
// caching allocator, or empty) every rank sees it in the first round and
// the collective is staged, as above. The same sums in the same order:
// bit-identical to the staged path and the host transports.
// src/comm/cuda/direct_path.pml models the protocol -- rounds, IPC events
// as CUDA keeps them, each rank's stream -- for SPIN: `ctest -R
// direct_path_model` checks that no read meets a peer's input before it is
// written or after it is reused, that nothing hangs, that one rank's
// failure fails the collective on all, and that each planted bug is caught.
//
// Built with ZERO_CUDA only (make_cuda_ipc_transport() is null otherwise).
// STATUS: the staged path ran on an H100 (2026-11-26): two ranks sharing the
// GPU, bit for bit against the host transports; at 1 GiB it moves 0.05-0.11
// of the device copy rate (bench_cuda_comm), far from the copy engines'
// (docs/gpu.md). The direct path is compiled in CI and has NOT run on a GPU
// yet: it is off unless asked for, and the next lease's bench/gpu_lease.sh
// runs the device suite and bench_cuda_comm with it.
#pragma once

#include <memory>

#include "comm/env_switch.h"
#include "zero/comm.h"

namespace zero::comm {

#ifdef ZERO_WITH_CUDA
std::shared_ptr<Transport> make_cuda_ipc_transport();
// Collectives of `g` that took the direct path so far (for tests and logs).
int64_t cuda_ipc_direct_collectives(const Group& g);
#else
inline std::shared_ptr<Transport> make_cuda_ipc_transport() { return nullptr; }
inline int64_t cuda_ipc_direct_collectives(const Group&) { return 0; }
#endif

// Whether ZERO_CUDA_IPC allows the path (comm/env_switch.h: unset/on: yes; off: no).
inline bool cuda_ipc_allowed_by_env() { return env_switch_on("ZERO_CUDA_IPC"); }
// Whether this rank asks for the direct path (ZERO_CUDA_IPC_DIRECT; unset:
// no, until it has run on a GPU); a group takes it when every rank does.
inline bool cuda_ipc_direct_by_env() { return env_switch_on("ZERO_CUDA_IPC_DIRECT", false); }
// Whether this rank asks the direct path to keep its peers' mappings across
// collectives (ZERO_CUDA_IPC_DIRECT_CACHE; unset: no; comm/cuda/ipc_buffers.h).
inline bool cuda_ipc_direct_cache_by_env() { return env_switch_on("ZERO_CUDA_IPC_DIRECT_CACHE", false); }

}  // namespace zero::comm
