// The CPU backend: c10d ProcessGroupGloo. Where Gloo's native op is as fast
// and as exact, it is used; where it is not, the op is built from others.
// (N = group size, B = full buffer bytes; measured in bench/gloo_native_ops.py
// and the README's collectives table.)
// - allgather into a flat output: Gloo's native _allgather_base (any dtype).
//   Wire: (N-1)/N * B sent per rank.
// - reduce-scatter: an all-to-all (each rank receives every rank's copy of
//   its own shard, (N-1)/N * B on the wire, the bandwidth-optimal amount)
//   into a scratch buffer of B bytes, then a local sum in rank order with
//   fp32 accumulation. Deterministic (bit-identical to the shared-memory
//   transport), 16-bit inputs travel in 16 bits but are summed in fp32 and
//   rounded once, and 1.3-2x faster than Gloo's native reduce-scatter.
// - all-reduce of 16-bit tensors: upcast to fp32, Gloo's ring all-reduce
//   (2(N-1)/N * 2B on the wire), then downcast: Gloo's native 16-bit
//   all-reduce rounds at every addition.
// - bf16 and bool broadcast/allgather: native.
// - every collective is issued by its lane's thread after an allgather of
//   the ranks' signatures (128 bytes each; comm/gloo_lane.h): one extra
//   small round trip, which the caller does not wait for.
#pragma once

#include "zero/comm.h"

namespace zero::comm {

class GlooTransport : public Transport {
 public:
  std::string name() const override { return "gloo"; }
  bool supports(const Group&, CollectiveOp, at::ScalarType, int64_t) const override { return true; }
  int64_t wire_bytes(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel) const override;

  WorkHandle all_gather(const Group& g, at::Tensor out_flat, at::Tensor in_shard, const Signature& sig) override;
  WorkHandle reduce_scatter(const Group& g, at::Tensor out_shard, at::Tensor in_flat, ReduceOp op,
                            const Signature& sig) override;
  WorkHandle all_reduce(const Group& g, at::Tensor t, ReduceOp op, const Signature& sig) override;
  WorkHandle broadcast(const Group& g, at::Tensor t, int root, const Signature& sig) override;
  WorkHandle barrier(const Group& g, const Signature& sig) override;
};

// The signature exchange alone, on the group's Gloo lane that would carry
// `op` (reduce-scatters on theirs): how a transport without a check of its
// own (NCCL, in debug mode) has its collectives compared, in the order the
// CPU path would see them. Blocks until every rank agreed; throws
// CollectiveMismatch on every rank if they do not.
void check_signature_on_host(const Group& g, CollectiveOp op, const Signature& sig);

}  // namespace zero::comm
