// The shared-memory fast path: collectives between ranks of one host go
// through a segment every rank of the group maps, at memory bandwidth,
// instead of through Gloo over loopback TCP (every byte copied by the
// kernel). Served: allgather, reduce-scatter, all-reduce, broadcast, for
// fp32/fp64/bf16/fp16 (allgather and broadcast: any dtype). A group gets it
// when all its ranks are on this host and every rank could map the segment;
// otherwise -- or with ZERO_COMM_FASTPATH=off, or "zero_cpp":
// {"comm_fast_path": false} in the ds_config -- its collectives go to the
// backend. Two lanes per group, as with Gloo: reduce-scatters on their own.
// Inputs in the engine's flat buffers (memory::zeros_flat: shared memfds)
// are read by the peers in place, without staging (zero-copy, shm/lane.h).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/shm/reduce_kernels.h"
#include "zero/comm.h"

namespace c10d {
class Store;
}

namespace zero::comm {

struct ShmGroup;
namespace shm {
class Lane;
class Job;
}

// A handle on a queued lane job: its failure as CommError, a disagreement
// between ranks as CollectiveMismatch.
WorkHandle lane_work(std::shared_ptr<shm::Job> job);
// The lanes' element type for a dtype they can sum (fp32/fp64/bf16/fp16).
std::optional<shm::Elem> reducible_elem(at::ScalarType t);

// The lane of the group's segment that serves `op` (reduce-scatters have
// their own), or null when the group has no segment. The CUDA IPC transport
// runs its rounds' handshakes on it.
shm::Lane* shm_lane(const Group& g, CollectiveOp op);

// Zero-copy (comm/shm/lane.h): whether the group's ranks read each other's
// shared flat buffers in place (agreed at setup; ZERO_COMM_ZERO_COPY=off:
// never), and how many of its collectives have so far.
bool shm_zero_copy(const Group& g);
int64_t shm_zero_copy_collectives(const Group& g);

// Whether ZERO_COMM_FASTPATH allows the fast path (on/auto/unset: yes; off: no).
bool shm_fast_path_allowed_by_env();

// This host's identity (hostname, boot id and network namespace), for
// grouping ranks by host.
std::string host_identity();

// Collective over the group's members through `store` (prefixed for the
// group): rank 0 creates and formats the segment, the others map it, all
// agree, then the name is unlinked. Returns null -- on every member alike --
// when any member is not on this host, has the fast path off, or failed to
// map (one warning on stderr from the group's rank 0 for the last).
// The segment is named SEGMENT_PREFIX-p<creator pid> under /dev/shm (or
// ZERO_SHM_DIR); zero-run removes leftovers of its job's prefix.
std::shared_ptr<ShmGroup> try_shm_group(c10d::Store& store, const std::string& segment_prefix, const Group& g,
                                        const std::vector<std::string>& member_hosts,
                                        std::chrono::milliseconds timeout);

class ShmTransport : public Transport {
 public:
  std::string name() const override { return "shm"; }
  bool supports(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel) const override;
  int64_t wire_bytes(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel) const override;

  WorkHandle all_gather(const Group& g, at::Tensor out_flat, at::Tensor in_shard, const Signature& sig) override;
  WorkHandle reduce_scatter(const Group& g, at::Tensor out_shard, at::Tensor in_flat, ReduceOp op,
                            const Signature& sig) override;
  WorkHandle all_reduce(const Group& g, at::Tensor t, ReduceOp op, const Signature& sig) override;
  WorkHandle broadcast(const Group& g, at::Tensor t, int root, const Signature& sig) override;
  WorkHandle barrier(const Group& g, const Signature& sig) override;
};

}  // namespace zero::comm
