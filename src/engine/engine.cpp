// The engine: construction (grouping, reducer, stage-3 runtime), backward
// (explicit or a plain loss.backward()), the accumulation boundary and the
// step, the guards, checkpoints, accessors. What it delegates lives behind
// the interfaces named in engine/engine_impl.h.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_set>
#include <utility>

#include <ATen/DeviceAccelerator.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/module.h>

#include "engine/engine_impl.h"
#include "engine/nested_backward.h"
#include "memory/cpu_allocator.h"
#include "memory/malloc_policy.h"
#include "memory/page_buffer.h"
#include "offload/grad_swap.h"
#include "offload/param_swap.h"
#include "optim/kernels.h"
#include "zero/unit_runtime.h"

namespace zero {

at::Tensor compute(const at::Tensor& t) { return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat); }

namespace {

void validate(const Config& config) {
  if (!config.optimizer.given)
    throw ConfigError("ds_config: an \"optimizer\" block is required (Adam, AdamW or SGD)");
}

// Every rank starts from rank 0's frozen params and buffers (as DDP); those
// of units zero::Init built were synced when the unit was built.
void sync_replicated_at_construction(torch::nn::Module& model, const std::vector<ReplicatedTensor>& replicated,
                                     comm::Comm& comm, const comm::Group& dp) {
  std::unordered_set<const void*> synced;
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (auto* u = dynamic_cast<UnitBase*>(item.value().get()); u && detail::UnitAccess::synced_at_init(*u)) {
      for (const auto& p : u->parameters()) synced.insert(p.unsafeGetTensorImpl());
      for (const auto& b : u->buffers()) synced.insert(b.unsafeGetTensorImpl());
    }
  std::vector<at::Tensor> tensors;
  for (const auto& r : replicated)
    if (!synced.count(r.tensor.unsafeGetTensorImpl())) tensors.push_back(r.tensor);
  comm.broadcast_coalesced(dp, tensors, 0, "frozen params and buffers");
}

// With 16-bit compute the frozen params move to that dtype, as DeepSpeed
// casts every param. Floating-point buffers go to data_types.buffer_dtype
// where set; else they keep theirs with zero_cpp.keep_buffer_dtype (DeepSpeed
// 0.19.8's way), or follow the frozen params (CPU kernels such as batch_norm
// want the weight and running statistics in one dtype). Integer buffers (a
// step counter) keep theirs.
void cast_replicated(const std::vector<ReplicatedTensor>& replicated, const Precision& precision,
                     const Config& config) {
  const std::optional<at::ScalarType> compute =
      precision.compute == at::kFloat ? std::nullopt : std::optional<at::ScalarType>(precision.compute);
  std::optional<at::ScalarType> buffers = config.keep_buffer_dtype ? std::nullopt : compute;
  if (config.buffer_dtype) buffers = to_scalar_type(*config.buffer_dtype);
  at::NoGradGuard no_grad;
  for (const auto& r : replicated) {
    const auto& to = r.buffer ? buffers : compute;
    if (to && r.tensor.is_floating_point() && r.tensor.scalar_type() != *to) r.tensor.set_data(r.tensor.to(*to));
  }
}

// The user's param groups as the flat optimizer's hypers; a tensor that is
// not a trainable param of the model, or one in two groups, is an error.
void use_param_groups(const std::vector<ParamGroup>& param_groups, const std::vector<partition::FlatGroup>& groups,
                      const Config& config, FlatOptimizer& optimizer) {
  if (param_groups.empty()) return;
  std::unordered_map<const void*, std::string> trainable;
  for (const auto& g : groups)
    for (size_t i = 0; i < g.params.size(); ++i) trainable[g.params[i].unsafeGetTensorImpl()] = g.names[i];
  std::vector<FlatOptimizer::Hyper> hypers;
  std::unordered_map<const void*, int> group_of;
  for (size_t k = 0; k < param_groups.size(); ++k) {
    const ParamGroup& pg = param_groups[k];
    const double lr = pg.lr.value_or(config.optimizer.lr);
    if (lr < 0 || pg.weight_decay.value_or(0) < 0)
      throw std::invalid_argument("zero::Engine: param group " + std::to_string(k) + " has a negative lr or weight_decay");
    hypers.push_back({config.optimizer.lr > 0 ? lr / config.optimizer.lr : 1.0,
                      pg.weight_decay.value_or(config.optimizer.weight_decay)});
    for (const auto& t : pg.params) {
      auto it = trainable.find(t.unsafeGetTensorImpl());
      if (it == trainable.end())
        throw std::invalid_argument("zero::Engine: param group " + std::to_string(k) + " holds a tensor of shape " +
                                    c10::str(t.sizes()) + " that is not a trainable param of the model");
      if (!group_of.emplace(it->first, static_cast<int>(k)).second)
        throw std::invalid_argument("zero::Engine: param '" + it->second + "' is in param group " +
                                    std::to_string(group_of.at(it->first)) + " and in group " + std::to_string(k));
    }
  }
  optimizer.set_param_groups(std::move(hypers), std::move(group_of));
}

int64_t resident(const at::Tensor& t) { return memory::resident_bytes(t); }

// The one device the model's params and buffers are on: the CPU, or a
// device the collectives can serve (CUDA needs a build with CUDA).
at::Device model_device(const torch::nn::Module& m, const comm::Comm& comm) {
  std::optional<at::Device> device;
  std::string first;
  auto visit = [&](const std::string& name, const at::Tensor& t) {
    if (!t.defined()) return;
    if (!device) {
      device = t.device();
      first = name;
    } else if (t.device() != *device) {
      throw std::invalid_argument("zero::Engine: the model spans devices: '" + first + "' is on " + device->str() +
                                  " and '" + name + "' on " + t.device().str() + " (move it whole first)");
    }
  };
  for (const auto& p : m.named_parameters()) visit(p.key(), p.value());
  for (const auto& b : m.named_buffers()) visit(b.key(), b.value());
  const at::Device d = device.value_or(at::Device(at::kCPU));
  if (d.is_cuda() && !comm.serves(d.type()))
    throw std::invalid_argument("zero::Engine: the model is on " + d.str() +
                                " but this zero-cpp was built without CUDA (ZERO_CUDA)");
  if (!comm.serves(d.type()))
    throw std::invalid_argument("zero::Engine: the model is on " + d.str() + "; zero-cpp trains on CPU or CUDA");
  return d;
}

bool same_storage(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl();
}

}  // namespace

