// Engine::Impl: the engine's state and the stage logic, shared by the
// engine's translation units (engine.cpp: setup, backward, step;
// checkpoint.cpp: save and load).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include "engine/module_state.h"
#include "memory/page_buffer.h"
#include "optim/kernels.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "partition/flat_group.h"
#include "zero/engine.h"
#include "zero/grad_reducer.h"
#include "zero/stage3.h"
#include "zero/unit.h"

namespace zero {

// Helpers for Impl's bodies (this header is private to the engine).

inline at::ScalarType to_scalar_type(DType d) {
  switch (d) {
    case DType::bf16: return at::kBFloat16;
    case DType::fp16: return at::kHalf;
    default: return at::kFloat;
  }
}

inline optim::Out16 out16_kind(at::ScalarType t) {
  return t == at::kBFloat16 ? optim::Out16::BF16 : t == at::kHalf ? optim::Out16::FP16 : optim::Out16::None;
}

inline int64_t storage_bytes(const at::Tensor& t) { return memory::resident_bytes(t); }

inline bool same_storage(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl();
}


struct Engine::Impl {
  Config config;
  BatchConfig batch;
  comm::Comm& comm;
  std::shared_ptr<comm::Group> dp_owner;
  const comm::Group& dp;
  int stage;
  at::ScalarType param_dtype;
  at::ScalarType grad_dtype;
  std::vector<partition::FlatGroup> groups;
  std::shared_ptr<GradReducer> reducer;
  std::unique_ptr<Stage3Runtime> stage3;   // stage 3 only
  std::vector<UnitBase*> units;            // stage 3: the model's units, attached to `stage3`
  std::string init_note;                   // what init did, for describe()
  std::vector<ReplicatedTensor> replicated;  // frozen params and buffers (engine/module_state.h)
  optim::LossScaler scaler;
  int64_t num_params = 0;
  int64_t micro_steps = 0;
  int64_t global_steps = 0;
  int64_t skipped_steps = 0;
  int64_t optimizer_steps = 0;   // updates applied (bias correction / momentum start)
  int64_t scheduler_iter = -1;   // DeepSpeed's last_batch_iteration
  double last_grad_norm = 0.0;
  int64_t largest_group_bytes = 0;  // the flatten's extra peak over the model itself
  int64_t sharded_at_init_units = 0;  // stage 3: units zero::Init already sharded
  std::optional<bool> boundary_override;  // set_gradient_accumulation_boundary
  bool no_sync = false;
  bool coalescing = false;  // inside coalesce_grad_reduction()
  int gathered_scopes = 0;  // gathered_parameters() guards alive
  // Trainable params registered under more than one name (tied weights):
  // the other names, for state_dict().
  std::unordered_map<const void*, std::vector<std::string>> other_names;
  // A load_checkpoint/load_weights failed after some ranks had overwritten
  // their state: training on would mix old and new shards.
  std::string state_lost;

  // The library's own messages: one line on stderr, from the group's rank 0.
  void log(const std::string& line) const {
    if (dp.rank() == 0) std::fprintf(stderr, "[zero-cpp] %s\n", line.c_str());
  }

  void check_state() const {
    if (!state_lost.empty())
      throw std::logic_error("zero::Engine: " + state_lost +
                             " failed part way, so the ranks' shards disagree; load again or build a new engine");
  }

  Impl(torch::nn::Module& model, const Config& c, comm::Comm& cm, std::shared_ptr<comm::Group> owner,
       const comm::Group& group)
      : config(c), comm(cm), dp_owner(std::move(owner)), dp(group), stage(static_cast<int>(c.zero.stage)),
        param_dtype(to_scalar_type(c.param_dtype())),
        grad_dtype(to_scalar_type(c.grad_accum_dtype.value_or(c.param_dtype()))),
        scaler(c.fp16) {
    validate();
    if (!config.comm_fast_path) comm.set_fast_paths_enabled(false);  // every rank builds its engine at the same point
    optim::set_kernel_threads(at::get_num_threads());
    batch = config.resolve_batch(dp.size());
    check_same_model_on_all_ranks(model, comm, dp);
    replicated = replicated_tensors(model);
    sync_replicated_at_construction(model);
    ReducerOptions ro{stage, config.zero.overlap_comm(), config.zero.contiguous_gradients, grad_dtype, nullptr,
                      [this] { return implicit_backward(); }};
    if (stage == 3) {
      build_unit_groups(model);
      ro.on_group_complete = [this](size_t g) { stage3->on_grads_complete(g); };
    } else {
      build_groups(model);
    }
    reducer = std::make_shared<GradReducer>(groups, comm, dp, ro);
    reducer->install_hooks();
  }

