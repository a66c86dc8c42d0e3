// Full params outside forward and backward: the gathered_parameters() scope
// (read, print, evaluate, modify and write back) and the whole-model
// state_dict() / save_weights().
#include <algorithm>
#include <cstdio>
#include <unordered_map>

#include "ckpt/safetensors.h"
#include "engine/engine_impl.h"

namespace zero {

namespace {

// After params changed outside the optimizer (modified in a gathered scope):
// the fp32 masters, and params sharded at rest, follow. 16-bit params write
// only the elements that changed, so the others keep their fp32 precision.
void masters_from_params(const StagePolicy& policy, int rank, FlatOptimizer& optimizer, partition::FlatGroup& g) {
  at::NoGradGuard no_grad;
  const bool master_is_params = policy.update_destination(g, rank).data_ptr() == g.master.data_ptr();
  // NVMe offload: paged in, written back (the master unless it is the params).
  auto state = optimizer.resident(g, /*write_state=*/!master_is_params, /*write_params=*/true);
  if (g.param_shard.defined()) g.param_shard.copy_(g.own_slot(g.param_flat, rank));
  if (!master_is_params) {
    // On the master's device: the host when the optimizer is offloaded.
    const at::Tensor src = policy.update_destination(g, rank).to(g.master.device());
    if (g.storage_dtype == at::kFloat) {
      g.master.copy_(src);
    } else {
      // Compared in the storage dtype: an fp32 (widened) param holds 16-bit values.
      const auto changed = src.to(g.storage_dtype).ne(g.master.to(g.storage_dtype));
      g.master.copy_(at::where(changed, src.to(at::kFloat), g.master));
    }
  }
  state.done();
}

}  // namespace

Engine::GatheredParameters::GatheredParameters(Engine& e, std::vector<at::Tensor> params,
                                               std::optional<int> modifier_rank)
    : engine_(e), modifier_rank_(modifier_rank), uncaught_at_entry_(std::uncaught_exceptions()) {
  auto& m = *e.impl_;
  const c10::OptionalDeviceGuard on_device(guard_device(m.device));
  m.check_usable();
  if (modifier_rank && (*modifier_rank < 0 || *modifier_rank >= m.dp.size()))
    throw std::invalid_argument("gathered_parameters: modifier_rank " + std::to_string(*modifier_rank) +
                                " is not a rank of " + m.dp.describe());
  if (m.reducer->in_backward()) throw std::logic_error("gathered_parameters() inside a backward");
  std::unordered_map<const void*, size_t> group_of;
  for (size_t gi = 0; gi < m.groups.size(); ++gi)
    for (const auto& p : m.groups[gi].params) group_of[p.unsafeGetTensorImpl()] = gi;
  std::unordered_map<const void*, size_t> replicated_of;
  for (size_t i = 0; i < m.replicated.size(); ++i) replicated_of[m.replicated[i].tensor.unsafeGetTensorImpl()] = i;
  if (params.empty()) {
    for (size_t gi = 0; gi < m.groups.size(); ++gi) groups_.push_back(gi);
  } else {
    for (const auto& p : params) {
      if (auto it = group_of.find(p.unsafeGetTensorImpl()); it != group_of.end()) {
        groups_.push_back(it->second);
      } else if (auto r = replicated_of.find(p.unsafeGetTensorImpl()); r != replicated_of.end()) {
        replicated_.push_back(p);
      } else {
        throw std::invalid_argument("gathered_parameters: a tensor of shape " + c10::str(p.sizes()) +
                                    " is not a param or buffer of this engine's model");
      }
    }
    std::sort(groups_.begin(), groups_.end());  // the same order on every rank
    groups_.erase(std::unique(groups_.begin(), groups_.end()), groups_.end());
  }
  if (m.stage3) {
    size_t pinned = 0;
    try {
      for (; pinned < groups_.size(); ++pinned) m.stage3->pin(groups_[pinned]);
    } catch (...) {
      for (size_t k = 0; k < pinned; ++k) m.stage3->unpin(groups_[k]);
      throw;
    }
  }
  ++m.gathered_scopes;
}

void Engine::GatheredParameters::finish() {
  if (finished_) return;
  finished_ = true;
  auto& m = *engine_.impl_;
  const c10::OptionalDeviceGuard on_device(guard_device(m.device));
  --m.gathered_scopes;
  struct Unpin {  // whatever happens below, the units go back to the schedule
    Engine::Impl& m;
    const std::vector<size_t>& groups;
    ~Unpin() {
      if (m.stage3)
        for (size_t gi : groups) m.stage3->unpin(gi);
    }
  } unpin{m, groups_};
  if (!modifier_rank_) return;
  std::vector<comm::WorkHandle> works;
  for (size_t gi : groups_)
    works.push_back(m.comm.broadcast(m.dp, m.groups[gi].param_flat, *modifier_rank_, "params modified in a gathered scope"));
  for (auto& w : works) w->wait();
  for (size_t gi : groups_) masters_from_params(m.policy, m.dp.rank(), m.optimizer, m.groups[gi]);
  m.comm.broadcast_coalesced(m.dp, replicated_, *modifier_rank_, "frozen params and buffers modified in a gathered scope");
}

void Engine::GatheredParameters::abandon() {
  if (finished_) return;
  finished_ = true;
  auto& m = *engine_.impl_;
  const c10::OptionalDeviceGuard on_device(guard_device(m.device));
  --m.gathered_scopes;
  if (m.stage3)
    for (size_t gi : groups_) m.stage3->unpin(gi);
}

Engine::GatheredParameters::~GatheredParameters() {
  if (finished_) return;
  auto& m = *engine_.impl_;
  if (std::uncaught_exceptions() > uncaught_at_entry_) {
    abandon();  // unwinding: no collective (the peers may not be here); nothing is written back
    return;
  }
  try {
    finish();
  } catch (const std::exception& e) {
    m.deferred_error = std::string("the write-back ending gathered_parameters() failed: ") + e.what();
  } catch (...) {
    m.deferred_error = "the write-back ending gathered_parameters() failed";
  }
}

std::map<std::string, at::Tensor> Engine::state_dict(bool rank0_only) {
  const c10::OptionalDeviceGuard on_device(guard_device(impl_->device));
  auto& m = *impl_;
  m.check_usable();
  const bool keep = !rank0_only || m.dp.rank() == 0;
  std::map<std::string, at::Tensor> out;
  for (const auto& g : m.groups) {
    auto master = m.optimizer.resident(g, /*write=*/false);  // NVMe offload: paged in
    at::Tensor full = g.master;  // stage 0: every rank holds every master
    if (m.policy.shard_optimizer_state) {
      full = at::empty({g.layout.padded_numel}, g.master.options());
      m.comm.all_gather(m.dp, full, g.master, "state_dict")->wait();
    } else if (m.optimizer.pages_state()) {
      full = g.master.clone();  // its pages leave with `master`
    }
    master.done();
    if (!keep) continue;
    for (size_t i = 0; i < g.params.size(); ++i) {
      const auto& s = g.layout.params[i];
      at::Tensor value = full.narrow(0, s.offset, s.numel).view(g.params[i].sizes()).clone();
      out[g.names[i]] = value;
      if (auto it = m.model.other_names.find(g.params[i].unsafeGetTensorImpl()); it != m.model.other_names.end())
        for (const auto& name : it->second) out[name] = value;
    }
  }
  if (keep)
    for (const auto& r : m.replicated) out[r.name] = r.tensor.detach().clone();
  return out;
}

void Engine::save_weights(const std::string& path) {
  const c10::OptionalDeviceGuard on_device(guard_device(impl_->device));
  auto& m = *impl_;
  // Tied params once, under their first name (as the checkpoints name them).
  std::unordered_map<std::string, bool> alias;
  for (const auto& [impl, names] : m.model.other_names)
    for (const auto& n : names) alias[n] = true;
  const auto state = state_dict(/*rank0_only=*/true);
  std::string error;
  if (m.dp.rank() == 0) {
    try {
      ckpt::SafetensorsWriter w;
      std::vector<at::Tensor> keep;
      for (const auto& [name, t] : state) {
        if (alias.count(name)) continue;
        keep.push_back(t.to(at::kCPU).contiguous());  // written from the host
        w.add(name, safetensors_dtype(t.scalar_type()), t.sizes().vec(), keep.back().data_ptr());
      }
      w.set_metadata("format", "pt");
      w.set_metadata("source", "zero-cpp save_weights");
      const std::string tmp = path + ".tmp";
      w.write(tmp);
      if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp + " to " + path);
    } catch (const std::exception& e) {
      error = std::string("save_weights: ") + e.what();
    }
  }
  agree_or_throw(m.comm, m.dp, "save_weights", error);
}

}  // namespace zero
