// c10d's ProcessGroupNCCL behind the Transport interface (comm/nccl_transport.h).
#include "comm/nccl_transport.h"

#include <mutex>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "comm/gloo_transport.h"
#include "comm/group_impl.h"
#include "comm/signature.h"
#include "comm/work.h"

namespace zero::comm {

namespace {

c10d::ReduceOp nccl_op(ReduceOp op) { return op == ReduceOp::Avg ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM; }

class NcclTransport : public Transport {
 public:
  std::string name() const override { return "nccl"; }
  bool supports(const Group&, CollectiveOp, at::ScalarType, int64_t) const override { return true; }

  // Ring algorithms: what one rank sends, in the dtype that travels.
  int64_t wire_bytes(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel) const override {
    const int64_t n = g.size();
    const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
    switch (op) {
      case CollectiveOp::AllGather:
      case CollectiveOp::ReduceScatter:
        return (n - 1) * (numel / n) * elem;
      case CollectiveOp::AllReduce:
        return 2 * (n - 1) * numel * elem / n;
      case CollectiveOp::Broadcast:
        return numel * elem;
      case CollectiveOp::Barrier:
        return 0;
    }
    return 0;
  }

  WorkHandle all_gather(const Group& g, at::Tensor out_flat, at::Tensor in_shard, const Signature& sig) override {
    if (out_flat.scalar_type() != in_shard.scalar_type()) {
      // Widening: the 16 bits travel, the conversion is queued after them.
      at::Tensor landed = at::empty({out_flat.numel()}, in_shard.options());
      return issue(g, CollectiveOp::AllGather, sig,
                   [&](c10d::Backend& b) { return b._allgather_base(landed, in_shard); },
                   [=] { out_flat.copy_(landed); });
    }
    return issue(g, CollectiveOp::AllGather, sig,
                 [&](c10d::Backend& b) { return b._allgather_base(out_flat, in_shard); }, nullptr);
  }

  WorkHandle reduce_scatter(const Group& g, at::Tensor out_shard, at::Tensor in_flat, ReduceOp op,
                            const Signature& sig) override {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = nccl_op(op);
    if (out_shard.scalar_type() != in_flat.scalar_type()) {
      // 16-bit grads into an fp32 shard: reduced in their dtype into a shard
      // of it (1/N of the bucket), widened once landed.
      at::Tensor landed = at::empty({out_shard.numel()}, in_flat.options());
      return issue(g, CollectiveOp::ReduceScatter, sig,
                   [&](c10d::Backend& b) { return b._reduce_scatter_base(landed, in_flat, opts); },
                   [=] { out_shard.copy_(landed); });
    }
    return issue(g, CollectiveOp::ReduceScatter, sig,
                 [&](c10d::Backend& b) { return b._reduce_scatter_base(out_shard, in_flat, opts); }, nullptr);
  }

  WorkHandle all_reduce(const Group& g, at::Tensor t, ReduceOp op, const Signature& sig) override {
    c10d::AllreduceOptions opts;
    opts.reduceOp = nccl_op(op);
    std::vector<at::Tensor> tensors{t};
    return issue(g, CollectiveOp::AllReduce, sig, [&](c10d::Backend& b) { return b.allreduce(tensors, opts); },
                 nullptr);
  }

  WorkHandle broadcast(const Group& g, at::Tensor t, int root, const Signature& sig) override {
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    std::vector<at::Tensor> tensors{t};
    return issue(g, CollectiveOp::Broadcast, sig, [&](c10d::Backend& b) { return b.broadcast(tensors, opts); },
                 nullptr);
  }

  WorkHandle barrier(const Group& g, const Signature&) override {
    // The dispatcher sends barriers to the group's CPU backend.
    throw CommError("barrier on " + g.describe() + ": not served by NCCL (use the CPU backend)");
  }

 private:
  // The group's NCCL backend for `op`'s lane, made on first use from the
  // group's store.
  static c10d::Backend& backend_of(const Group& g, CollectiveOp op) {
    Group::Impl& impl = g.impl();
    std::lock_guard<std::mutex> lock(impl.device_backend_mu);
    const bool reduce = op == CollectiveOp::ReduceScatter;
    auto& backend = reduce ? impl.device_reduce_backend : impl.device_backend;
    if (!backend) {
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = impl.timeout;
      auto store = c10::make_intrusive<c10d::PrefixStore>(reduce ? "nccl_reduce" : "nccl", impl.store);
      backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, g.rank(), g.size(), opts);
    }
    return *backend;
  }

  template <typename Issue>
  WorkHandle issue(const Group& g, CollectiveOp op, const Signature& sig, Issue&& run, std::function<void()> finish) {
    const std::string what = sig.text + " on " + g.describe() + " (nccl)";
    if (device_signature_check_enabled()) check_signature_on_host(g, op, sig);
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = run(backend_of(g, op));
    } catch (const std::exception& e) {
      throw CommError(what + " failed: " + first_line(e.what()));
    }
    // No host timeout in wait(): that would block the host until done. NCCL's
    // watchdog aborts a collective past the group's timeout (set above).
    return std::make_shared<BackendWork>(std::move(work), std::move(finish), what, std::chrono::milliseconds(0));
  }
};

}  // namespace

std::shared_ptr<Transport> make_nccl_transport() { return std::make_shared<NcclTransport>(); }

}  // namespace zero::comm