  ~Impl() {
    for (auto* u : units) u->attach(nullptr, 0);  // the model may outlive the engine
  }

  void validate() const {
    if (!config.optimizer.given)
      throw ConfigError("ds_config: an \"optimizer\" block is required (Adam, AdamW or SGD)");
    if (to_scalar_type(config.comm_dtype()) != grad_dtype)
      throw ConfigError(std::string("ds_config: communication_data_type = ") + to_string(config.comm_dtype()) +
                        " differs from the grad dtype (" + c10::toString(grad_dtype) +
                        "); zero-cpp communicates grads in their accumulation dtype");
  }

  // The model's trainable params in registration order (shared ones once,
  // under their first name; the others are kept in other_names).
  void trainable_params(torch::nn::Module& model, std::vector<at::Tensor>& params, std::vector<std::string>& names) {
    std::unordered_set<const void*> seen;
    for (const auto& item : model.named_parameters(/*recurse=*/true)) {
      const at::Tensor& p = item.value();
      if (!p.requires_grad()) continue;
      if (!seen.insert(p.unsafeGetTensorImpl()).second) {
        other_names[p.unsafeGetTensorImpl()].push_back(item.key());
        continue;
      }
      if (p.scalar_type() != at::kFloat)
        throw std::invalid_argument("zero::Engine: param " + item.key() + " is " + c10::toString(p.scalar_type()) +
                                    "; build the model in fp32 (the engine casts to bf16/fp16 as configured)");
      if (!p.is_cpu())
        throw std::invalid_argument("zero::Engine: param " + item.key() + " is not on the CPU; this build runs on CPU");
      params.push_back(p);
      names.push_back(item.key());
    }
    if (params.empty()) throw std::invalid_argument("zero::Engine: the model has no trainable parameters");
  }

  // Flattens one group (params given by index) in place, syncs it from rank
  // 0 and sets up its precision and optimizer state.
  partition::FlatGroup make_group(const std::vector<at::Tensor>& params, const std::vector<std::string>& names,
                                  const std::vector<int64_t>& members) {
    partition::FlatGroup g;
    std::vector<int64_t> numels;
    for (int64_t i : members) {
      numels.push_back(params[i].numel());
      g.params.push_back(params[i]);
      g.names.push_back(names[i]);
    }
    g.layout = partition::make_group_layout(numels, members, dp.size(), partition::kShardAlignElements);
    partition::flatten_into_group(g, at::kFloat);
    largest_group_bytes = std::max(largest_group_bytes, g.layout.padded_numel * 4);
    // Every rank starts from rank 0's weights (as DeepSpeed's engine does).
    comm.broadcast(dp, g.param_flat, 0)->wait();
    setup_precision_and_state(g);
    return g;
  }

  // Where the optimizer writes group g's updated shard (in the params'
  // dtype): the flat params at stage 0, this rank's slot of them at stages
  // 1/2, the shard kept at rest at stage 3. Same size as g.master.
  at::Tensor shard_destination(const partition::FlatGroup& g) const {
    return stage == 0 ? g.param_flat : stage == 3 ? g.param_shard : g.own_slot(g.param_flat, dp.rank());
  }

  void check_no_gathered_scope(const char* what) const {
    if (gathered_scopes > 0)
      throw std::logic_error(std::string("zero::Engine::") + what +
                             " inside gathered_parameters(): finish the guard (or leave its scope) first");
  }

