// Hierarchical collectives for a group spanning hosts (the same number of
// its ranks, 2 or more, on each): each op runs as a collective inside each
// host (shared memory) and one between hosts among the ranks with the same
// local index (Gloo), so every byte that crosses hosts does so once per
// host instead of once per rank. With H hosts of L ranks, N = HL, shards of
// S elements, totals across hosts (as the flat algorithms send them):
//   allgather       flat ring H(N-1)S          hierarchical N(H-1)S
//   reduce-scatter  flat all-to-all N(N-L)S    hierarchical N(H-1)S, in fp32
//   all-reduce (M)  flat ring 2H(N-1)M/N       hierarchical 2(H-1)M, in fp32
// The dispatcher takes it only where it moves fewer bytes across hosts: not
// for a 16-bit reduce-scatter on 2 ranks per host (fp32 partial sums cross
// the hosts, twice the 16-bit bytes: the same total). Sums run inside each
// host, then across hosts, in rank order with fp32 accumulation and one
// rounding: deterministic and the same on every rank, but not the flat
// rank-order sum's bits (the association differs).
//
// Each of the group's two lanes (as with Gloo: reduce-scatters on their
// own) has its own pair of sub-groups and a thread that runs its
// collectives' steps in submission order, so a collective returns at once
// and the steps of different lanes never interleave on a sub-group; after
// a failure the lane's later collectives fail at once, and teardown
// cancels those not begun (comm/serial_executor.h).
// ZERO_HIERARCHICAL=off keeps every group flat.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/host_layout.h"
#include "zero/comm.h"

namespace zero::comm {

class SerialExecutor;  // comm/serial_executor.h

struct HierGroup {
  HostLayout layout;
  int host = 0, local = 0;  // this rank's
  struct Lane {
    std::shared_ptr<Group> intra, inter;  // this host's ranks; this local index's ranks
    std::unique_ptr<SerialExecutor> executor;
  };
  Lane lanes[2];  // [0]: allgather, all-reduce; [1]: reduce-scatter
  // One more group of this host's ranks, for callers' own use (hpZ's
  // secondary gathers), apart from the lanes' sub-groups.
  std::shared_ptr<Group> host_local;
  HierGroup();  // starts the lanes' executors
  ~HierGroup();
};

bool hierarchical_allowed_by_env();  // ZERO_HIERARCHICAL unset/on/auto: yes; off: no

// The group's hierarchical layout and sub-groups, if it has them (else null).
const HierGroup* hier_group(const Group& g);

class HierarchicalTransport : public Transport {
 public:
  HierarchicalTransport();
  std::string name() const override { return "hier"; }
  bool supports(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel) const override;
  // The bytes this rank sends to other hosts.
  int64_t wire_bytes(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel) const override;

  WorkHandle all_gather(const Group& g, at::Tensor out_flat, at::Tensor in_shard, const Signature& sig) override;
  WorkHandle reduce_scatter(const Group& g, at::Tensor out_shard, at::Tensor in_flat, ReduceOp op,
                            const Signature& sig) override;
  WorkHandle all_reduce(const Group& g, at::Tensor t, ReduceOp op, const Signature& sig) override;
  WorkHandle broadcast(const Group& g, at::Tensor t, int root, const Signature& sig) override;
  WorkHandle barrier(const Group& g, const Signature& sig) override;

 private:
  // One collective's steps, run on a lane's thread: (layout, the lane's
  // sub-groups, the inner dispatcher, the signature's text, group size).
  using Steps = std::function<void(const HierGroup&, const HierGroup::Lane&, Comm&, const std::string&, int)>;
  WorkHandle submit(const Group& g, int lane, const Signature& sig, Steps steps);
  // The sub-collectives go through a dispatcher of their own (shared memory
  // inside a host, Gloo between), so the world's counters see each op once.
  std::shared_ptr<Comm> inner_;
};

}  // namespace zero::comm