// ---- construction ---------------------------------------------------------------

Engine::Impl::Impl(torch::nn::Module& m, const Config& c, comm::Comm& cm, std::shared_ptr<comm::Group> owner,
                   const comm::Group& group, const std::vector<ParamGroup>& param_groups)
    : config(c), comm(cm), dp_owner(std::move(owner)), dp(group), policy(StagePolicy::for_stage(c.zero.stage)),
      device((validate(c), model_device(m, cm))), on_device_while_building(std::in_place, guard_device(device)),
      precision(resolve_precision(c, cm, group, device)),
      training_log(c, group.rank() == 0, [this](const std::string& line) { log(line); }),
      optimizer(config, policy, cm, group, [this](const std::string& line) { log(line); }),
      groups(model.groups) {
  if (!config.comm_fast_path) comm.set_fast_paths_enabled(false);  // every rank builds its engine at the same point
  memory::fix_mmap_threshold(static_cast<size_t>(config.malloc_mmap_threshold));
  memory::use_cpu_allocator(config.cpu_allocator);
  optim::set_kernel_threads(at::get_num_threads());
  batch = config.resolve_batch(dp.size());
  check_same_model_on_all_ranks(m, comm, dp);
  replicated = replicated_tensors(m);
  sync_replicated_at_construction(m, replicated, comm, dp);
  cast_replicated(replicated, precision, config);
  if (!device.is_cpu()) {
    const c10::DeviceIndex index = device.index();
    training_log.set_device_sync([index] { at::accelerator::synchronizeDevice(index); });
  }
  if (policy.shard_params && config.zero.offload_param.device == OffloadDevice::NVMe) {
    // ZeRO-Infinity's param offload: grouping sends each shard to disk as it is made.
    const auto& op = config.zero.offload_param;
    offload::ParamSwapOptions po;
    po.swapper = offload::swapper_options(op, config.aio, dp.rank());
    po.max_in_cpu = op.max_in_cpu;
    po.buffer_count = op.buffer_count;
    po.buffer_size = op.buffer_size;
    po.pinned_staging = !device.is_cpu() && op.pin_memory;
    param_swap = std::make_unique<offload::ParamSwap>(std::move(po));
    optimizer.set_param_swap(param_swap.get());
  }
  model = group_params(m, GroupingContext{config, policy, precision, optimizer, comm, dp});
  use_param_groups(param_groups, groups, config, optimizer);
  ReducerOptions ro{policy, config.zero.overlap_comm(), config.zero.contiguous_gradients, precision.grad,
                    precision.wire, nullptr, [this] { return implicit_backward(); }};
  if (policy.shard_grads && device.is_cpu() && config.zero.offload_optimizer.device == OffloadDevice::NVMe) {
    // Grads on NVMe beside the optimizer's state, as DeepSpeed swaps them:
    // from each group's reduction to the step (offload/grad_swap.h).
    grad_swap = std::make_unique<offload::GradSwap>(
        offload::swapper_options(config.zero.offload_optimizer, config.aio, dp.rank()));
    optimizer.set_grad_swap(grad_swap.get());
    ro.grad_swap = grad_swap.get();
  }
  if (policy.shard_params) {
    const auto& z = config.zero;
    Stage3Options so{z.prefetch_bucket_size, z.max_live_parameters, z.max_reuse_distance,
                     config.stage3_gather_fp32_master, z.param_persistence_threshold};
    so.param_swap = param_swap.get();
    configure_hpz(so, z.hpz_partition_size, dp);
    stage3 = std::make_unique<Stage3Runtime>(groups, model.persistent, model.unit_to_group, model.unit_names,
                                             model.root_group, comm, dp, so);
    // A unit without trainable params has nothing to gather: it stays a pass-through.
    for (size_t k = 0; k < model.units.size(); ++k)
      detail::UnitAccess::attach(*model.units[k], model.unit_has_params[k] ? stage3.get() : nullptr, k);
    ro.on_group_complete = [this](size_t g) { stage3->on_grads_complete(g); };
    if (model.root_shardable) stage3->set_shardable_root(model.root_group);
  }
  reducer = std::make_shared<GradReducer>(groups, comm, dp, ro);
  reducer->install_hooks();
  tag_collectives();
  on_device_while_building.reset();
}