  // Stage 3: one group per zero::Unit, in reverse registration order (about
  // backward order), then the root unit: params outside every unit or
  // shared by several. The root, and units under the persistence
  // threshold, stay gathered.
  void build_unit_groups(torch::nn::Module& model) {
    std::vector<at::Tensor> params;
    std::vector<std::string> names;
    trainable_params(model, params, names);
    std::unordered_map<const void*, int64_t> index_of;
    for (size_t i = 0; i < params.size(); ++i) index_of[params[i].unsafeGetTensorImpl()] = static_cast<int64_t>(i);

    std::vector<std::string> unit_names;
    for (const auto& item : model.named_modules("", /*include_self=*/false))
      if (auto* u = dynamic_cast<UnitBase*>(item.value().get())) {
        units.push_back(u);
        unit_names.push_back(item.key());
      }
    if (dynamic_cast<UnitBase*>(&model))
      throw std::invalid_argument("zero::Engine: the root model is itself a zero::Unit; wrap its blocks instead");
    std::vector<std::vector<int64_t>> unit_params(units.size());
    for (size_t u = 0; u < units.size(); ++u) {
      for (const auto& sub : units[u]->modules(/*include_self=*/false))
        if (dynamic_cast<UnitBase*>(sub.get()))
          throw std::invalid_argument("zero::Engine: nested zero::Unit inside a unit is not supported");
      std::unordered_set<int64_t> mine;
      for (const auto& p : units[u]->parameters(/*recurse=*/true)) {
        auto it = index_of.find(p.unsafeGetTensorImpl());
        if (it != index_of.end() && mine.insert(it->second).second) unit_params[u].push_back(it->second);
      }
    }
    // A param belongs to one unit only if every module it is registered in
    // lies inside that unit. One registered in several units, or also
    // outside every unit (a tied LM head registered beside an embedding in a
    // unit), is used outside its unit's forward, so it belongs to the root,
    // which outlives all its uses.
    std::vector<std::set<int>> registered_in(params.size());  // unit index, -1 for outside every unit
    for (const auto& item : model.named_parameters(/*recurse=*/true)) {
      auto it = index_of.find(item.value().unsafeGetTensorImpl());
      if (it == index_of.end()) continue;
      int owner = -1;
      for (size_t u = 0; u < units.size() && owner < 0; ++u)
        if (item.key().rfind(unit_names[u] + ".", 0) == 0) owner = static_cast<int>(u);
      registered_in[it->second].insert(owner);
    }
    std::vector<int> owners(params.size(), 0);
    for (size_t i = 0; i < params.size(); ++i)
      owners[i] = registered_in[i].count(-1) ? 0 : static_cast<int>(registered_in[i].size());
    std::vector<int64_t> root;
    for (size_t i = 0; i < params.size(); ++i)
      if (owners[i] != 1) root.push_back(static_cast<int64_t>(i));

    std::vector<size_t> unit_to_group(units.size(), 0);
    std::vector<bool> persistent;
    for (size_t k = units.size(); k-- > 0;) {
      auto pre = std::move(units[k]->sharded_at_init);
      if (pre && std::any_of(unit_params[k].begin(), unit_params[k].end(), [&](int64_t i) { return owners[i] != 1; })) {
        // zero::Init sharded a unit one of whose params turns out to be
        // shared: gather it back whole and group it afresh (one unit's worth
        // of memory, once).
        gather_params(*pre, comm, dp, "params of unit '" + unit_names[k] + "'");
        pre.reset();
      }
      if (pre) {  // built inside zero::Init
        adopt_sharded_at_init(*pre, unit_names[k], index_of, owners, names);
        sharded_at_init_units += 1;
        unit_to_group[k] = groups.size();
        persistent.push_back(pre->layout.numel < config.zero.param_persistence_threshold);
        if (persistent.back()) gather_params(*pre, comm, dp, "params of unit '" + unit_names[k] + "'");
        num_params += pre->layout.numel;
        groups.push_back(std::move(*pre));
        continue;
      }
      std::vector<int64_t> members;
      for (int64_t i : unit_params[k])
        if (owners[i] == 1) members.push_back(i);
      if (members.empty()) continue;  // all its params are shared: they live in the root
      int64_t numel = 0;
      for (int64_t i : members) numel += params[i].numel();
      unit_to_group[k] = groups.size();
      persistent.push_back(numel < config.zero.param_persistence_threshold);
      groups.push_back(make_group(params, names, members));
      if (!persistent.back()) partition::release_params(groups.back());
      num_params += numel;
    }
    const size_t root_group = groups.size();
    if (!root.empty()) {
      for (int64_t i : root) num_params += params[i].numel();
      persistent.push_back(true);
      groups.push_back(make_group(params, names, root));
    }
    // Units whose params all live in the root use the root's group.
    for (size_t k = 0; k < units.size(); ++k)
      if (!unit_params[k].empty() && std::none_of(unit_params[k].begin(), unit_params[k].end(),
                                                  [&](int64_t i) { return owners[i] == 1; }))
        unit_to_group[k] = root_group;
    const auto& z = config.zero;
    stage3 = std::make_unique<Stage3Runtime>(groups, persistent, unit_to_group, unit_names, comm, dp,
                                             Stage3Options{z.prefetch_bucket_size, z.max_live_parameters,
                                                           z.max_reuse_distance});
    // A unit without trainable params has nothing to gather: it stays a pass-through.
    for (size_t k = 0; k < units.size(); ++k)
      units[k]->attach(unit_params[k].empty() ? nullptr : stage3.get(), k);
    int persistent_groups = 0;
    for (bool p : persistent) persistent_groups += p;
    init_note = units.empty()
                    ? "no zero::Unit in the model: all params form the root unit and stay gathered "
                      "(stage 3 then shards grads and optimizer state only)"
                    : std::to_string(units.size()) + " units; " + std::to_string(persistent_groups) +
                          " persistent groups (root + units under stage3_param_persistence_threshold)";
  }

