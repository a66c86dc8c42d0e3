// One param's training state by name, outside the step: DeepSpeed's
// safe_get_full_* / safe_set_full_* debugging and surgery accessors
// (every rank calls them, for the same param), and the local ones, which
// read or write only the part of the param this rank's shard holds.
//
// A param's part on this rank: the layout lays the params end to end in
// the group's flat buffer and gives rank r the flat elements
// [r * shard_numel, (r + 1) * shard_numel); the param's part is its range's
// intersection with that (stages 1-3), possibly empty; at stage 0 every rank
// holds all of it.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine_impl.h"

namespace zero {

namespace {

struct Located {
  const partition::FlatGroup* group = nullptr;
  size_t index = 0;
};

Located find_trainable(const std::vector<partition::FlatGroup>& groups, const std::string& name,
                       const std::string& what) {
  for (const auto& g : groups)
    for (size_t i = 0; i < g.params.size(); ++i)
      if (g.names[i] == name) return {&g, i};
  throw std::invalid_argument(what + ": no trainable param of that name");
}

// The elements of param `i` this rank holds: [lo, hi) in the group's flat
// index space, and `begin`, the flat index of this rank's first element.
struct Part {
  int64_t lo, hi, begin;
};

Part part_of(const partition::FlatGroup& g, size_t i, bool sharded, int rank) {
  const auto& s = g.layout.params[i];
  if (!sharded) return {s.offset, s.offset + s.numel, 0};
  const int64_t shard = g.layout.shard_numel, begin = rank * shard;
  // Clamped to the shard, so an empty part still narrows a shard-sized buffer.
  const int64_t lo = std::clamp(s.offset, begin, begin + shard);
  const int64_t hi = std::max(lo, std::min(s.offset + s.numel, begin + shard));
  return {lo, hi, begin};
}

// This rank's buffer of `kind` for group `g`: the flat index `begin` is its
// element 0. Sharded alike (stages 1-3): the master, its moments and the
// reduced fp32 grads cover this rank's shard; at stage 0 every rank holds
// all of them, the all-reduced grads in the grads' dtype.
at::Tensor buffer_of(const partition::FlatGroup& g, bool sharded, const std::string& kind, const std::string& what) {
  const at::Tensor t = kind == "master"       ? g.master
                       : kind == "exp_avg"    ? g.exp_avg
                       : kind == "exp_avg_sq" ? g.exp_avg_sq
                       : kind == "grad"       ? (sharded ? g.grad_shard : g.grad_flat)
                                              : at::Tensor();
  if (!t.defined())
    throw std::invalid_argument(what + ": this engine's optimizer keeps no such state (its kinds: master, grad" +
                                std::string(g.exp_avg.defined() ? ", exp_avg" : "") +
                                (g.exp_avg_sq.defined() ? ", exp_avg_sq" : "") + ")");
  return t;
}

std::string accessor_call(const char* fn, const std::string& kind, const std::string& name) {
  return std::string(fn) + "(\"" + kind + "\", \"" + name + "\")";
}

// fp32: the master the optimizer updates is the params' own memory.
bool master_is_params(const StagePolicy& policy, const partition::FlatGroup& g, int rank) {
  return policy.update_destination(g, rank).data_ptr() == g.master.data_ptr();
}

// Copies what the pending master writes hold for elements [first, first +
// out.numel()) of param `i` of group `gi` into `out` (later writes last).
void read_through_pending(const std::vector<PendingMasterWrite>& pending, size_t gi, size_t i,
                          at::Tensor out, int64_t first) {
  for (const auto& w : pending) {
    if (w.group != gi || w.param != i) continue;
    const int64_t lo = std::max(first, w.first);
    const int64_t hi = std::min(first + out.numel(), w.first + w.values.numel());
    if (lo < hi) out.narrow(0, lo - first, hi - lo).copy_(w.values.narrow(0, lo - w.first, hi - lo));
  }
}

}  // namespace

void Engine::Impl::apply_pending_masters() {
  at::NoGradGuard no_grad;
  for (const auto& w : pending_masters) {
    auto& g = groups[w.group];
    const int64_t flat_first = g.layout.params[w.param].offset + w.first;
    auto held = optimizer.resident(g, /*write_state=*/true, /*write_params=*/true);  // NVMe: paged in, written back
    if (policy.shard_optimizer_state && !policy.shard_params) {
      // Stages 1-2: every rank holds the full params, and set_state kept the whole value.
      g.param_flat.narrow(0, flat_first, w.values.numel()).copy_(w.values);
    } else {
      const int64_t begin = policy.shard_optimizer_state ? dp.rank() * g.layout.shard_numel : 0;
      g.master.narrow(0, flat_first - begin, w.values.numel()).copy_(w.values);
    }
    held.done();
  }
  pending_masters.clear();
}

std::pair<const partition::FlatGroup*, size_t> Engine::Impl::begin_state_access(const std::string& what,
                                                                                const std::string& kind,
                                                                                const std::string& name) {
  check_usable();
  if (kind == "grad") check_grads_reduced(what);
  const Located at = find_trainable(groups, name, what);
  return {at.group, at.index};
}

void Engine::Impl::check_grads_reduced(const std::string& what) {
  if (optimizer.pages_state())
    throw std::invalid_argument(what + ": not with offload to NVMe, which keeps the reduced grads on disk");
  if (coalescing || no_sync || reducer->has_unreduced() || !boundary())
    throw std::logic_error(what + ": the reduced grads exist between a boundary's backward and its step (not "
                           "inside no_sync() or coalesce_grad_reduction(), nor on another micro-step)");
}

at::Tensor Engine::full_state(const std::string& kind, const std::string& name) {
  const c10::OptionalDeviceGuard on_device(guard_device(impl_->device));
  auto& m = *impl_;
  const std::string what = accessor_call("full_state", kind, name);
  const auto [g, i] = m.begin_state_access(what, kind, name);
  auto held = m.optimizer.resident(*g, /*write=*/false);  // NVMe offload: the group's state paged in
  const at::Tensor local = buffer_of(*g, m.policy.shard_optimizer_state, kind, what);
  const auto& s = g->layout.params[i];
  const Part p = part_of(*g, i, m.policy.shard_optimizer_state, m.dp.rank());
  const size_t gi = static_cast<size_t>(g - m.groups.data());
  if (!m.policy.shard_optimizer_state) {
    at::Tensor out = local.narrow(0, s.offset, s.numel).to(at::kFloat).clone();
    held.done();
    if (kind == "master") read_through_pending(m.pending_masters, gi, i, out, 0);
    return out.view(g->params[i].sizes());
  }
  // Each rank writes its part into zeros; the parts are disjoint, so their
  // sum over the ranks is the param, exactly (x + 0 is x).
  at::Tensor out = at::zeros({s.numel}, local.options().dtype(at::kFloat));
  if (p.lo < p.hi) {
    at::Tensor mine = out.narrow(0, p.lo - s.offset, p.hi - p.lo);
    mine.copy_(local.narrow(0, p.lo - p.begin, p.hi - p.lo));
    if (kind == "master") read_through_pending(m.pending_masters, gi, i, mine, p.lo - s.offset);
  }
  held.done();
  m.comm.all_reduce(m.dp, out, comm::ReduceOp::Sum, "full_state")->wait();
  return out.view(g->params[i].sizes());
}

std::pair<int64_t, int64_t> Engine::local_range(const std::string& name) const {
  const auto& m = *impl_;
  const auto [g, i] = find_trainable(m.groups, name, "local_range(\"" + name + "\")");
  const Part p = part_of(*g, i, m.policy.shard_optimizer_state, m.dp.rank());
  if (p.lo == p.hi) return {0, 0};
  return {p.lo - g->layout.params[i].offset, p.hi - p.lo};
}

at::Tensor Engine::local_param(const std::string& name) const {
  const auto& m = *impl_;
  if (!m.policy.shard_params || m.param_swap) return {};  // below stage 3, or shards paged to NVMe
  const auto [g, i] = find_trainable(m.groups, name, "local_param(\"" + name + "\")");
  if (!g->param_shard.defined()) return {};
  const Part p = part_of(*g, i, /*sharded=*/true, m.dp.rank());
  return g->param_shard.narrow(0, p.lo - p.begin, p.hi - p.lo);
}

at::Tensor Engine::local_state(const std::string& kind, const std::string& name) {
  const c10::OptionalDeviceGuard on_device(guard_device(impl_->device));
  auto& m = *impl_;
  const std::string what = accessor_call("local_state", kind, name);
  const auto [g, i] = m.begin_state_access(what, kind, name);
  auto held = m.optimizer.resident(*g, /*write=*/false);
  const at::Tensor local = buffer_of(*g, m.policy.shard_optimizer_state, kind, what);
  const Part p = part_of(*g, i, m.policy.shard_optimizer_state, m.dp.rank());
  at::Tensor out = local.narrow(0, p.lo - p.begin, p.hi - p.lo).to(at::kFloat).clone();
  held.done();
  if (kind == "master" && p.lo < p.hi)
    read_through_pending(m.pending_masters, static_cast<size_t>(g - m.groups.data()), i, out,
                         p.lo - g->layout.params[i].offset);
  return out;
}

void Engine::set_state(const std::string& kind, const std::string& name, const at::Tensor& value, bool local) {
  const c10::OptionalDeviceGuard on_device(guard_device(impl_->device));
  auto& m = *impl_;
  const std::string what = accessor_call(local ? "set_local_state" : "set_full_state", kind, name);
  const auto [g, i] = m.begin_state_access(what, kind, name);
  const auto& s = g->layout.params[i];
  const Part p = part_of(*g, i, m.policy.shard_optimizer_state, m.dp.rank());
  const int64_t expected = local ? p.hi - p.lo : s.numel;
  if (value.numel() != expected)
    throw std::invalid_argument(what + ": the value has " + std::to_string(value.numel()) + " elements, the " +
                                (local ? "part of the param this rank holds has " : "param has ") +
                                std::to_string(expected));
  at::NoGradGuard no_grad;
  const at::Tensor flat = value.detach().reshape({-1});
  if (kind == "master" && master_is_params(m.policy, *g, m.dp.rank())) {
    // fp32: writing the master would change the params now; as DeepSpeed's,
    // they take the value at the next step, so it waits until then.
    const bool whole_params = m.policy.shard_optimizer_state && !m.policy.shard_params;
    if (whole_params && local)  // stages 1-2: every rank holds the full params, and they must stay alike
      throw std::logic_error(what + ": at stages 1-2 in fp32 the master is the params every rank holds: set the "
                             "whole value (full), not one rank's part");
    PendingMasterWrite w{static_cast<size_t>(g - m.groups.data()), i, 0, {}};
    if (whole_params) {
      w.values = flat.to(at::kFloat).clone();
    } else if (p.lo < p.hi) {
      w.first = p.lo - s.offset;
      w.values = (local ? flat : flat.narrow(0, w.first, p.hi - p.lo)).to(at::kFloat).clone();
    }
    if (w.values.defined()) m.pending_masters.push_back(std::move(w));
    return;
  }
  auto held = m.optimizer.resident(*g, /*write_state=*/true, /*write_params=*/false);  // NVMe: paged in, written back
  if (p.lo < p.hi) {  // else this rank holds none of it
    const at::Tensor dest =
        buffer_of(*g, m.policy.shard_optimizer_state, kind, what).narrow(0, p.lo - p.begin, p.hi - p.lo);
    dest.copy_(local ? flat : flat.narrow(0, p.lo - s.offset, p.hi - p.lo));
  }
  held.done();
}

}  // namespace zero