Engine::Impl::~Impl() {
  for (auto* u : model.units) detail::UnitAccess::attach(*u, nullptr, 0);  // the model may outlive the engine
  dp.clear_step(this);  // the group's collectives are no longer this engine's steps (unless another's)
}

void Engine::Impl::tag_collectives() {
  dp.set_step(optimizer.global_steps() + optimizer.skipped_steps(), attempts, this);
}

// A forward (training: evaluation forwards, which ranks may run alone, do
// not count) or a backward with no engine.forward() before it.
void Engine::Impl::begin_attempt(bool from_forward) {
  if (from_forward) {
    if (!at::GradMode::is_enabled()) return;
    forward_open = true;
  } else if (std::exchange(forward_open, false)) {
    return;  // its forward counted it
  }
  ++attempts;
  tag_collectives();
}

void Engine::Impl::log(const std::string& line) const {
  if (dp.rank() == 0) std::fprintf(stderr, "[zero-cpp] %s\n", line.c_str());
}

void Engine::Impl::check_usable() {
  if (!state_lost.empty())
    throw std::logic_error("zero::Engine: " + state_lost +
                           " failed part way, so the ranks' shards disagree; load again or build a new engine");
  if (offloaded.any())
    throw std::logic_error("zero::Engine: its " + offloaded.describe() +
                           " are offloaded to host memory (offload_states): call reload_states() first");
  if (!deferred_error.empty()) {
    const std::string error = "zero::Engine: " + deferred_error;
    deferred_error.clear();  // reported once, here
    throw std::runtime_error(error);
  }
}

void Engine::Impl::check_no_gathered_scope(const char* what) const {
  if (gathered_scopes > 0)
    throw std::logic_error(std::string("zero::Engine::") + what +
                           " inside gathered_parameters(): finish the guard (or leave its scope) first");
}

// ---- backward -------------------------------------------------------------------

bool Engine::Impl::boundary() const {
  return boundary_override.value_or((micro_steps + 1) % batch.gradient_accumulation_steps == 0);
}

bool Engine::Impl::reduce_this_backward() const {
  return !coalescing && (policy.reduce_every_backward() || (boundary() && !no_sync));
}

void Engine::Impl::end_backward(bool implicit_end) {
  try {
    reducer->end_backward();  // aborts itself if a collective fails
  } catch (...) {
    if (stage3) stage3->reset_after_error();
    throw;
  }
  if (stage3) stage3->after_backward(/*keep_awaited=*/implicit_end);
}

// A grad arrived from a backward the engine did not start (loss.backward()):
// begin one as engine.backward() would, and scale the grads on their way in
// by what engine.backward() scales the loss by. Its end runs when the
// outermost autograd backward ends: the grads of the nested backwards a
// recomputing checkpoint runs belong to it (nested_backward.h), so a step
// reduces once, as under engine.backward(). If autograd failed instead, the
// queued end is destroyed unrun: the next grad or step() notices and drops
// what that backward left. fp16 is refused: its loss scale must apply before
// backward, or small grads underflow in the 16-bit cast before anything
// could scale them.
float Engine::Impl::implicit_backward() {
  if (reducer->in_implicit_backward() && implicit_alive.expired()) recover_if_backward_failed();
  if (!reducer->in_backward()) {
    if (config.fp16.enabled && !scaled_loss_given) {
      if (stage3) stage3->reset_after_error();  // its hooks may have begun this backward
      throw std::logic_error("zero::Engine: loss.backward() was called directly with fp16 enabled; fp16 needs the "
                             "loss scaled before backward: call engine.backward(loss), or "
                             "engine.scale(loss).backward()");
    }
    scaled_loss_given = false;
    check_usable();
    check_no_gathered_scope("backward (a plain loss.backward())");
    begin_attempt(/*from_forward=*/false);
    reducer->begin_backward(reduce_this_backward(), /*implicit=*/true);
    auto token = std::make_shared<int>(0);
    implicit_alive = token;
    detail::at_end_of_outermost_backward([this, token] { end_backward(/*implicit_end=*/true); });
  }
  return static_cast<float>(1.0 / static_cast<double>(batch.gradient_accumulation_steps));
}