  // A unit sharded at construction by zero::Init: its group already holds
  // this rank's fp32 shard only; set up precision and optimizer state.
  void adopt_sharded_at_init(partition::FlatGroup& g, const std::string& unit_name,
                             const std::unordered_map<const void*, int64_t>& index_of, const std::vector<int>& owners,
                             const std::vector<std::string>& names) {
    if (g.layout.dp_size != dp.size())
      throw std::invalid_argument("zero::Engine: unit '" + unit_name + "' was sharded by zero::Init over " +
                                  std::to_string(g.layout.dp_size) + " ranks, but the data-parallel group has " +
                                  std::to_string(dp.size()));
    for (size_t i = 0; i < g.params.size(); ++i) {
      const int64_t idx = index_of.at(g.params[i].unsafeGetTensorImpl());
      if (owners[idx] != 1)
        throw std::invalid_argument("zero::Engine: param " + names[idx] + " of unit '" + unit_name +
                                    "' is shared with another unit or the root; build shared params outside "
                                    "zero::Init (they belong to the root unit)");
      g.layout.params[i].param_index = idx;
      g.names.push_back(names[idx]);
    }
    at::NoGradGuard no_grad;
    g.master = g.param_shard;  // fp32, as zero::Init kept it
    if (param_dtype != at::kFloat) {
      g.param_shard = g.master.to(param_dtype);
      at::Tensor low = memory::zeros_flat(g.layout.padded_numel, param_dtype);
      for (size_t i = 0; i < g.params.size(); ++i) {
        const auto& s = g.layout.params[i];
        g.params[i].set_data(low.narrow(0, s.offset, s.numel).view(g.params[i].sizes()));
      }
      g.param_flat = low;
      partition::release_params(g);
    }
    init_optimizer_state(g);
  }

  // Every rank starts from rank 0's frozen params and buffers (as DDP);
  // those of units zero::Init built were synced when the unit was built.
  void sync_replicated_at_construction(torch::nn::Module& model) {
    std::unordered_set<const void*> synced;
    for (const auto& item : model.named_modules("", /*include_self=*/false))
      if (auto* u = dynamic_cast<UnitBase*>(item.value().get()); u && u->synced_at_init) {
        for (const auto& p : u->parameters()) synced.insert(p.unsafeGetTensorImpl());
        for (const auto& b : u->buffers()) synced.insert(b.unsafeGetTensorImpl());
      }
    std::vector<at::Tensor> tensors;
    for (const auto& r : replicated)
      if (!synced.count(r.tensor.unsafeGetTensorImpl())) tensors.push_back(r.tensor);
    comm.broadcast_coalesced(dp, tensors, 0, "frozen params and buffers");
  }

  // DDP's broadcast_buffers, at each step boundary: rank 0's running
  // statistics (and other buffers forward updated) on every rank.
  void sync_buffers() {
    if (!config.broadcast_buffers) return;
    std::vector<at::Tensor> buffers;
    for (const auto& r : replicated)
      if (r.buffer) buffers.push_back(r.tensor);
    comm.broadcast_coalesced(dp, buffers, 0, "buffers");
  }

  void init_optimizer_state(partition::FlatGroup& g) {
    g.exp_avg = at::zeros_like(g.master);
    if (config.optimizer.type != OptimizerType::SGD) g.exp_avg_sq = at::zeros_like(g.master);
    else if (config.optimizer.momentum == 0.0) g.exp_avg = at::Tensor();
  }

  // Stages 0-2: params in reverse registration order (about the order
  // backward produces their grads), bucketed by reduce_bucket_size.
  void build_groups(torch::nn::Module& model) {
    std::vector<at::Tensor> params;
    std::vector<std::string> names;
    trainable_params(model, params, names);

    std::vector<int64_t> order_numels, order_indices;
    for (int64_t i = static_cast<int64_t>(params.size()) - 1; i >= 0; --i) {
      order_numels.push_back(params[i].numel());
      order_indices.push_back(i);
      num_params += params[i].numel();
    }
    for (const auto& bucket : partition::bucket_params(order_numels, order_indices, config.zero.reduce_bucket_size))
      groups.push_back(make_group(params, names, bucket));
  }

