#include "engine/grouping.h"

#include <algorithm>
#include <set>
#include <unordered_set>

#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include "engine/flat_optimizer.h"
#include "memory/page_buffer.h"
#include "memory/storage_release.h"
#include "offload/param_swap.h"
#include "zero/stage3.h"
#include "zero/unit_runtime.h"

namespace zero {

namespace {

struct Params {
  std::vector<at::Tensor> tensors;  // registration order, each once
  std::vector<std::string> names;   // its first registered name
  std::unordered_map<const void*, int64_t> index_of;
};

Params trainable_params(torch::nn::Module& model, ModelGroups& out) {
  Params p;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const at::Tensor& t = item.value();
    if (!t.requires_grad()) continue;
    if (p.index_of.count(t.unsafeGetTensorImpl())) {
      out.other_names[t.unsafeGetTensorImpl()].push_back(item.key());
      continue;
    }
    if (t.scalar_type() != at::kFloat)
      throw std::invalid_argument("zero::Engine: param " + item.key() + " is " + c10::toString(t.scalar_type()) +
                                  "; build the model in fp32 (the engine casts to bf16/fp16 as configured)");
    p.index_of[t.unsafeGetTensorImpl()] = static_cast<int64_t>(p.tensors.size());
    p.tensors.push_back(t);
    p.names.push_back(item.key());
  }
  if (p.tensors.empty()) throw std::invalid_argument("zero::Engine: the model has no trainable parameters");
  return p;
}

// ZeRO-Offload, for a model on a device: offload_param keeps stage 3's
// param shards in host memory (gathers send them up first), and
// offload_optimizer the fp32 master and the optimizer state, which the flat
// optimizer then updates there (engine/flat_optimizer.cpp). Host copies are
// pinned when the config asks, for their transfers. An fp32 master that is
// the shard itself goes with it.
void place_offloaded(partition::FlatGroup& g, const GroupingContext& ctx) {
  if (g.param_flat.is_cpu()) return;  // a host model: the state is there already
  // Allocated, then copied: Tensor::to() would drop pinned_memory (torch's
  // _to_copy pins only a non-blocking copy down from CUDA), leaving every
  // gather and upload to copy from pageable memory.
  const auto host = [](const at::Tensor& t, bool pin) {
    at::Tensor h = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(pin));
    h.copy_(t);
    return h;
  };
  const auto& z = ctx.config.zero;
  const bool master_is_shard = g.master.defined() && g.param_shard.defined() && g.master.is_same(g.param_shard);
  if (z.offload_param.device != OffloadDevice::None && ctx.policy.shard_params && g.param_shard.defined()) {
    if (z.offload_param.device == OffloadDevice::CPU) {
      g.param_shard = host(g.param_shard, z.offload_param.pin_memory);
    } else {
      // NVMe: page-backed, for its swap file (offload/param_swap.h); the
      // gathers send it up from there.
      at::Tensor paged = memory::zeros_flat(g.param_shard.numel(), g.param_shard.scalar_type(), at::kCPU,
                                            /*shared=*/false);
      paged.copy_(g.param_shard);
      g.param_shard = paged;
    }
    if (master_is_shard) g.master = g.param_shard;
  }
  // NVMe: unpinned (the optimizer makes it page-backed for its swap file;
  // the transfers go through the optimizer's pinned staging buffers).
  if (z.offload_optimizer.device != OffloadDevice::None && !g.master.is_cpu())
    g.master = host(g.master, z.offload_optimizer.device == OffloadDevice::CPU && z.offload_optimizer.pin_memory);
}

// The master the optimizer updates, and the params in their dtypes: fp32
// params are updated in place (the flat buffer, its own slot, or the shard
// kept at rest); 16-bit ones get a 16-bit copy of the buffer to view, or,
// computing in fp32 (widened), keep the fp32 buffer holding the 16-bit
// values, with a 16-bit shard (stages 1-3) that the update writes and the
// gathers widen.
void setup_precision(partition::FlatGroup& g, const GroupingContext& ctx) {
  at::NoGradGuard no_grad;
  const Precision& pr = ctx.precision;
  const int rank = ctx.dp.rank();
  g.storage_dtype = pr.storage;
  const at::Tensor fp32 = ctx.policy.shard_optimizer_state ? g.own_slot(g.param_flat, rank) : g.param_flat;
  if (pr.storage != at::kFloat) {
    g.master = memory::flat_copy_of(fp32);  // shared pages: the unfused gather reads it
    if (pr.widened()) {
      g.param_flat.copy_(g.param_flat.to(pr.storage));  // the values a 16-bit param holds
      if (ctx.policy.shard_optimizer_state) g.param_shard = memory::flat_copy_of(g.master, pr.storage);
    } else {
      at::Tensor low = memory::zeros_flat(g.layout.padded_numel, pr.storage, g.param_flat.device());
      low.copy_(g.param_flat);
      partition::view_params_in(g, low);  // the fp32 buffer goes here
    }
  }
  if (ctx.policy.shard_params && !g.param_shard.defined())
    g.param_shard = memory::flat_copy_of(g.own_slot(g.param_flat, rank));  // peers' gathers read it in place
  if (!g.master.defined()) g.master = ctx.policy.update_destination(g, rank);  // fp32: the params themselves
  place_offloaded(g, ctx);
  ctx.optimizer.init_state(g);
  if (auto* params = ctx.optimizer.param_swap()) params->adopt(g);  // offload_param nvme: to disk now
}