void Engine::Impl::recover_if_backward_failed() {
  const bool stage3_mid_backward = stage3 && stage3->in_backward();
  if (!reducer->in_backward() && !stage3_mid_backward) return;
  if (reducer->in_backward()) reducer->abort_backward();
  if (stage3) stage3->reset_after_error();
}

// ---- the step -------------------------------------------------------------------

bool Engine::Impl::step() {
  if (!boundary()) {
    ++micro_steps;
    return false;
  }
  // Grads a backward left unreduced (no_sync or a coalescing scope left
  // without its reduction, or no boundary backward) are reduced now:
  // stepping on local grads would let the ranks drift apart silently.
  if (reducer->has_unreduced()) reducer->flush();
  apply_pending_masters();
  bool stepped = false;
  {
    TrainingLog::Timer timer(training_log, TrainingLog::Step);
    try {
      stepped = optimizer.update(groups);
    } catch (...) {
      // Some groups may be updated and others not (an I/O error mid-step):
      // this rank's shards no longer match its peers'. A failure before any
      // update (the norm's all-reduce) leaves the step to be taken again.
      if (optimizer.groups_updated() > 0) state_lost = "an optimizer step";
      throw;
    }
    if (stepped) {
      TrainingLog::Timer gather(training_log, TrainingLog::StepGather);
      policy.publish_updated_params(groups, comm, dp, stage3.get());
    }
    if (stepped) optimizer.commit();
  }
  reducer->zero_grads();
  sync_buffers();
  ++micro_steps;
  report_step(stepped);
  attempts = 0;
  tag_collectives();  // the next step's
  return stepped;
}

void Engine::Impl::report_step(bool stepped) {
  const int64_t steps = optimizer.global_steps() + optimizer.skipped_steps();  // DeepSpeed counts skipped ones
  training_log.count_step();
  if (!training_log.reports(steps)) return;
  // This rank's mean over the window (NaN without an engine.backward), then over ranks.
  // One all-reduce for both: [this rank's mean / ranks, its tokens].
  at::Tensor mean = logged_losses ? (logged_loss_sum / static_cast<double>(logged_losses)).to(at::kCPU, at::kDouble)
                                  : at::scalar_tensor(std::numeric_limits<double>::quiet_NaN(), at::kDouble);
  at::Tensor sums = at::stack({mean.reshape({}) / static_cast<double>(dp.size()),
                               at::scalar_tensor(static_cast<double>(tokens_unreported), at::kDouble)});
  logged_loss_sum = at::Tensor();
  logged_losses = 0;
  tokens_unreported = 0;
  comm.all_reduce(dp, sums, comm::ReduceOp::Sum, "logged loss and tokens")->wait();
  global_tokens += static_cast<int64_t>(sums[1].item<double>());
  training_log.on_step({steps, steps * batch.train_batch_size, global_tokens, sums[0].item<double>(), optimizer.lr(),
                        optimizer.loss_scale(), optimizer.last_grad_norm(), !stepped});
}

void Engine::Impl::params_from_masters() {
  {
    at::NoGradGuard no_grad;
    for (auto& g : groups) {
      at::Tensor dest = policy.update_destination(g, dp.rank());
      if (dest.data_ptr() == g.master.data_ptr()) continue;  // fp32: the master is the params
      // NVMe offload: paged in (the shard written back).
      auto master = optimizer.resident(g, /*write_state=*/false, /*write_params=*/true);
      // Round as the kernel does (an fp32 destination of a widened group too).
      dest.copy_(dest.scalar_type() == g.storage_dtype ? g.master : g.master.to(g.storage_dtype));
      master.done();
    }
  }
  policy.publish_updated_params(groups, comm, dp, stage3.get());
  reducer->drop_grads();  // grads of the old state (and stale transient buffers) go
}

void Engine::Impl::sync_buffers() {
  if (!config.broadcast_buffers) return;
  std::vector<at::Tensor> buffers;
  for (const auto& r : replicated)
    if (r.buffer) buffers.push_back(r.tensor);
  comm.broadcast_coalesced(dp, buffers, 0, "buffers");
}

StateBytes Engine::Impl::state_bytes() const {
  StateBytes b;
  for (const auto& g : groups) {
    b.params += resident(g.param_flat) + resident(g.param_shard);
    b.grads += resident(g.grad_flat);
    if (!same_storage(g.grad_shard, g.grad_flat)) b.grads += resident(g.grad_shard);
    if (!same_storage(g.master, g.param_flat) && !same_storage(g.master, g.param_shard))
      b.master += resident(g.master);
    b.optimizer += resident(g.exp_avg) + resident(g.exp_avg_sq);
  }
  b.nvme = optimizer.swapped_bytes() + (param_swap ? param_swap->file_bytes() : 0) +
           (grad_swap ? grad_swap->file_bytes() : 0);
  return b;
}