  void setup_precision_and_state(partition::FlatGroup& g) {
    at::NoGradGuard no_grad;
    const bool sharded = stage >= 1;
    at::Tensor fp32_view = sharded ? g.own_slot(g.param_flat, dp.rank()) : g.param_flat;
    if (param_dtype == at::kFloat) {
      // The optimizer updates the params in place: the flat buffer itself,
      // or in stage 3 the shard a rank keeps at rest.
      if (stage == 3) g.param_shard = fp32_view.clone();
      g.master = stage == 3 ? g.param_shard : fp32_view;
    } else {
      g.master = fp32_view.clone();
      at::Tensor low = memory::zeros_flat(g.layout.padded_numel, param_dtype);
      low.copy_(g.param_flat);
      for (size_t i = 0; i < g.params.size(); ++i) {
        const auto& s = g.layout.params[i];
        g.params[i].set_data(low.narrow(0, s.offset, s.numel).view(g.params[i].sizes()));
      }
      g.param_flat = low;  // the fp32 flat buffer is released here
      if (stage == 3) g.param_shard = g.own_slot(low, dp.rank()).clone();
    }
    init_optimizer_state(g);
  }

  bool boundary() const {
    return boundary_override.value_or((micro_steps + 1) % batch.gradient_accumulation_steps == 0);
  }

  // Stages 2/3 keep only shards of the grads: every backward is reduced,
  // unless the caller coalesces several into one reduction.
  bool reduce_this_backward() const { return !coalescing && (stage >= 2 || (boundary() && !no_sync)); }

  // The end of a backward, begun by engine.backward() or by a grad arriving
  // from a plain loss.backward() (engine.cpp). An implicit end keeps the
  // stage-3 units whose grads are still awaited: it may come at the end of
  // a nested (reentrant) backward, before the enclosing one is done.
  void end_backward(bool implicit = false);
  // A plain loss.backward()'s grads (engine.cpp).
  struct ImplicitBackward {
    std::vector<const void*> tasks;  // autograd graph tasks an end is queued on
    int ends_pending = 0;
    std::weak_ptr<void> alive;  // held by the queued ends: expired unrun, the backward died
  } implicit;
  float implicit_backward();

  // A backward that threw inside autograd never reached its end (a plain
  // loss.backward() has no place to catch it): drop what it left behind.
  void recover_if_backward_failed() {
    const bool stage3_mid_backward = stage3 && stage3->in_backward();
    if (!reducer->in_backward() && !stage3_mid_backward) return;
    if (reducer->in_backward()) reducer->abort_backward();
    if (stage3) stage3->reset_after_error();
  }

  // The fp32 grads the optimizer reads for group g (a shard, or all of it in stage 0).
  at::Tensor optimizer_grads(const partition::FlatGroup& g) const {
    if (stage == 0) return g.grad_flat.scalar_type() == at::kFloat ? g.grad_flat : g.grad_flat.to(at::kFloat);
    return g.grad_shard;
  }

  // Sum of squares of the global (loss-scaled) grads; inf/nan if any grad is.
  double global_sumsq(const std::vector<at::Tensor>& grads) {
    auto acc = at::zeros({1}, at::TensorOptions().dtype(at::kDouble));
    // Per-group norms in fp32 (no double copy of the grads), squared and summed in fp64.
    for (const auto& gr : grads) acc += at::norm(gr).to(at::kDouble).pow(2);
    // Stage 0 grads are already identical on every rank; shards are summed.
    if (stage >= 1) comm.all_reduce(dp, acc, comm::ReduceOp::Sum)->wait();
    return acc.item<double>();
  }

