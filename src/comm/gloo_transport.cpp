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

// Gloo in 1.13 has no bf16 or bool: move their bytes under a type it has.
at::Tensor gloo_view(const at::Tensor& t) {
  if (t.scalar_type() == at::kBFloat16) return t.view(at::kHalf);
  if (t.scalar_type() == at::kBool) return t.view(at::kByte);
  return t;
}

std::string op_name(const char* op, const Group& g) { return std::string(op) + " on " + g.describe(); }

// Each collective is preceded, on the same Gloo lane (so in the same order
// on every rank), by an allgather of the ranks' signature records, which
// wait() compares before anything else: a rank whose op, size, dtype or
// label differs is an error naming both sides on every rank, whether or not
// Gloo itself notices the mismatched buffers. Issuing does not block, so a
// rank may run ahead of its peers as before. Costs one small allgather.
SignatureCheck exchange_signatures(const Group& g, compat::CollectiveBackend& lane, const Signature& sig,
                                   const char* op) {
  constexpr int64_t kBytes = sizeof(SignatureRecord);
  const SignatureRecord mine = make_signature_record(sig.text);
  auto in = at::empty({kBytes}, at::kByte);
  std::memcpy(in.data_ptr(), &mine, kBytes);
  auto all = at::empty({kBytes * g.size()}, at::kByte);
  std::vector<std::vector<at::Tensor>> outs(1);
  for (int r = 0; r < g.size(); ++r) outs[0].push_back(all.narrow(0, r * kBytes, kBytes));
  std::vector<at::Tensor> ins{in};
  auto work = lane.allgather(outs, ins);
  std::vector<int> ranks = g.global_ranks();
  return {work, [all, ranks, op = std::string(op), group = g.describe()] {
            const auto* records = reinterpret_cast<const SignatureRecord*>(all.data_ptr());
            const std::string error = describe_disagreement(op, group, records, static_cast<int>(ranks.size()),
                                                            [&](int q) { return "rank " + std::to_string(ranks[q]); });
            if (!error.empty()) throw CollectiveMismatch(error);
          }};
}

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
  const int64_t n = in_shard.numel();
  if (g.size() == 1) {
    if (!out_flat.is_same(in_shard)) out_flat.copy_(in_shard);
    return completed_work();
  }
  auto check = exchange_signatures(g, *g.impl().backend, sig, "allgather");
  at::Tensor out = gloo_view(out_flat);
  std::vector<std::vector<at::Tensor>> outs(1);
  for (int r = 0; r < g.size(); ++r) outs[0].push_back(out.narrow(0, r * n, n));
  std::vector<at::Tensor> ins{gloo_view(in_shard)};
  auto w = g.impl().backend->allgather(outs, ins);
  return std::make_shared<BackendWork>(w, nullptr, op_name("allgather", g), g.impl().timeout, std::move(check));
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
  auto check = exchange_signatures(g, *g.impl().reduce_backend, sig, "reduce_scatter");
  at::Tensor recv = memory::zeros_flat(size * n, in_flat.scalar_type());  // pages freed with it
  at::Tensor recv_view = gloo_view(recv);
  at::Tensor send_view = gloo_view(in_flat);
  std::vector<int64_t> equal_splits;
  auto w = g.impl().reduce_backend->alltoall_base(recv_view, send_view, equal_splits, equal_splits);
  return std::make_shared<BackendWork>(
      w, [=] { reduce_into_out(recv.view({size, n})); }, op_name("reduce_scatter", g), g.impl().timeout,
      std::move(check));
}

WorkHandle GlooTransport::all_reduce(const Group& g, at::Tensor t, ReduceOp op, const Signature& sig) {
  const int size = g.size();
  if (size == 1) return completed_work();
  auto check = exchange_signatures(g, *g.impl().backend, sig, "all_reduce");
  // 16-bit floats are summed in fp32 (Gloo has no bf16 and sums fp16 in fp16).
  at::Tensor buf = is_16bit_float(t.scalar_type()) ? t.to(at::kFloat) : t;
  std::vector<at::Tensor> bufs{buf};
  auto w = g.impl().backend->allreduce(bufs);
  std::function<void()> finish;
  if (op == ReduceOp::Avg || !buf.is_same(t))
    finish = [=]() mutable {
      if (op == ReduceOp::Avg) buf.div_(static_cast<double>(size));
      if (!buf.is_same(t)) t.copy_(buf);
    };
  return std::make_shared<BackendWork>(w, finish, op_name("all_reduce", g), g.impl().timeout, std::move(check));
}

WorkHandle GlooTransport::broadcast(const Group& g, at::Tensor t, int root, const Signature& sig) {
  if (g.size() == 1) return completed_work();
  auto check = exchange_signatures(g, *g.impl().backend, sig, "broadcast");
  std::vector<at::Tensor> bufs{gloo_view(t)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  auto w = g.impl().backend->broadcast(bufs, opts);
  return std::make_shared<BackendWork>(w, nullptr, op_name("broadcast", g), g.impl().timeout, std::move(check));
}

WorkHandle GlooTransport::barrier(const Group& g, const Signature& sig) {
  if (g.size() == 1) return completed_work();
  auto check = exchange_signatures(g, *g.impl().backend, sig, "barrier");
  auto w = g.impl().backend->barrier();
  return std::make_shared<BackendWork>(w, nullptr, op_name("barrier", g), g.impl().timeout, std::move(check));
}

}  // namespace zero::comm