CheckpointTarget Engine::Impl::checkpoint_target() {
  return {comm,      dp,          config,      policy, batch, precision.storage, groups, replicated, optimizer,
          micro_steps, state_lost, [this] { params_from_masters(); }, [this](const std::string& l) { log(l); }};
}

// ---- the public surface ---------------------------------------------------------

Engine::Engine(torch::nn::Module& model, const Config& config, World& world, std::vector<ParamGroup> param_groups)
    : impl_(std::make_unique<Impl>(model, config, world.comm(), nullptr, world.group(), param_groups)) {}

Engine::Engine(torch::nn::Module& model, const Config& config, comm::Comm& comm, std::shared_ptr<comm::Group> dp,
               std::vector<ParamGroup> param_groups)
    : impl_(dp ? std::make_unique<Impl>(model, config, comm, dp, *dp, param_groups)
               : throw std::invalid_argument("zero::Engine: the data-parallel group is null (not a member?)")) {}

std::vector<ParamGroup> weight_decay_groups(torch::nn::Module& model, double weight_decay) {
  ParamGroup decay{{}, std::nullopt, weight_decay}, no_decay{{}, std::nullopt, 0.0};
  std::unordered_set<const void*> seen;
  for (const auto& p : model.parameters(/*recurse=*/true))
    if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second)
      (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
  return {decay, no_decay};
}

Engine::~Engine() = default;

// ---- forward --------------------------------------------------------------------

void Engine::begin_forward() {
  const c10::OptionalDeviceGuard on_device(guard_device(impl_->device));
  impl_->check_usable();
  impl_->forward_started = impl_->training_log.now();
  impl_->begin_attempt(/*from_forward=*/true);
  if (!impl_->stage3) return;
  const bool root_was_sharded = impl_->stage3->root_sharded();
  impl_->stage3->begin_root_forward();
  if (!root_was_sharded && impl_->stage3->root_sharded())
    impl_->log("stage 3: the root's " + std::to_string(impl_->stage3->root_numel()) +
               " params (those outside every zero::Unit; above stage3_param_persistence_threshold " +
               std::to_string(impl_->config.zero.param_persistence_threshold) +
               ") are a unit from this engine.forward(...) on: gathered around it and its backward, sharded "
               "between them. Run every forward through engine.forward(...) -- under torch::NoGradGuard to "
               "evaluate --; a direct call of the model would find them released.");
}

at::Tensor Engine::end_forward(const at::Tensor& out) {
  end_forward(std::vector<at::Tensor>{out});
  return out;  // hooked in place
}

void Engine::end_forward(const std::vector<at::Tensor>& outs) {
  const c10::OptionalDeviceGuard on_device(guard_device(impl_->device));
  if (impl_->stage3) impl_->stage3->end_root_forward(outs);
  impl_->training_log.add_time(
      TrainingLog::Forward,
      std::chrono::duration<double, std::milli>(impl_->training_log.now() - impl_->forward_started).count());
}

void Engine::forward_each(const std::function<std::vector<at::Tensor>()>& fn) {
  begin_forward();
  std::vector<at::Tensor> outs;
  try {
    outs = fn();
  } catch (...) {
    forward_failed();
    throw;
  }
  end_forward(outs);
}

void Engine::forward_failed() {
  const c10::OptionalDeviceGuard on_device(guard_device(impl_->device));
  impl_->forward_open = false;  // its attempt stays counted: the batch is gone
  if (impl_->stage3) impl_->stage3->root_forward_failed();
}

at::Tensor Engine::backward(const at::Tensor& loss) {
  if (!loss.defined() || loss.numel() != 1)
    throw std::invalid_argument("zero::Engine::backward: the loss must be a scalar tensor");
  if (!loss.requires_grad())
    throw std::invalid_argument("zero::Engine::backward: the loss does not require grad (computed under no_grad?)");
  auto& m = *impl_;
  const c10::OptionalDeviceGuard on_device(guard_device(m.device));
  m.check_usable();
  m.check_no_gathered_scope("backward()");
  m.recover_if_backward_failed();
  const double gas = static_cast<double>(m.batch.gradient_accumulation_steps);
  const at::Tensor value = loss.detach().reshape({}).to(at::kDouble);
  m.logged_loss_sum = m.logged_losses++ ? m.logged_loss_sum + value : value;
  TrainingLog::Timer timer(m.training_log, TrainingLog::Backward);
  m.begin_attempt(/*from_forward=*/false);
  m.reducer->begin_backward(m.reduce_this_backward());
  try {
    torch::autograd::backward({loss * (m.optimizer.loss_scale() / gas)});
  } catch (...) {
    // Issue no further collectives (the peers may not be in this backward);
    // drop the grads since the last step and the unit state, so the engine
    // stays usable.
    m.reducer->abort_backward();
    if (m.stage3) m.stage3->reset_after_error();
    throw;
  }
  {
    TrainingLog::Timer reduce(m.training_log, TrainingLog::BackwardReduce);
    m.end_backward();
  }
  return loss.detach() / gas;
}