partition::FlatGroup make_group(const Params& p, const std::vector<int64_t>& members, const GroupingContext& ctx,
                                ModelGroups& out) {
  partition::FlatGroup g;
  std::vector<int64_t> numels;
  for (int64_t i : members) {
    numels.push_back(p.tensors[i].numel());
    g.params.push_back(p.tensors[i]);
    g.names.push_back(p.names[i]);
    out.num_params += p.tensors[i].numel();
  }
  g.layout = partition::make_group_layout(numels, members, ctx.dp.size(), partition::kShardAlignElements);
  partition::flatten_from_rank0(g, ctx.comm, ctx.dp);
  out.largest_group_bytes = std::max(out.largest_group_bytes, g.layout.padded_numel * 4);
  setup_precision(g, ctx);
  return g;
}

void bucket_groups(const Params& p, const GroupingContext& ctx, ModelGroups& out) {
  std::vector<int64_t> numels, indices;
  for (int64_t i = static_cast<int64_t>(p.tensors.size()) - 1; i >= 0; --i) {
    numels.push_back(p.tensors[i].numel());
    indices.push_back(i);
  }
  for (const auto& bucket : partition::bucket_params(numels, indices, ctx.config.zero.reduce_bucket_size))
    out.groups.push_back(make_group(p, bucket, ctx, out));
}

// The unit a registration name lies in: the innermost unit whose name is a
// prefix of it (units may nest, as FSDP2's fully_shard calls do: an outer
// unit holds the params that no unit inside it holds), -1 for none.
int innermost_unit(const std::string& name, const ModelGroups& out) {
  int owner = -1;
  size_t longest = 0;
  for (size_t u = 0; u < out.units.size(); ++u) {
    const std::string& unit = out.unit_names[u];
    if (unit.size() >= longest && name.size() > unit.size() && name.compare(0, unit.size(), unit) == 0 &&
        name[unit.size()] == '.') {
      owner = static_cast<int>(u);
      longest = unit.size();
    }
  }
  return owner;
}

// Which unit owns each param (-1: the root). A param belongs to one unit
// only if every name it is registered by lies in that unit (innermost); one
// registered in several units, or also outside every unit (a tied LM head
// registered beside an embedding in a unit), is used outside its unit's
// forward, so it belongs to the root, which outlives all its uses.
// `registered_in_unit[u]`: some trainable param is registered directly in
// unit u (not inside a unit nested in it).
std::vector<int> owning_units(torch::nn::Module& model, const Params& p, const ModelGroups& out,
                              std::vector<bool>& registered_in_unit) {
  std::vector<std::set<int>> registered_in(p.tensors.size());  // unit index, -1 for outside every unit
  registered_in_unit.assign(out.units.size(), false);
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    auto it = p.index_of.find(item.value().unsafeGetTensorImpl());
    if (it == p.index_of.end()) continue;
    const int owner = innermost_unit(item.key(), out);
    registered_in[it->second].insert(owner);
    if (owner >= 0) registered_in_unit[owner] = true;
  }
  std::vector<int> owner(p.tensors.size(), -1);
  for (size_t i = 0; i < p.tensors.size(); ++i)
    if (registered_in[i].size() == 1) owner[i] = *registered_in[i].begin();
  return owner;
}

void find_units(torch::nn::Module& model, ModelGroups& out) {
  if (dynamic_cast<UnitBase*>(&model))
    throw std::invalid_argument("zero::Engine: the root model is itself a zero::Unit; wrap its blocks instead");
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (auto* u = dynamic_cast<UnitBase*>(item.value().get())) {
      out.units.push_back(u);
      out.unit_names.push_back(item.key());
    }
}

// Whether the group zero::Init built for unit k still holds exactly the
// unit's own trainable params.
bool adoptable(const partition::FlatGroup& pre, int k, const std::vector<int64_t>& own, const Params& p,
               const std::vector<int>& owner) {
  if (pre.params.size() != own.size()) return false;
  for (const auto& t : pre.params) {
    auto it = p.index_of.find(t.unsafeGetTensorImpl());
    if (it == p.index_of.end() || owner[it->second] != k) return false;
  }
  return true;
}

