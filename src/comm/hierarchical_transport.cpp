#include "comm/hierarchical_transport.h"

#include <functional>

#include "comm/env_switch.h"
#include "comm/gloo_transport.h"
#include "comm/group_impl.h"
#include "comm/serial_executor.h"
#include "comm/shm_transport.h"

namespace zero::comm {

HierGroup::HierGroup() {
  for (auto& lane : lanes) lane.executor = std::make_unique<SerialExecutor>();
}
HierGroup::~HierGroup() = default;

namespace {

class ExecutorWork : public Work {
 public:
  ExecutorWork(std::shared_future<void> done, std::string what) : done_(std::move(done)), what_(std::move(what)) {}
  void wait() override {
    try {
      done_.get();
    } catch (const CollectiveMismatch&) {
      throw;
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError(what_ + " failed: " + e.what());
    }
  }
  bool is_completed() override {
    return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::shared_future<void> done_;
  std::string what_;
};


const HierGroup& hier_of(const Group& g) { return *g.impl().hier; }

// Where group rank r's block sits when blocks are ordered by (local index, host).
int64_t by_local_block(const HierGroup& h, int r) {
  return static_cast<int64_t>(h.layout.local_of[r]) * h.layout.hosts + h.layout.host_of[r];
}

// Partial sums travel in fp32 (or fp64): one rounding at the end.
at::ScalarType accumulation_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

}  // namespace

bool hierarchical_allowed_by_env() { return env_switch_on("ZERO_HIERARCHICAL"); }

const HierGroup* hier_group(const Group& g) { return g.impl().hier.get(); }

// Queues `steps` on the lane's executor: the collective returns at once.
WorkHandle HierarchicalTransport::submit(const Group& g, int lane, const Signature& sig, Steps steps) {
  const HierGroup& h = hier_of(g);
  const HierGroup::Lane& l = h.lanes[lane];
  auto job = [steps = std::move(steps), &h, &l, inner = inner_, label = sig.text, ranks = g.size()] {
    steps(h, l, *inner, label, ranks);
  };
  return std::make_shared<ExecutorWork>(l.executor->submit(std::move(job)), sig.text + " on " + g.describe() + " (hier)");
}

HierarchicalTransport::HierarchicalTransport() : inner_(std::make_shared<Comm>(std::make_shared<GlooTransport>())) {
  inner_->add_fast_path(std::make_shared<ShmTransport>());
}

bool HierarchicalTransport::supports(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel) const {
  const HierGroup* h = hier_group(g);
  if (!h) return false;
  switch (op) {
    case CollectiveOp::AllGather:
      return true;
    case CollectiveOp::AllReduce:
      return reducible_elem(dtype).has_value();
    case CollectiveOp::ReduceScatter: {
      if (!reducible_elem(dtype)) return false;
      // fp32 partial sums cross the hosts: worth it when they are fewer
      // bytes than the flat all-to-all's (L ranks' shards in the input dtype).
      const int64_t partial = c10::elementSize(accumulation_dtype(dtype));
      return partial < h->layout.per_host * static_cast<int64_t>(c10::elementSize(dtype));
    }
    default:
      return false;
  }
  (void)numel;
}

int64_t HierarchicalTransport::wire_bytes(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel) const {
  const HierGroup& h = hier_of(g);
  const int64_t hosts = h.layout.hosts, n = g.size();
  switch (op) {
    case CollectiveOp::AllGather:  // numel = the full output
      return (hosts - 1) * (numel / n) * static_cast<int64_t>(c10::elementSize(dtype));
    case CollectiveOp::ReduceScatter:
      return (hosts - 1) * (numel / n) * static_cast<int64_t>(c10::elementSize(accumulation_dtype(dtype)));
    case CollectiveOp::AllReduce: {
      const int64_t slice = (numel + h.layout.per_host - 1) / h.layout.per_host;
      return 2 * (hosts - 1) * slice / hosts * static_cast<int64_t>(c10::elementSize(accumulation_dtype(dtype)));
    }
    default:
      return 0;
  }
}

// Inter-host allgather of this rank's shard among its local index's ranks
// (one per host), then an allgather of those inside the host; the result
// lands block (local, host) -> the group rank there.
WorkHandle HierarchicalTransport::all_gather(const Group& g, at::Tensor out_flat, at::Tensor in_shard,
                                             const Signature& sig) {
  return submit(g, 0, sig, [=](const HierGroup& h, const HierGroup::Lane& lane, Comm& inner, const std::string& label,
                               int ranks) {
    const int64_t s = in_shard.numel();
    const int hosts = h.layout.hosts;
    at::Tensor across = at::empty({hosts * s}, in_shard.options());
    inner.all_gather(*lane.inter, across, in_shard, label + " / between hosts")->wait();
    at::Tensor by_local = at::empty({h.layout.per_host * hosts * s}, out_flat.options());
    inner.all_gather(*lane.intra, by_local, across, label + " / inside the host")->wait();
    for (int r = 0; r < ranks; ++r) out_flat.narrow(0, r * s, s).copy_(by_local.narrow(0, by_local_block(h, r) * s, s));
  });
}

// The input rearranged so that local rank l's part holds the shards of the
// ranks with local index l on every host; reduce-scattered inside the host
// (fp32 partial sums), then across hosts among the local index's ranks.
WorkHandle HierarchicalTransport::reduce_scatter(const Group& g, at::Tensor out_shard, at::Tensor in_flat, ReduceOp op,
                                                 const Signature& sig) {
  return submit(g, 1, sig, [=](const HierGroup& h, const HierGroup::Lane& lane, Comm& inner, const std::string& label,
                               int ranks) {
    const int64_t s = out_shard.numel();
    at::Tensor by_local = at::empty_like(in_flat);
    for (int r = 0; r < ranks; ++r) by_local.narrow(0, by_local_block(h, r) * s, s).copy_(in_flat.narrow(0, r * s, s));
    const auto acc = accumulation_dtype(in_flat.scalar_type());
    at::Tensor host_sums = at::empty({h.layout.hosts * s}, in_flat.options().dtype(acc));
    inner.reduce_scatter(*lane.intra, host_sums, by_local, ReduceOp::Sum, label + " / inside the host")->wait();
    at::Tensor total = out_shard.scalar_type() == acc ? out_shard : at::empty({s}, host_sums.options());
    inner.reduce_scatter(*lane.inter, total, host_sums, ReduceOp::Sum, label + " / between hosts")->wait();
    if (op == ReduceOp::Avg) total.div_(static_cast<double>(ranks));
    if (!total.is_same(out_shard)) out_shard.copy_(total);
  });
}

// Reduce-scatter inside the host into 1/L slices (fp32), all-reduce each
// slice across hosts, allgather the slices inside the host.
WorkHandle HierarchicalTransport::all_reduce(const Group& g, at::Tensor t, ReduceOp op, const Signature& sig) {
  return submit(g, 0, sig, [=](const HierGroup& h, const HierGroup::Lane& lane, Comm& inner, const std::string& label,
                               int ranks) {
    const int per_host = h.layout.per_host;
    const int64_t m = t.numel(), slice = (m + per_host - 1) / per_host;
    at::Tensor padded = at::zeros({slice * per_host}, t.options());
    padded.narrow(0, 0, m).copy_(t.view(-1));
    at::Tensor mine = at::empty({slice}, t.options().dtype(accumulation_dtype(t.scalar_type())));
    inner.reduce_scatter(*lane.intra, mine, padded, ReduceOp::Sum, label + " / inside the host")->wait();
    inner.all_reduce(*lane.inter, mine, ReduceOp::Sum, label + " / between hosts")->wait();
    at::Tensor whole = at::empty({slice * per_host}, mine.options());
    inner.all_gather(*lane.intra, whole, mine, label + " / inside the host")->wait();
    at::Tensor result = whole.narrow(0, 0, m);
    if (op == ReduceOp::Avg) result.div_(static_cast<double>(ranks));
    t.view(-1).copy_(result);
  });
}

WorkHandle HierarchicalTransport::broadcast(const Group& g, at::Tensor, int, const Signature&) {
  throw CommError("broadcast on " + g.describe() + ": not served hierarchically (supports() said no)");
}

WorkHandle HierarchicalTransport::barrier(const Group& g, const Signature&) {
  throw CommError("barrier on " + g.describe() + ": not served hierarchically (supports() said no)");
}

}  // namespace zero::comm