at::Tensor Engine::scale(const at::Tensor& loss) {
  if (!loss.defined() || loss.numel() != 1 || !loss.requires_grad())
    throw std::invalid_argument("zero::Engine::scale: the loss must be a scalar tensor that requires grad");
  auto& m = *impl_;
  m.check_usable();
  if (!m.config.fp16.enabled) return loss;
  m.scaled_loss_given = true;
  return loss * m.optimizer.loss_scale();
}

bool Engine::step() {
  const c10::OptionalDeviceGuard on_device(guard_device(impl_->device));
  auto& m = *impl_;
  m.check_usable();
  m.check_no_gathered_scope("step()");
  m.recover_if_backward_failed();
  if (m.coalescing)
    throw std::logic_error("zero::Engine::step() inside coalesce_grad_reduction(): the grads are reduced when "
                           "the guard ends; leave its scope before stepping");
  if (m.no_sync && m.boundary())
    throw std::logic_error("zero::Engine::step() at the accumulation boundary inside no_sync(): the grads were "
                           "never reduced; leave the guard and run the boundary backward first");
  return m.step();
}

void Engine::set_gradient_accumulation_boundary(bool is_boundary) { impl_->boundary_override = is_boundary; }
void Engine::clear_gradient_accumulation_boundary() { impl_->boundary_override.reset(); }

Engine::NoSync::NoSync(Engine& e) : engine_(e) {
  auto& m = *e.impl_;
  if (!m.policy.keeps_full_grads())
    throw std::logic_error("zero::Engine::no_sync() is for stages 0 and 1: stage " + std::to_string(m.policy.stage) +
                           " keeps only grad shards, so each backward must reduce (several backward calls "
                           "per step still work: each one reduces into the shard)");
  if (m.no_sync) throw std::logic_error("zero::Engine::no_sync() guards cannot be nested");
  if (m.coalescing)
    throw std::logic_error("zero::Engine::no_sync() inside coalesce_grad_reduction(): the guard already defers "
                           "the reduction; use one or the other");
  m.no_sync = true;
}

Engine::NoSync::~NoSync() { engine_.impl_->no_sync = false; }

Engine::CoalesceGradReduction::CoalesceGradReduction(Engine& e)
    : engine_(e), uncaught_at_entry_(std::uncaught_exceptions()) {
  auto& m = *e.impl_;
  if (!m.policy.shard_optimizer_state)
    throw std::logic_error("zero::Engine::coalesce_grad_reduction() is for stages 1-3: stage 0 all-reduces full "
                           "grads, so no_sync() already defers its reduction");
  if (m.coalescing) throw std::logic_error("zero::Engine::coalesce_grad_reduction() guards cannot be nested");
  if (m.no_sync)
    throw std::logic_error("zero::Engine::coalesce_grad_reduction() inside no_sync(): no_sync already defers "
                           "the reduction; use one or the other");
  m.coalescing = true;
}

void Engine::CoalesceGradReduction::finish() {
  const c10::OptionalDeviceGuard on_device(guard_device(engine_.impl_->device));
  if (finished_) return;
  finished_ = true;
  auto& m = *engine_.impl_;
  m.coalescing = false;
  // A reducing stage 1 reduces at the boundary only, as it would without the guard.
  if (m.policy.reduce_every_backward() || m.boundary()) m.reducer->flush();
}

void Engine::CoalesceGradReduction::abandon() {
  if (finished_) return;
  finished_ = true;
  engine_.impl_->coalescing = false;
}

Engine::CoalesceGradReduction::~CoalesceGradReduction() {
  if (finished_) return;
  if (std::uncaught_exceptions() > uncaught_at_entry_) {
    // Unwinding: the peers may not reach a collective here; step() reduces
    // what is left unreduced instead.
    abandon();
    return;
  }
  try {
    finish();
  } catch (const std::exception& e) {
    engine_.impl_->deferred_error = std::string("the reduction ending coalesce_grad_reduction() failed: ") + e.what();
  } catch (...) {
    engine_.impl_->deferred_error = "the reduction ending coalesce_grad_reduction() failed";
  }
}

void Engine::save_checkpoint(const std::string& dir, const std::string& tag, const nlohmann::json& client_state) {
  save_checkpoint(dir, tag, client_state, SaveOptions{});
}

