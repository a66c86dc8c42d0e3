#include "engine/state_offload.h"

#include <stdexcept>
#include <unordered_set>
#include <utility>

#include "memory/storage_release.h"

namespace zero {

namespace {

constexpr std::pair<StateKind, const char*> kNames[] = {
    {StateKind::OptimStates, "optim_states"},
    {StateKind::HpParams, "hp_params"},
    {StateKind::LpParams, "lp_params"},
    {StateKind::LpGrads, "lp_grads"},
    {StateKind::ContiguousGradBuffer, "contiguous_grad_buffer"},
};

// A group's buffers of each kind.
std::vector<std::pair<StateKind, const at::Tensor*>> buffers_of(const partition::FlatGroup& g) {
  return {{StateKind::LpParams, &g.param_flat},     {StateKind::LpParams, &g.param_shard},
          {StateKind::ContiguousGradBuffer, &g.grad_flat}, {StateKind::LpGrads, &g.grad_shard},
          {StateKind::HpParams, &g.master},         {StateKind::OptimStates, &g.exp_avg},
          {StateKind::OptimStates, &g.exp_avg_sq}};
}

// Bytes over the whole of `t`'s storage: what is moved is the storage, so
// every view of it (params, grads, shards that alias another buffer) comes
// back whole.
at::Tensor whole_storage(const at::Tensor& t) {
  const auto bytes = static_cast<int64_t>(t.storage().nbytes());
  return at::empty({0}, t.options().dtype(at::kByte)).set_(t.storage(), 0, {bytes}, {1});
}

}  // namespace

const char* state_kind_name(StateKind k) {
  for (const auto& [kind, name] : kNames)
    if (kind == k) return name;
  return "?";
}

StateKind state_kind_from_name(const std::string& name) {
  std::string known;
  for (const auto& [kind, n] : kNames) {
    if (name == n) return kind;
    known += (known.empty() ? "" : ", ") + std::string(n);
  }
  throw std::invalid_argument("offload_states: no state '" + name + "' (the states: " + known + ")");
}

std::set<StateKind> all_state_kinds() {
  std::set<StateKind> all;
  for (const auto& [kind, name] : kNames) all.insert(kind);
  return all;
}

int64_t StateOffload::offload(const std::vector<partition::FlatGroup>& groups, const std::set<StateKind>& kinds,
                              bool pin_memory) {
  kinds_.insert(kinds.begin(), kinds.end());
  std::unordered_set<const c10::StorageImpl*> seen;
  for (const auto& m : moved_) seen.insert(m.whole.storage().unsafeGetStorageImpl());
  int64_t bytes = 0;
  for (const auto& g : groups) {
    for (const auto& [kind, t] : buffers_of(g)) {
      if (!kinds.count(kind) || !t->defined() || t->device().is_cpu()) continue;
      if (t->storage().nbytes() == 0) continue;  // released (stage 3 at rest): nothing on the device
      if (!seen.insert(t->storage().unsafeGetStorageImpl()).second) continue;
      Moved m{whole_storage(*t), at::Tensor()};
      m.host = at::empty(m.whole.sizes(), at::TensorOptions().dtype(at::kByte).pinned_memory(pin_memory));
      m.host.copy_(m.whole);
      memory::release_storage(m.whole);
      bytes += m.host.numel();
      moved_.push_back(std::move(m));
    }
  }
  return bytes;
}

void StateOffload::reload() {
  // Restored in order; one that fails (out of device memory) leaves the
  // rest moved, so a second reload() can finish the job.
  while (!moved_.empty()) {
    Moved& m = moved_.back();
    memory::restore_storage(m.whole);
    m.whole.copy_(m.host);
    moved_.pop_back();
  }
  kinds_.clear();
}

std::string StateOffload::describe() const {
  std::string out;
  for (StateKind k : kinds_) out += (out.empty() ? "" : ", ") + std::string(state_kind_name(k));
  return out;
}

}  // namespace zero