  bool step() {
    if (!boundary()) {
      ++micro_steps;
      return false;
    }
    // Grads a backward left unreduced (no_sync or a coalescing scope left
    // without its reduction, or no boundary backward) are reduced now:
    // stepping on local grads would let the ranks drift apart silently.
    if (reducer->has_unreduced()) reducer->flush();
    std::vector<at::Tensor> grads;
    for (const auto& g : groups) grads.push_back(optimizer_grads(g));
    const double sumsq = global_sumsq(grads);
    const double scale = scaler.scale();
    const bool check_overflow = config.fp16.enabled || config.bf16.enabled;
    if (check_overflow && !std::isfinite(sumsq)) {
      scaler.update(true);  // throws at the minimum scale, as DeepSpeed
      ++skipped_steps;
      // As DeepSpeed reports it.
      log(config.fp16.enabled ? "OVERFLOW! Skipping step " + std::to_string(global_steps + skipped_steps) +
                                    ". Attempted loss scale: " + c10::str(scale) + ", reducing to " +
                                    c10::str(scaler.scale())
                              : "OVERFLOW! Skipping step " + std::to_string(global_steps + skipped_steps) +
                                    ": inf or nan grads (bf16)");
      finish_step();
      return false;
    }
    last_grad_norm = std::sqrt(sumsq) / scale;
    // DeepSpeed's clip: divide by (norm + 1e-6) / max_norm when that exceeds 1.
    float grad_scale = static_cast<float>(1.0 / scale);
    if (config.gradient_clipping > 0) {
      const double clip = (last_grad_norm + 1e-6) / config.gradient_clipping;
      if (clip > 1.0) grad_scale = static_cast<float>(1.0 / (scale * clip));
    }
    const double lr = current_lr();
    ++optimizer_steps;
    for (size_t i = 0; i < groups.size(); ++i) update_group(groups[i], grads[i], lr, grad_scale);
    if (stage == 3) {
      stage3->after_step();  // the rest is gathered when next used
    } else if (stage >= 1) {
      std::vector<comm::WorkHandle> works;
      for (auto& g : groups) works.push_back(comm.all_gather(dp, g.param_flat, g.own_slot(g.param_flat, dp.rank())));
      for (auto& w : works) w->wait();
    }
    scaler.update(false);
    ++scheduler_iter;
    ++global_steps;
    finish_step();
    return true;
  }

  void update_group(partition::FlatGroup& g, const at::Tensor& grad, double lr, float grad_scale) {
    const int64_t n = g.master.numel();
    void* out16 = nullptr;
    const auto kind = out16_kind(param_dtype);
    if (kind != optim::Out16::None) out16 = shard_destination(g).data_ptr();
    const auto& o = config.optimizer;
    if (o.type == OptimizerType::SGD) {
      optim::SgdHyper h{static_cast<float>(lr), static_cast<float>(o.momentum), static_cast<float>(o.dampening),
                        static_cast<float>(o.weight_decay), o.nesterov, optimizer_steps == 1};
      optim::sgd_update(g.master.data_ptr<float>(), grad.data_ptr<float>(),
                        g.exp_avg.defined() ? g.exp_avg.data_ptr<float>() : nullptr, n, h, grad_scale, out16, kind);
    } else {
      optim::AdamHyper h{static_cast<float>(lr), static_cast<float>(o.betas[0]), static_cast<float>(o.betas[1]),
                         static_cast<float>(o.eps), static_cast<float>(o.weight_decay), optimizer_steps,
                         o.adam_w_mode, true};
      optim::adam_update(g.master.data_ptr<float>(), grad.data_ptr<float>(), g.exp_avg.data_ptr<float>(),
                         g.exp_avg_sq.data_ptr<float>(), n, h, grad_scale, out16, kind);
    }
  }

  // The end of every boundary step, taken or skipped.
  void finish_step() {
    reducer->zero_grads();
    sync_buffers();
    ++micro_steps;
  }

  double current_lr() const { return optim::scheduled_lr(config.scheduler, config.optimizer.lr, scheduler_iter); }

  StateBytes state_bytes() const {
    StateBytes b;
    for (const auto& g : groups) {
      b.params += storage_bytes(g.param_flat) + storage_bytes(g.param_shard);
      b.grads += storage_bytes(g.grad_flat);
      if (!same_storage(g.grad_shard, g.grad_flat)) b.grads += storage_bytes(g.grad_shard);
      if (!same_storage(g.master, g.param_flat) && !same_storage(g.master, g.param_shard))
        b.master += storage_bytes(g.master);
      b.optimizer += storage_bytes(g.exp_avg) + storage_bytes(g.exp_avg_sq);
    }
    return b;
  }
};

// Shared by the engine's checkpoint and weights code (engine/checkpoint.cpp).
// Every rank learns whether any rank failed and throws (see there).
void agree_or_throw(Engine::Impl& m, const std::string& what, const std::string& error,
                    const bool* wrote_state = nullptr);
// safetensors' name for a dtype ("F32", "I64", ...), and back.
std::string safetensors_dtype(at::ScalarType t);
at::ScalarType scalar_type_of(const std::string& safetensors_dtype);

}  // namespace zero
