// What a Group holds for the transports: its backend communicator.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>

#include <c10/util/intrusive_ptr.h>

#include "comm/gloo_lane.h"
#include "comm/c10d.h"
#include "zero/comm.h"

namespace zero::comm {

// Two lanes (two Gloo groups over the same ranks): reduce-scatters run on
// their own. Their order is set by autograd's grad hooks while gathers
// follow the stage-3 unit schedule; on one shared lane the two orders could
// interleave differently on different ranks (e.g. a param unused on one
// rank only) and pair the wrong collectives. Each lane's own order is the
// same on every rank.
struct ShmGroup;      // comm/shm_transport.cpp
struct CudaIpcGroup;  // comm/cuda_ipc_transport.cpp
struct HierGroup;     // comm/hierarchical_transport.h

struct Group::Impl {
  c10::intrusive_ptr<c10d::Backend> backend;         // everything else
  c10::intrusive_ptr<c10d::Backend> reduce_backend;  // reduce-scatter
  std::chrono::milliseconds timeout;
  // The threads that check signatures and issue the collectives of each
  // backend (comm/gloo_lane.h); destroyed first, before their backends.
  std::unique_ptr<GlooLane> lane;
  std::unique_ptr<GlooLane> reduce_lane;
  // The shared-memory fast path's segment and lanes, when every rank of
  // the group is on this host and could map it; null otherwise.
  std::shared_ptr<ShmGroup> shm;
  // For a group spanning hosts evenly: its layout and per-host sub-groups
  // (comm/hierarchical_transport.h); null otherwise.
  std::shared_ptr<HierGroup> hier;
  // This group's part of the world's store, for backends made later.
  c10::intrusive_ptr<c10d::Store> store;
  // The CUDA backends (comm/nccl_transport.h), made on the group's first
  // CUDA collective of each lane -- reduce-scatters on a communicator of
  // their own, for the reason the Gloo lanes are two; autograd's device
  // thread may make one, hence the lock.
  std::mutex device_backend_mu;
  c10::intrusive_ptr<c10d::Backend> device_backend;
  c10::intrusive_ptr<c10d::Backend> device_reduce_backend;
  // The CUDA IPC fast path's staging buffers, made on first use: one set
  // per lane (reduce-scatters run beside the rest, as on the CPU).
  std::shared_ptr<CudaIpcGroup> cuda_ipc, cuda_ipc_reduce;
  // How this group's CUDA collectives travel, decided at its first one from
  // where its ranks' GPUs are (comm/device_placement.h); guarded by
  // device_backend_mu.
  std::optional<bool> cuda_ipc_chosen;
  // Group::set_step(): read by any thread that issues a collective.
  std::atomic<int64_t> step{-1}, micro{0};
  std::atomic<const void*> step_owner{nullptr};  // who set the tag (Group::clear_step)

  // World::shutdown(): the lanes stop (failing what is queued), then the
  // communicators go -- NCCL's before CUDA's own teardown. Every collective
  // on the group is refused from then on (Comm checks closed()).
  void shutdown();
  bool closed() const { return shut_down_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> shut_down_{false};
};

}  // namespace zero::comm
