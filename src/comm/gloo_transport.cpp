#include "comm/gloo_transport.h"

#include <cstring>
#include <functional>
#include <mutex>
#include <optional>

#include "comm/group_impl.h"
#include "comm/signature.h"
#include "comm/work.h"
#include "memory/page_buffer.h"

namespace zero::comm {

namespace {

bool is_16bit_float(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

}  // namespace

int64_t GlooTransport::wire_bytes(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel) const {
  const int64_t n = g.size();
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  switch (op) {
    case CollectiveOp::AllGather:      // numel = full output
    case CollectiveOp::ReduceScatter:  // numel = full input
      return (n - 1) * (numel / n) * elem;
    case CollectiveOp::AllReduce: {
      const int64_t wire_elem = is_16bit_float(dtype) ? 4 : elem;
      return 2 * (n - 1) * numel * wire_elem / n;
    }
    case CollectiveOp::Broadcast:  // counted as the payload on every rank
      return numel * elem;
    case CollectiveOp::Barrier:
      return 0;
  }
  return 0;
}

WorkHandle GlooTransport::all_gather(const Group& g, at::Tensor out_flat, at::Tensor in_shard, const Signature& sig) {
  if (g.size() == 1) {
    if (!out_flat.is_same(in_shard)) out_flat.copy_(in_shard);
    return completed_work();
  }
  if (out_flat.scalar_type() != in_shard.scalar_type()) {
    // Widening: gather the 16-bit shards, then convert (Gloo cannot convert
    // as it receives; the shared-memory transport does).
    at::Tensor landed = at::empty({out_flat.numel()}, in_shard.options());
    return g.impl().lane->submit(g, "allgather", sig, [=](c10d::Backend& gloo) {
      at::Tensor out = landed, in = in_shard;
      return gloo._allgather_base(out, in);
    }, [=] { out_flat.copy_(landed); });
  }
  return g.impl().lane->submit(g, "allgather", sig, [=](c10d::Backend& gloo) {
    at::Tensor out = out_flat, in = in_shard;  // the backend takes them by reference
    return gloo._allgather_base(out, in);
  }, nullptr);
}

WorkHandle GlooTransport::reduce_scatter(const Group& g, at::Tensor out_shard, at::Tensor in_flat, ReduceOp op,
                                         const Signature& sig) {
  const int64_t size = g.size();
  const int64_t n = out_shard.numel();
  // Sum the N received copies of this rank's shard in rank order, in fp32
  // for 16-bit inputs, rounding once into out_shard.
  auto reduce_into_out = [=](const at::Tensor& chunks) {
    at::Tensor acc = out_shard.scalar_type() == at::kFloat || out_shard.scalar_type() == at::kDouble
                         ? out_shard
                         : at::empty({n}, out_shard.options().dtype(at::kFloat));
    acc.copy_(chunks[0]);
    for (int64_t r = 1; r < size; ++r) acc.add_(chunks[r]);
    if (op == ReduceOp::Avg && size > 1) acc.div_(static_cast<double>(size));
    if (!acc.is_same(out_shard)) out_shard.copy_(acc);
  };
  if (size == 1) {
    reduce_into_out(in_flat.view({1, n}));
    return completed_work();
  }
  // The scratch is allocated when the collective is issued, not queued.
  auto recv = std::make_shared<at::Tensor>();
  return g.impl().reduce_lane->submit(g, "reduce_scatter", sig, [=](c10d::Backend& gloo) {
    *recv = memory::zeros_flat(size * n, in_flat.scalar_type());  // pages freed with it
    at::Tensor send = in_flat;
    std::vector<int64_t> equal_splits;
    return gloo.alltoall_base(*recv, send, equal_splits, equal_splits);
  }, [=] {
    reduce_into_out(recv->view({size, n}));
    *recv = at::Tensor();
  });
}

WorkHandle GlooTransport::all_reduce(const Group& g, at::Tensor t, ReduceOp op, const Signature& sig) {
  const int size = g.size();
  if (size == 1) return completed_work();
  // 16-bit floats are summed in fp32 (Gloo would sum them in 16 bits, rounding at every addition),
  // converted when the collective is issued (the caller may still be writing t).
  const bool widen = is_16bit_float(t.scalar_type());
  auto buf = std::make_shared<at::Tensor>(t);
  return g.impl().lane->submit(g, "all_reduce", sig, [=](c10d::Backend& gloo) {
    if (widen) *buf = t.to(at::kFloat);
    std::vector<at::Tensor> bufs{*buf};
    return gloo.allreduce(bufs);
  }, [=] {
    if (op == ReduceOp::Avg) buf->div_(static_cast<double>(size));
    if (widen) t.copy_(*buf);
  });
}

WorkHandle GlooTransport::broadcast(const Group& g, at::Tensor t, int root, const Signature& sig) {
  if (g.size() == 1) return completed_work();
  return g.impl().lane->submit(g, "broadcast", sig, [=](c10d::Backend& gloo) {
    std::vector<at::Tensor> bufs{t};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    return gloo.broadcast(bufs, opts);
  }, nullptr);
}

WorkHandle GlooTransport::barrier(const Group& g, const Signature& sig) {
  if (g.size() == 1) return completed_work();
  return g.impl().lane->submit(g, "barrier", sig, [](c10d::Backend& gloo) { return gloo.barrier(); },
                               nullptr);
}

void check_signature_on_host(const Group& g, CollectiveOp op, const Signature& sig) {
  GlooLane& lane = op == CollectiveOp::ReduceScatter ? *g.impl().reduce_lane : *g.impl().lane;
  lane.check(g, to_string(op), sig)->wait();
}

}  // namespace zero::comm