void Engine::save_checkpoint(const std::string& dir, const std::string& tag, const nlohmann::json& client_state,
                             const SaveOptions& how) {
  const c10::OptionalDeviceGuard on_device(guard_device(impl_->device));
  auto& m = *impl_;
  m.check_usable();
  if (m.coalescing || m.no_sync)
    throw std::logic_error("save_checkpoint: not inside coalesce_grad_reduction() or no_sync()");
  if (m.micro_steps % m.batch.gradient_accumulation_steps != 0 || m.reducer->has_unreduced())
    throw std::logic_error("save_checkpoint: call it at an accumulation boundary, after step() (grads in "
                           "flight are not saved)");
  m.apply_pending_masters();  // the masters saved are the ones set
  auto target = m.checkpoint_target();
  zero::save_checkpoint(target, dir, tag, client_state, how.exclude_frozen_params);
}

nlohmann::json Engine::load_checkpoint(const std::string& dir, const std::string& tag) {
  return load_checkpoint(dir, tag, LoadOptions{});
}

nlohmann::json Engine::load_checkpoint(const std::string& dir, const std::string& tag, const LoadOptions& what) {
  const c10::OptionalDeviceGuard on_device(guard_device(impl_->device));
  auto& m = *impl_;
  if (m.coalescing || m.no_sync)
    throw std::logic_error("load_checkpoint: not inside coalesce_grad_reduction() or no_sync()");
  m.pending_masters.clear();  // the loaded masters replace them
  auto target = m.checkpoint_target();
  nlohmann::json client_state = zero::load_checkpoint(target, dir, tag, what.optimizer_state, what.step_counters, what.strict);
  m.attempts = 0;  // the loaded step's start, on every rank
  m.forward_open = false;
  m.tag_collectives();
  return client_state;
}

void Engine::load_weights(const std::string& path) {
  const c10::OptionalDeviceGuard on_device(guard_device(impl_->device));
  auto& m = *impl_;
  if (m.coalescing || m.no_sync) throw std::logic_error("load_weights: not inside coalesce_grad_reduction() or no_sync()");
  m.pending_masters.clear();
  auto target = m.checkpoint_target();
  zero::load_weights(target, path);
}

void Engine::zero_grad() {
  const c10::OptionalDeviceGuard on_device(guard_device(impl_->device));
  impl_->recover_if_backward_failed();  // a failed plain backward's reductions land before the grads go
  impl_->reducer->zero_grads();
}
bool Engine::is_gradient_accumulation_boundary() const { return impl_->boundary(); }
int64_t Engine::global_steps() const { return impl_->optimizer.global_steps(); }
int64_t Engine::skipped_steps() const { return impl_->optimizer.skipped_steps(); }
int64_t Engine::micro_steps() const { return impl_->micro_steps; }
double Engine::loss_scale() const { return impl_->optimizer.loss_scale(); }
double Engine::lr() const { return impl_->optimizer.lr(); }
double Engine::last_grad_norm() const { return impl_->optimizer.last_grad_norm(); }
std::map<std::string, double> Engine::last_step_times() const { return impl_->training_log.last_step_times(); }
void Engine::on_progress(std::function<void(const Progress&)> report) { impl_->training_log.set_progress(std::move(report)); }
const Config& Engine::config() const { return impl_->config; }
const BatchConfig& Engine::batch() const { return impl_->batch; }

void Engine::set_batch(int64_t micro_batch_per_gpu, int64_t gradient_accumulation_steps) {
  auto& m = *impl_;
  if (micro_batch_per_gpu < 1 || gradient_accumulation_steps < 1)
    throw std::invalid_argument("set_batch: micro-batch " + std::to_string(micro_batch_per_gpu) +
                                " and accumulation steps " + std::to_string(gradient_accumulation_steps) +
                                " must each be at least 1");
  if (m.coalescing || m.no_sync || m.forward_open)
    throw std::logic_error("set_batch: not inside coalesce_grad_reduction(), no_sync() or a forward");
  m.batch = {micro_batch_per_gpu * gradient_accumulation_steps * m.dp.size(), micro_batch_per_gpu,
             gradient_accumulation_steps};
  // As DeepSpeed's: the micro-steps counted so far stay, so the next
  // boundary is the next micro-step count that the new accumulation count
  // divides (gas 1 -> 2 after an odd number of steps: the next step has one
  // micro-batch).
}
int64_t Engine::offload_states(const std::vector<std::string>& include, bool pin_memory) {
  auto& m = *impl_;
  std::set<StateKind> kinds;
  for (const auto& name : include) kinds.insert(state_kind_from_name(name));
  if (include.empty()) kinds = all_state_kinds();
  if (m.forward_open || m.reducer->in_backward())
    throw std::logic_error("offload_states: not between a forward and its backward, nor inside a backward");
  m.check_no_gathered_scope("offload_states");
  const c10::OptionalDeviceGuard on_device(guard_device(m.device));
  return m.offloaded.offload(m.groups, kinds, pin_memory);
}
void Engine::reload_states() {
  const c10::OptionalDeviceGuard on_device(guard_device(impl_->device));
  impl_->offloaded.reload();
}
bool Engine::states_offloaded() const { return impl_->offloaded.any(); }
const comm::Group& Engine::dp_group() const { return impl_->dp; }
comm::Comm& Engine::comm() { return impl_->comm; }
int64_t Engine::num_params() const { return impl_->model.num_params; }
StateBytes Engine::state_bytes() const { return impl_->state_bytes(); }