// A unit zero::Init sharded at construction: its group holds this rank's
// fp32 shard only; name its params and set up precision and optimizer state.
void adopt(partition::FlatGroup& g, const std::string& unit, const Params& p, const GroupingContext& ctx) {
  if (g.layout.dp_size != ctx.dp.size())
    throw std::invalid_argument("zero::Engine: unit '" + unit + "' was sharded by zero::Init over " +
                                std::to_string(g.layout.dp_size) + " ranks, but the data-parallel group has " +
                                std::to_string(ctx.dp.size()));
  for (size_t i = 0; i < g.params.size(); ++i) {
    const int64_t idx = p.index_of.at(g.params[i].unsafeGetTensorImpl());
    g.layout.params[i].param_index = idx;
    g.names.push_back(p.names[idx]);
  }
  at::NoGradGuard no_grad;
  const Precision& pr = ctx.precision;
  g.storage_dtype = pr.storage;
  g.master = g.param_shard;  // fp32, as zero::Init kept it
  if (pr.storage != at::kFloat) {
    g.param_shard = memory::flat_copy_of(g.master, pr.storage);
    if (!pr.widened()) {  // widened: the module keeps zero::Init's fp32 buffer (released)
      const at::Device device = g.param_flat.device();
      if (device.is_cpu()) {  // page-backed: mapped, never touched, then released
        partition::view_params_in(g, memory::zeros_flat(g.layout.padded_numel, pr.storage, device));
        partition::release_params(g);
      } else {  // a device buffer that never holds the whole unit
        memory::released_flat(g.layout.padded_numel, pr.storage, device,
                              [&](const at::Tensor& flat) { partition::view_params_in(g, flat); });
      }
    }
  }
  place_offloaded(g, ctx);
  ctx.optimizer.init_state(g);
  if (auto* params = ctx.optimizer.param_swap()) params->adopt(g);  // offload_param nvme: to disk now
}

void unit_groups(torch::nn::Module& model, const Params& p, const GroupingContext& ctx, ModelGroups& out) {
  find_units(model, out);
  std::vector<bool> registered_in_unit;
  const auto owner = owning_units(model, p, out, registered_in_unit);
  std::vector<std::vector<int64_t>> own(out.units.size());  // each unit's params, in registration order
  std::vector<int64_t> root;
  for (size_t i = 0; i < p.tensors.size(); ++i) (owner[i] < 0 ? root : own[owner[i]]).push_back(static_cast<int64_t>(i));
  out.unit_to_group.assign(out.units.size(), 0);
  // A unit whose trainable params all lie in units nested in it gathers
  // nothing itself: a pass-through, as one without params.
  out.unit_has_params = registered_in_unit;
  const int64_t threshold = ctx.config.zero.param_persistence_threshold;
  std::vector<size_t> in_root;  // units all of whose params live in the root
  for (size_t k = out.units.size(); k-- > 0;) {
    const std::string label = "params of unit '" + out.unit_names[k] + "'";
    auto pre = detail::UnitAccess::take_sharded_at_init(*out.units[k]);
    if (pre && !adoptable(*pre, static_cast<int>(k), own[k], p, owner)) {
      // zero::Init sharded this unit, but its trainable params are no longer
      // exactly the ones it sharded (one is shared now, or was frozen or
      // unfrozen since): gather it back whole and group it afresh (one
      // unit's worth of memory, once).
      gather_params(*pre, ctx.comm, ctx.dp, label);
      pre.reset();
    }
    if (!out.unit_has_params[k]) {
      out.unit_to_group[k] = ModelGroups::kNoGroup;  // a pass-through
      continue;
    }
    if (!pre && own[k].empty()) {
      in_root.push_back(k);
      continue;
    }
    out.unit_to_group[k] = out.groups.size();
    if (pre) {
      adopt(*pre, out.unit_names[k], p, ctx);
      out.num_params += pre->layout.numel;
      ++out.sharded_at_init_units;
      out.persistent.push_back(pre->layout.numel < threshold);
      if (out.persistent.back()) gather_params(*pre, ctx.comm, ctx.dp, label, ctx.optimizer.param_swap());
      out.groups.push_back(std::move(*pre));
    } else {
      out.groups.push_back(make_group(p, own[k], ctx, out));
      out.persistent.push_back(out.groups.back().layout.numel < threshold);
      if (!out.persistent.back()) partition::release_params(out.groups.back());
    }
  }
  if (!root.empty()) {
    out.root_group = out.groups.size();
    out.groups.push_back(make_group(p, root, ctx, out));
    out.persistent.push_back(true);  // until engine.forward() brackets the forward
    out.root_shardable = out.groups.back().layout.numel >= threshold;
  }
  for (size_t k : in_root) out.unit_to_group[k] = out.groups.size() - 1;
  const auto persistent_groups = std::count(out.persistent.begin(), out.persistent.end(), true);
  out.note = out.units.empty()
                 ? "no zero::Unit in the model: all params form the root unit and stay gathered "
                   "(stage 3 then shards grads and optimizer state only)"
                 : std::to_string(out.units.size()) + " units; " + std::to_string(persistent_groups) +
                       " persistent groups (root + units under stage3_param_persistence_threshold; the root is "
                       "sharded too once the forward runs inside engine.forward())";
}

}  // namespace

ModelGroups group_params(torch::nn::Module& model, const GroupingContext& ctx) {
  ModelGroups out;
  const Params p = trainable_params(model, out);
  if (ctx.policy.shard_params) unit_groups(model, p, ctx, out);
  else bucket_groups(p, ctx, out);
  return out;
}

}  // namespace zero