int64_t Engine::persistent_params() const {
  int64_t n = 0;
  for (size_t gi = 0; gi < impl_->groups.size(); ++gi)
    if (impl_->stage3 && impl_->stage3->persistent(gi)) n += impl_->groups[gi].layout.padded_numel;
  return n;
}

int64_t Engine::peak_live_params() const { return impl_->stage3 ? impl_->stage3->peak_live_in_forward() : 0; }

void Engine::reset_peak_live_params() {
  if (impl_->stage3) impl_->stage3->reset_peak();
}

std::map<std::string, at::Tensor> Engine::full_parameters() {
  const c10::OptionalDeviceGuard on_device(guard_device(impl_->device));
  auto& m = *impl_;
  std::map<std::string, at::Tensor> out;
  for (size_t gi = 0; gi < m.groups.size(); ++gi) {
    const bool gather = m.stage3 && !m.stage3->gathered(gi);
    if (m.stage3) m.stage3->gather(gi);  // also waits for a prefetch in flight
    const auto& g = m.groups[gi];
    for (size_t i = 0; i < g.params.size(); ++i) out[g.names[i]] = g.params[i].detach().to(at::kFloat).clone();
    if (gather) m.stage3->release(gi);
  }
  return out;
}

void Engine::count_tokens(int64_t n) { impl_->tokens_unreported += n; }

void Engine::count_input_tokens(const at::Tensor& first_input) {
  if (first_input.defined() && !at::isFloatingType(first_input.scalar_type()) &&
      !at::isComplexType(first_input.scalar_type()) && first_input.scalar_type() != at::kBool)
    count_tokens(first_input.numel());
}

at::Tensor Engine::cast_input(const at::Tensor& t) const {
  const auto c = impl_->precision.compute;
  return t.defined() && t.is_floating_point() && t.scalar_type() != c ? t.to(c) : t;
}

at::ScalarType Engine::compute_dtype() const { return impl_->precision.compute; }

void Engine::set_lr_schedule(std::function<double(int64_t)> fn) { impl_->optimizer.set_lr_schedule(std::move(fn)); }
void Engine::set_param_group_lrs(std::vector<double> lrs) { impl_->optimizer.set_lr_override(std::move(lrs)); }
void Engine::set_param_group_weight_decays(std::vector<double> wds) {
  impl_->optimizer.set_weight_decay_override(std::move(wds));
}

double Engine::global_mean(const at::Tensor& value) {
  if (value.numel() != 1)
    throw std::invalid_argument("global_mean: expected one value, got a tensor of shape " + c10::str(value.sizes()));
  return global_mean(value.detach().item<double>());
}

double Engine::global_mean(double value) {
  at::Tensor t = at::full({1}, value, at::kDouble);
  impl_->comm.all_reduce(impl_->dp, t, comm::ReduceOp::Avg, "global mean")->wait();
  return t.item<double>();
}

std::string Engine::describe() const {
  const auto& m = *impl_;
  int64_t padded = 0;
  for (const auto& g : m.groups) padded += g.layout.padded_numel;
  std::ostringstream os;
  os << "ZeRO stage " << m.policy.stage << " on " << m.dp.describe() << ": " << m.model.num_params << " params in "
     << m.groups.size() << " flat groups (" << padded << " padded), params " << c10::toString(m.precision.storage)
     << (m.precision.widened() ? std::string(" computing in fp32") : std::string())
     << (m.precision.why.empty() ? std::string() : " (" + m.precision.why + ")") << ", grads "
     << c10::toString(m.precision.grad) << ", " << to_string(m.config.optimizer.type)
     << " kernel " << optim::kernel_isa() << ", micro-batch " << m.batch.micro_batch_per_gpu
     << " x accumulation " << m.batch.gradient_accumulation_steps << " x dp " << m.dp.size()
     << ", CPU allocator " << to_string(memory::current_cpu_allocator())
     << (m.model.note.empty() ? "" : "; " + m.model.note)
     << "; init flattened params in place, group by group (peak over the model: largest group, "
     << m.model.largest_group_bytes / (1 << 20) << " MiB)"
     << (m.model.sharded_at_init_units ? "; " + std::to_string(m.model.sharded_at_init_units) +
                                             " units were sharded at construction by zero::Init"
                                       : std::string());
  return os.str();
}

}  // namespace zero
