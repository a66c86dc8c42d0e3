#include "engine/flat_optimizer.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <utility>

#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "common/guard_device.h"
#include "engine/muon_step.h"
#include "memory/page_buffer.h"
#include "offload/grad_swap.h"
#include "offload/param_swap.h"
#include "offload/state_swapper.h"
#include "optim/kernels.h"
#include "optim/lr_schedule.h"

#ifdef ZERO_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "optim/cuda/kernels.h"
#endif

namespace zero {

namespace {

// The fused update over a CUDA master: the same kernels' device twins, on
// the master's device's current stream (so they follow the reduction that
// produced the grads). The caller holds a guard for that device.
// AdamW ran on an H100 (2026-11-26, the device suite); SGD, Lion and Adagrad not yet.
void device_adam(c10::Device device, float* p, const float* g, float* m, float* v, int64_t n,
                 const optim::AdamHyper& h, float scale, void* out16, optim::Out16 kind) {
#ifdef ZERO_WITH_CUDA
  optim::cuda::adam_update(p, g, m, v, n, h, scale, out16, kind, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  optim::cuda::check_launch("fused AdamW update");
#else
  throw std::logic_error("a CUDA master on " + device.str() + ", but zero-cpp was built without CUDA");
#endif
}

void device_sgd(c10::Device device, float* p, const float* g, float* buf, int64_t n, const optim::SgdHyper& h,
                float scale, void* out16, optim::Out16 kind) {
#ifdef ZERO_WITH_CUDA
  optim::cuda::sgd_update(p, g, buf, n, h, scale, out16, kind, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  optim::cuda::check_launch("fused SGD update");
#else
  throw std::logic_error("a CUDA master on " + device.str() + ", but zero-cpp was built without CUDA");
#endif
}

void device_lion(c10::Device device, float* p, const float* g, float* m, int64_t n, const optim::LionHyper& h,
                 float scale, void* out16, optim::Out16 kind) {
#ifdef ZERO_WITH_CUDA
  optim::cuda::lion_update(p, g, m, n, h, scale, out16, kind, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  optim::cuda::check_launch("fused Lion update");
#else
  throw std::logic_error("a CUDA master on " + device.str() + ", but zero-cpp was built without CUDA");
#endif
}

void device_adagrad(c10::Device device, float* p, const float* g, float* sum, int64_t n,
                    const optim::AdagradHyper& h, float scale, void* out16, optim::Out16 kind) {
#ifdef ZERO_WITH_CUDA
  optim::cuda::adagrad_update(p, g, sum, n, h, scale, out16, kind,
                              c10::cuda::getCurrentCUDAStream(device.index()).stream());
  optim::cuda::check_launch("fused Adagrad update");
#else
  throw std::logic_error("a CUDA master on " + device.str() + ", but zero-cpp was built without CUDA");
#endif
}

// ZeRO-Offload's pipeline chunk: 4 Mi elements (16 MiB of fp32 grads), so
// a 1B-param shard crosses ~240 chunks and the first and last copies, which
// nothing overlaps, are a small part of the step. ZERO_OFFLOAD_CHUNK_ELEMENTS
// sets another (the tests cut small models into several).
int64_t offload_chunk_elements() {
  static const int64_t n = [] {
    const char* v = std::getenv("ZERO_OFFLOAD_CHUNK_ELEMENTS");
    const int64_t given = v && *v ? std::atoll(v) : 0;
    return given > 0 ? given : int64_t{1} << 22;
  }();
  return n;
}

// How the update writes the params beside the master: not at all when the
// master is the params (fp32), 16-bit, or 16-bit values in an fp32 buffer.
optim::Out16 out_kind(const at::Tensor& dest, const partition::FlatGroup& g) {
  if (dest.data_ptr() == g.master.data_ptr()) return optim::Out16::None;
  const bool bf16 = g.storage_dtype == at::kBFloat16;
  if (dest.scalar_type() == at::kFloat) return bf16 ? optim::Out16::BF16Widened : optim::Out16::FP16Widened;
  return bf16 ? optim::Out16::BF16 : optim::Out16::FP16;
}

}  // namespace

FlatOptimizer::FlatOptimizer(const Config& config, const StagePolicy& policy, comm::Comm& comm,
                             const comm::Group& dp, std::function<void(const std::string&)> log)
    : config_(config), policy_(policy), hypers_{{1.0, config.optimizer.weight_decay}}, comm_(comm), dp_(dp),
      log_(std::move(log)), scaler_(config.fp16), scheduler_iter_(config.scheduler.last_batch_iteration),
      schedule_written_(config.scheduler.last_batch_iteration == -1) {
  const OffloadConfig& off = config.zero.offload_optimizer;
  if (off.device == OffloadDevice::NVMe)
    swapper_ = std::make_unique<offload::StateSwapper>(offload::swapper_options(off, config.aio, dp.rank()));
}

FlatOptimizer::~FlatOptimizer() = default;

void FlatOptimizer::set_param_groups(std::vector<Hyper> hypers, std::unordered_map<const void*, int> group_of) {
  hypers_ = std::move(hypers);
  hypers_.insert(hypers_.begin(), Hyper{1.0, config_.optimizer.weight_decay});
  group_of_ = std::move(group_of);
  for (auto& [param, index] : group_of_) ++index;  // after the config's
}

std::vector<FlatOptimizer::Span> FlatOptimizer::spans_of(const partition::FlatGroup& g) const {
  const int64_t n = g.master.numel();
  if (group_of_.empty()) return {{0, n, 0}};  // one run: padding included, as without groups
  std::unordered_map<int64_t, int> hyper_of_index;  // layout's param_index -> hyper
  for (size_t i = 0; i < g.params.size(); ++i) {
    auto it = group_of_.find(g.params[i].unsafeGetTensorImpl());
    hyper_of_index[g.layout.params[i].param_index] = it == group_of_.end() ? 0 : it->second;
  }
  std::vector<Span> spans;
  auto add = [&](int64_t begin, int64_t numel, int hyper) {
    if (!spans.empty() && spans.back().hyper == hyper && spans.back().begin + spans.back().numel == begin)
      spans.back().numel += numel;
    else
      spans.push_back({begin, numel, hyper});
  };
  if (policy_.shard_optimizer_state) {
    for (const auto& f : g.layout.fragments(dp_.rank())) add(f.shard_offset, f.numel, hyper_of_index.at(f.param_index));
  } else {
    for (const auto& slot : g.layout.params) add(slot.offset, slot.numel, hyper_of_index.at(slot.param_index));
  }
  return spans;
}

// Named as DeepSpeed's optimizers name their state: Adam's exp_avg and
// exp_avg_sq, SGD's momentum in exp_avg, Lion's exp_avg (DeepSpeedCPULion),
// Adagrad's sum of squares in exp_avg_sq (DeepSpeedCPUAdagrad).
void FlatOptimizer::init_state(partition::FlatGroup& g) {
  const auto& o = config_.optimizer;
  // State bound for the swap file is page-backed, so its pages can leave
  // memory while its address stays.
  const auto zeros = [&] {
    return swapper_ ? memory::zeros_flat(g.master.numel(), at::kFloat, at::kCPU, /*shared=*/false)
                    : at::zeros_like(g.master);
  };
  switch (o.type) {
    case OptimizerType::SGD:
      if (o.momentum != 0.0) g.exp_avg = zeros();
      break;
    case OptimizerType::Lion: g.exp_avg = zeros(); break;
    case OptimizerType::Adagrad: g.exp_avg_sq = zeros().fill_(o.initial_accumulator_value); break;
    default:
      g.exp_avg = zeros();
      g.exp_avg_sq = zeros();
  }
  if (!swapper_) return;
  const auto aliases = [&](const at::Tensor& t) {
    return t.defined() && t.storage().is_alias_of(g.master.storage());
  };
  std::vector<at::Tensor> swapped;
  if (!aliases(g.param_flat) && !aliases(g.param_shard)) {  // fp32 on a host model: the master is the params
    if (!memory::page_backed(g.master) || g.master.data_ptr() != g.master.storage().data()) {
      at::Tensor paged = memory::zeros_flat(g.master.numel(), at::kFloat, at::kCPU, /*shared=*/false);
      paged.copy_(g.master);
      g.master = paged;
    }
    swapped.push_back(g.master);
  }
  for (const at::Tensor* t : {&g.exp_avg, &g.exp_avg_sq})
    if (t->defined()) swapped.push_back(*t);
  if (swapped.empty()) return;
  const std::string label = "group " + std::to_string(swap_slot_.size()) + " ('" + g.names.front() + "', " +
                            std::to_string(g.params.size()) + " params)";
  swap_slot_[g.master.data_ptr()] = swapper_->adopt(std::move(swapped), label);
}

int FlatOptimizer::swap_slot_of(const partition::FlatGroup& g) const {
  if (!swapper_) return -1;
  const auto it = swap_slot_.find(g.master.data_ptr());
  return it == swap_slot_.end() ? -1 : it->second;
}

int64_t FlatOptimizer::swapped_bytes() const { return swapper_ ? swapper_->file_bytes() : 0; }

FlatOptimizer::ResidentState FlatOptimizer::resident(const partition::FlatGroup& g, bool write_state,
                                                    bool write_params) {
  const int slot = swap_slot_of(g);
  return ResidentState(slot < 0 ? nullptr : swapper_.get(), slot, write_state,
                       param_swap_ && param_swap_->swapped(g) ? param_swap_ : nullptr, &g, write_params);
}

FlatOptimizer::ResidentState::ResidentState(offload::StateSwapper* swapper, int slot, bool write_state,
                                            offload::ParamSwap* params, const partition::FlatGroup* group,
                                            bool write_params)
    : swapper_(swapper), slot_(slot), write_state_(write_state), params_(params), group_(group),
      write_params_(write_params) {
  if (swapper_) swapper_->acquire(slot_);
  try {
    if (params_) params_->acquire(*group_);
  } catch (...) {
    if (swapper_) swapper_->release(slot_, /*dirty=*/false);
    throw;
  }
}

FlatOptimizer::ResidentState::ResidentState(ResidentState&& other) noexcept
    : swapper_(other.swapper_), slot_(other.slot_), write_state_(other.write_state_), params_(other.params_),
      group_(other.group_), write_params_(other.write_params_) {
  other.swapper_ = nullptr;
  other.params_ = nullptr;
}

void FlatOptimizer::ResidentState::done() {
  auto* s = std::exchange(swapper_, nullptr);
  auto* p = std::exchange(params_, nullptr);
  if (p) {
    p->release(*group_, write_params_);
    p->flush();
  }
  if (s) {
    s->release(slot_, write_state_);
    s->flush();
  }
}

FlatOptimizer::ResidentState::~ResidentState() {
  // Changes dropped: the disk keeps the last whole copies. On a failure
  // their pages stay; the next acquire uses them as they are.
  try {
    if (params_) params_->release(*group_, /*dirty=*/false);
  } catch (...) {
  }
  try {
    if (swapper_) swapper_->release(slot_, /*dirty=*/false);
  } catch (...) {
  }
}

namespace {
// A value per hyper (the config's, then each param group's), each >= 0, or none.
std::vector<double> checked_per_hyper(std::vector<double> values, size_t hypers, const char* what) {
  if (!values.empty() && values.size() != hypers)
    throw std::invalid_argument("zero::Engine: " + std::to_string(values.size()) + " " + what + " given for " +
                                std::to_string(hypers) + " param groups (the config's first)");
  for (double v : values)
    if (!(v >= 0)) throw std::invalid_argument(std::string("zero::Engine: ") + what + ": " + std::to_string(v) +
                                               " (each must be >= 0)");
  return values;
}
}  // namespace

void FlatOptimizer::set_lr_override(std::vector<double> per_hyper) {
  lr_override_ = checked_per_hyper(std::move(per_hyper), hypers_.size(), "lrs");
}

double FlatOptimizer::rate_of(double lr, int hyper) const {
  return lr_override_.empty() ? lr * hypers_[hyper].lr_scale : lr_override_[hyper];
}

void FlatOptimizer::set_weight_decay_override(std::vector<double> per_hyper) {
  wd_override_ = checked_per_hyper(std::move(per_hyper), hypers_.size(), "weight decays");
}

double FlatOptimizer::weight_decay_of(int hyper) const {
  return wd_override_.empty() ? hypers_[hyper].weight_decay : wd_override_[hyper];
}

double FlatOptimizer::lr() const {
  if (!lr_override_.empty()) return lr_override_[0];
  if (schedule_) return schedule_(scheduler_iter_ + 1);  // DeepSpeed's iteration starts at -1
  if (!schedule_written_) return config_.optimizer.lr;
  return optim::scheduled_lr(config_.scheduler, config_.optimizer.lr, scheduler_iter_);
}

std::array<double, 2> FlatOptimizer::betas() const {
  const auto& o = config_.optimizer;
  if (!schedule_written_) return o.betas;
  return optim::scheduled_betas(config_.scheduler, scheduler_iter_).value_or(o.betas);
}

at::Tensor FlatOptimizer::grads_of(const partition::FlatGroup& g) const {
  if (policy_.shard_optimizer_state) return g.grad_shard;
  return g.grad_flat.scalar_type() == at::kFloat ? g.grad_flat : g.grad_flat.to(at::kFloat);
}

double FlatOptimizer::global_sumsq(const std::vector<at::Tensor>& grads) {
  // Per-group norms in fp32 where the grads are (no double copy of them),
  // brought to the host together: one device-to-host sync per step, not
  // one per group -- or, with the grads on NVMe, as each group's reduction
  // took them. Squared and summed in fp64, in group order.
  std::vector<float> group_norms;
  if (grad_swap_) {
    group_norms = grad_swap_->norms();
  } else {
    std::vector<at::Tensor> norms;
    for (const auto& gr : grads) norms.push_back(at::norm(gr).reshape({1}));
    const at::Tensor host_norms = at::cat(norms).to(at::kCPU);
    const float* norm = host_norms.data_ptr<float>();
    group_norms.assign(norm, norm + host_norms.numel());
  }
  double sumsq = 0.0;
  for (const float n : group_norms) sumsq += static_cast<double>(n) * static_cast<double>(n);
  // Full grads are already identical on every rank; shards are summed.
  if (policy_.shard_optimizer_state) {
    at::Tensor acc = at::full({1}, sumsq, at::kDouble);
    comm_.all_reduce(dp_, acc, comm::ReduceOp::Sum, "grad norm")->wait();
    sumsq = acc.item<double>();
  }
  return sumsq;
}

namespace {

// One group's swapped parts in memory for its update: grads, optimizer
// state, param shard (taken as overwritten when the update writes all of
// it). Left without updated() -- an exception -- each is released
// unchanged, so its whole disk copy stays the one read next (a param shard
// taken to be overwritten is not left in memory holding zeros).
class GroupSwapIn {
 public:
  GroupSwapIn(offload::GradSwap* grads, size_t index, offload::ParamSwap* params, const partition::FlatGroup& g,
              bool overwrite_params, offload::StateSwapper* state, int slot)
      : index_(index), group_(&g), slot_(slot) {
    try {
      if (grads) grads->acquire(index), grads_ = grads;
      if (state && slot >= 0) state->acquire(slot), state_ = state;
      if (params) params->acquire(g, overwrite_params), params_ = params;
    } catch (...) {
      drop();
      throw;
    }
  }
  GroupSwapIn(const GroupSwapIn&) = delete;
  GroupSwapIn& operator=(const GroupSwapIn&) = delete;
  ~GroupSwapIn() { drop(); }

  // The update is done: params and state are written back, grads let go.
  void updated() {
    auto* grads = std::exchange(grads_, nullptr);
    auto* params = std::exchange(params_, nullptr);
    auto* state = std::exchange(state_, nullptr);
    if (grads) grads->release(index_);
    if (params) params->release(*group_, /*dirty=*/true);
    if (state) state->release(slot_, /*dirty=*/true);
  }

 private:
  void drop() noexcept {
    try {
      if (auto* p = std::exchange(params_, nullptr)) p->release(*group_, /*dirty=*/false);
    } catch (...) {
    }
    try {
      if (auto* s = std::exchange(state_, nullptr)) s->release(slot_, /*dirty=*/false);
    } catch (...) {
    }
    try {
      if (auto* g = std::exchange(grads_, nullptr)) g->release(index_);
    } catch (...) {
    }
  }

  size_t index_;
  const partition::FlatGroup* group_;
  int slot_;
  offload::GradSwap* grads_ = nullptr;
  offload::ParamSwap* params_ = nullptr;
  offload::StateSwapper* state_ = nullptr;
};

}  // namespace

bool FlatOptimizer::update(std::vector<partition::FlatGroup>& groups) {
  groups_updated_ = 0;
  std::vector<at::Tensor> grads;
  for (const auto& g : groups) grads.push_back(grads_of(g));
  // Clipping needs the norm, and 16-bit runs need it to see an overflow.
  const bool skip_norm = !config_.zero.compute_grad_norm && config_.gradient_clipping == 0 &&
                         !config_.fp16.enabled && !config_.bf16.enabled;
  const double sumsq = skip_norm ? std::numeric_limits<double>::quiet_NaN() : global_sumsq(grads);
  const double scale = scaler_.scale();
  if ((config_.fp16.enabled || config_.bf16.enabled) && !std::isfinite(sumsq)) {
    scaler_.update(true);  // throws at the minimum scale, as DeepSpeed
    ++skipped_steps_;
    const std::string step = std::to_string(global_steps_ + skipped_steps_);
    log_(config_.fp16.enabled ? "OVERFLOW! Skipping step " + step + ". Attempted loss scale: " + c10::str(scale) +
                                    ", reducing to " + c10::str(scaler_.scale())
                              : "OVERFLOW! Skipping step " + step + ": inf or nan grads (bf16)");
    return false;
  }
  last_grad_norm_ = std::sqrt(sumsq) / scale;
  // DeepSpeed's clip: divide by (norm + 1e-6) / max_norm when that exceeds 1.
  float grad_scale = static_cast<float>(1.0 / scale);
  if (config_.gradient_clipping > 0) {
    const double clip = (last_grad_norm_ + 1e-6) / config_.gradient_clipping;
    if (clip > 1.0) grad_scale = static_cast<float>(1.0 / (scale * clip));
  }
  const double rate = lr();
  ++optimizer_steps_;
  if (config_.optimizer.type == OptimizerType::Lamb) {
    groups_updated_ = groups.size();  // any group may change
    update_lamb(groups, grads, rate, grad_scale);
    return true;
  }
  if (config_.optimizer.type == OptimizerType::Muon) {  // docs/design.md, "Muon over flat shards"
    groups_updated_ = groups.size();
    // Muon scales one step lr per group: with each group's lr given
    // (set_lr_override) the step lr is 1 and the scale the group's lr.
    const double muon_rate = lr_override_.empty() ? rate : 1.0;
    muon_update(groups, grads, {config_.optimizer, policy_, comm_, dp_, muon_rate, grad_scale, optimizer_steps_,
                                [&](const at::Tensor& p) {
                                  auto it = group_of_.find(p.unsafeGetTensorImpl());
                                  const int h = it == group_of_.end() ? 0 : it->second;
                                  return std::make_pair(rate_of(muon_rate, h) / muon_rate, weight_decay_of(h));
                                }});
    return true;
  }
  if (offload_staging_.size() != groups.size()) offload_staging_.resize(groups.size());
  if (!swapper_ && !param_swap_) {
    for (size_t i = 0; i < groups.size(); ++i) {
      ++groups_updated_;
      update_group(i, groups[i], grads[i], rate, grad_scale);
    }
    return true;
  }
  // ZeRO-Infinity: group i's state (and param shard, and grads) comes in
  // from the swap files, is updated and goes back (the grads need not: they
  // are discarded after the step); group i+1's is read meanwhile
  // (pipeline_read), group i's write overlaps group i+1's update
  // (pipeline_write; the param shards' writes always do).
  // A 16-bit shard is only written by the update (every element: its
  // padding stays zero), so it is not read in; an fp32 host model's shard
  // is the master, which the update reads.
  const auto shard_is_output = [&](const partition::FlatGroup& g) {
    return out_kind(policy_.update_destination(g, dp_.rank()), g) != optim::Out16::None;
  };
  for (size_t i = 0; i < groups.size(); ++i) {
    GroupSwapIn in(grad_swap_, i, param_swap_, groups[i], shard_is_output(groups[i]), swapper_.get(),
                   swap_slot_of(groups[i]));
    if (config_.zero.offload_optimizer.pipeline_read && i + 1 < groups.size()) {
      for (size_t j = i + 1; swapper_ && j < groups.size(); ++j)
        if (const int next = swap_slot_of(groups[j]); next >= 0) {
          swapper_->prefetch(next);
          break;
        }
      if (param_swap_ && !shard_is_output(groups[i + 1])) param_swap_->prefetch(groups[i + 1]);
      if (grad_swap_) grad_swap_->prefetch(i + 1);
    }
    ++groups_updated_;  // from here on its master may have changed
    update_group(i, groups[i], grads[i], rate, grad_scale);
    in.updated();
  }
  if (param_swap_) param_swap_->flush();
  if (swapper_) swapper_->flush();
  return true;
}

void FlatOptimizer::commit() {
  scaler_.update(false);
  ++scheduler_iter_;
  schedule_written_ = true;
  ++global_steps_;
}

void FlatOptimizer::update_group(size_t index, partition::FlatGroup& g, const at::Tensor& grad, double lr,
                                 float grad_scale) {
  // The grads' device: where the kernels run and the offload's streams are.
  const c10::OptionalDeviceGuard on_device(guard_device(grad));
  if (g.master.is_cpu() && !grad.is_cpu()) return update_offloaded(offload_staging_[index], g, grad, lr, grad_scale);
  const at::Tensor dest = policy_.update_destination(g, dp_.rank());
  if (dest.device() != g.master.device()) {
    // offload_param without offload_optimizer: the update writes the new
    // 16-bit values beside the master on the device, then they go down.
    if (g.storage_dtype == at::kFloat) {  // the params are the master's values
      for (const Span& s : spans_of(g)) update_span(g, grad, s, lr, grad_scale, nullptr, optim::Out16::None);
      dest.copy_(g.master);
      return;
    }
    const at::Tensor staged = at::empty_like(dest, dest.options().device(g.master.device()));
    const auto kind = out_kind(staged, g);
    for (const Span& s : spans_of(g)) update_span(g, grad, s, lr, grad_scale, staged.data_ptr(), kind);
    dest.copy_(staged);
    return;
  }
  const auto kind = out_kind(dest, g);
  void* out16 = kind == optim::Out16::None ? nullptr : dest.data_ptr();
  for (const Span& s : spans_of(g)) update_span(g, grad, s, lr, grad_scale, out16, kind);
}

// ZeRO-Offload (offload_optimizer device cpu, a model on a device): the
// reduced grads come to the host, the fused CPU kernel updates the host
// master and moments (writing the params' 16-bit values into a pinned
// staging buffer in the same pass), and the params go back to the device in
// their dtype. Pipelined per chunk (engine/update_chunks.h), as DeepSpeed's
// offload overlaps per bucket: all chunks' grads are queued down on one side
// stream, chunk k is updated once its grads have landed, and its params are
// queued up on another while chunk k+1 is updated. The downloads wait for
// the caller's stream (the reduction that made the grads); the caller's
// stream waits for the uploads (what reads the params next), the host does
// not. Written against c10's device-generic streams and events, so the
// tests' CPU-backed device runs it too.
//
// The pinned buffers are the group's own, kept across steps (pinning is
// slow: a cudaHostAlloc each). Reusing them is safe without a host wait:
// this step's first write into them follows the host's wait for this
// step's grads, which the caller's stream made after it waited for the
// previous step's uploads.
// STATUS: the CUDA side is not yet run on a GPU.
void FlatOptimizer::update_offloaded(OffloadStaging& staging, partition::FlatGroup& g, const at::Tensor& grad,
                                     double lr, float grad_scale) {
  const auto pinned_like = [&](at::Tensor& buffer, const at::Tensor& like) -> at::Tensor& {
    if (!buffer.defined() || buffer.sizes() != like.sizes() || buffer.scalar_type() != like.scalar_type())
      buffer = at::empty(like.sizes(), at::TensorOptions().dtype(like.scalar_type()).pinned_memory(true));
    return buffer;
  };
  const at::Tensor dest = policy_.update_destination(g, dp_.rank());
  optim::Out16 kind = optim::Out16::None;
  at::Tensor staged;  // the params' new values in their dtype, when not the master's fp32 itself
  if (g.storage_dtype != at::kFloat) {
    staged = dest.is_cpu() ? dest : pinned_like(staging.params, dest);  // offload_param: written in place on the host
    kind = out_kind(staged, g);
  }
  const at::Tensor& updated = staged.defined() ? staged : g.master;
  const bool send_up = !updated.is_same(dest);

  const c10::Device device = grad.device();
  const c10::impl::VirtualGuardImpl streams(device.type());
  const c10::Stream caller = streams.getStream(device);
  const c10::Stream down = streams.getStreamFromGlobalPool(device);
  const c10::Stream up = streams.getStreamFromGlobalPool(device);
  const auto chunks = cut_into_chunks(spans_of(g), g.master.numel(), offload_chunk_elements());
  at::Tensor& host_grad = pinned_like(staging.grads, grad);
  std::vector<c10::Event> landed;
  landed.reserve(chunks.size());
  {
    c10::Event grads_ready(device.type());
    grads_ready.record(caller);
    grads_ready.block(down);
    if (send_up) grads_ready.block(up);  // the params' readers queued so far come before their overwrite
    const c10::StreamGuard on_down(down);
    for (const auto& chunk : chunks) {
      host_grad.narrow(0, chunk.begin, chunk.numel)
          .copy_(grad.narrow(0, chunk.begin, chunk.numel), /*non_blocking=*/true);
      landed.emplace_back(device.type());
      landed.back().record(down);
    }
  }
  for (size_t k = 0; k < chunks.size(); ++k) {
    landed[k].synchronize();
    for (const Span& piece : chunks[k].pieces)
      update_span(g, host_grad, piece, lr, grad_scale, staged.defined() ? staged.data_ptr() : nullptr, kind);
    if (send_up) {
      const c10::StreamGuard on_up(up);
      dest.narrow(0, chunks[k].begin, chunks[k].numel)
          .copy_(updated.narrow(0, chunks[k].begin, chunks[k].numel), /*non_blocking=*/true);
    }
  }
  if (send_up) {
    c10::Event sent(device.type());
    sent.record(up);
    sent.block(caller);
  }
}

// LAMB's trust ratio is per param, and a param's elements may lie on
// several ranks' shards. Pass 1 updates the moments over this rank's
// fragments and sums, per param, p^2 and u^2 of its elements here; one
// all-reduce (sum) of those 2 x (params) doubles over the data-parallel
// group makes them whole-param sums on every rank (stage 0 holds whole
// params: no all-reduce); pass 2 applies each fragment's step with its
// param's ratio and writes the 16-bit params.
void FlatOptimizer::update_lamb(std::vector<partition::FlatGroup>& groups, const std::vector<at::Tensor>& grads,
                                double lr, float grad_scale) {
  struct Piece {
    size_t group;
    int64_t begin, numel;  // in the master
    int64_t slot;          // the param's index into the sums
    int hyper;
  };
  std::vector<Piece> pieces;
  int64_t slots = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const auto& g = groups[gi];
    if ((g.master.is_cpu() && !grads[gi].is_cpu()) ||
        policy_.update_destination(g, dp_.rank()).device() != g.master.device())
      throw std::invalid_argument("optimizer Lamb: offload_optimizer / offload_param to the host of a model on " +
                                  grads[gi].device().str() + " is not supported yet");
    std::unordered_map<int64_t, std::pair<int64_t, int>> slot_of;  // layout's param_index -> (slot, hyper)
    for (size_t i = 0; i < g.params.size(); ++i) {
      auto it = group_of_.find(g.params[i].unsafeGetTensorImpl());
      slot_of[g.layout.params[i].param_index] = {slots++, it == group_of_.end() ? 0 : it->second};
    }
    if (policy_.shard_optimizer_state) {
      for (const auto& f : g.layout.fragments(dp_.rank())) {
        const auto [slot, hyper] = slot_of.at(f.param_index);
        pieces.push_back({gi, f.shard_offset, f.numel, slot, hyper});
      }
    } else {
      for (const auto& p : g.layout.params) {
        const auto [slot, hyper] = slot_of.at(p.param_index);
        pieces.push_back({gi, p.offset, p.numel, slot, hyper});
      }
    }
  }
  const auto& o = config_.optimizer;
  const auto hyper_of = [&](int hyper) {
    return optim::LambHyper{static_cast<float>(rate_of(lr, hyper)), static_cast<float>(o.betas[0]),
                            static_cast<float>(o.betas[1]), static_cast<float>(o.eps),
                            static_cast<float>(weight_decay_of(hyper)), static_cast<float>(o.max_coeff),
                            static_cast<float>(o.min_coeff), optimizer_steps_, o.bias_correction};
  };
  const c10::Device device = groups.empty() ? c10::Device(at::kCPU) : groups.front().master.device();
  at::Tensor sums = at::zeros({2 * slots}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const Piece& pc : pieces) {
    auto& g = groups[pc.group];
    const float* p = g.master.data_ptr<float>() + pc.begin;
    const float* gr = grads[pc.group].data_ptr<float>() + pc.begin;
    float* m = g.exp_avg.data_ptr<float>() + pc.begin;
    float* v = g.exp_avg_sq.data_ptr<float>() + pc.begin;
    double* sum = sums.data_ptr<double>() + 2 * pc.slot;
    const c10::OptionalDeviceGuard on_device(guard_device(g.master));
    if (g.master.is_cuda()) {
#ifdef ZERO_WITH_CUDA
      optim::cuda::lamb_moments(p, gr, m, v, pc.numel, hyper_of(pc.hyper), grad_scale, sum,
                                c10::cuda::getCurrentCUDAStream(g.master.device().index()).stream());
#endif
    } else {
      optim::lamb_moments(p, gr, m, v, pc.numel, hyper_of(pc.hyper), grad_scale, sum);
    }
  }
  at::Tensor host = sums.to(at::kCPU);  // the ratios are computed on the host
  if (policy_.shard_optimizer_state) comm_.all_reduce(dp_, host, comm::ReduceOp::Sum, "lamb norms")->wait();
  const double* total = host.data_ptr<double>();
  for (const Piece& pc : pieces) {
    auto& g = groups[pc.group];
    const optim::LambHyper h = hyper_of(pc.hyper);
    const float ratio = optim::lamb_trust_ratio(total[2 * pc.slot], total[2 * pc.slot + 1], h);
    const at::Tensor dest = policy_.update_destination(g, dp_.rank());
    const auto kind = out_kind(dest, g);
    void* out = kind == optim::Out16::None
                    ? nullptr
                    : static_cast<char*>(dest.data_ptr()) + pc.begin * optim::out16_bytes(kind);
    float* p = g.master.data_ptr<float>() + pc.begin;
    const float* m = g.exp_avg.data_ptr<float>() + pc.begin;
    const float* v = g.exp_avg_sq.data_ptr<float>() + pc.begin;
    const c10::OptionalDeviceGuard on_device(guard_device(g.master));
    if (g.master.is_cuda()) {
#ifdef ZERO_WITH_CUDA
      optim::cuda::lamb_apply(p, m, v, pc.numel, h, ratio, out, kind,
                              c10::cuda::getCurrentCUDAStream(g.master.device().index()).stream());
#endif
    } else {
      optim::lamb_apply(p, m, v, pc.numel, h, ratio, out, kind);
    }
  }
}

void FlatOptimizer::update_span(partition::FlatGroup& g, const at::Tensor& grad, const Span& s, double lr,
                                float grad_scale, void* out16, optim::Out16 kind) {
  const float rate = static_cast<float>(rate_of(lr, s.hyper)), wd = static_cast<float>(weight_decay_of(s.hyper));
  float* master = g.master.data_ptr<float>() + s.begin;
  const float* gr = grad.data_ptr<float>() + s.begin;
  void* out = out16 ? static_cast<char*>(out16) + s.begin * optim::out16_bytes(kind) : nullptr;
  const auto& o = config_.optimizer;
  if (o.type == OptimizerType::SGD) {
    optim::SgdHyper h{rate, static_cast<float>(o.momentum), static_cast<float>(o.dampening), wd, o.nesterov,
                      optimizer_steps_ == 1};
    float* buf = g.exp_avg.defined() ? g.exp_avg.data_ptr<float>() + s.begin : nullptr;
    if (g.master.is_cuda()) device_sgd(g.master.device(), master, gr, buf, s.numel, h, grad_scale, out, kind);
    else optim::sgd_update(master, gr, buf, s.numel, h, grad_scale, out, kind);
  } else if (o.type == OptimizerType::Lion) {
    // OneCycle moves Lion's beta1 too (FusedLion has betas, as Adam).
    const auto betas = this->betas();
    optim::LionHyper h{rate, static_cast<float>(betas[0]), static_cast<float>(betas[1]), wd};
    float* m = g.exp_avg.data_ptr<float>() + s.begin;
    if (g.master.is_cuda()) device_lion(g.master.device(), master, gr, m, s.numel, h, grad_scale, out, kind);
    else optim::lion_update(master, gr, m, s.numel, h, grad_scale, out, kind);
  } else if (o.type == OptimizerType::Adagrad) {
    optim::AdagradHyper h{rate, static_cast<float>(o.eps), wd};
    float* sum = g.exp_avg_sq.data_ptr<float>() + s.begin;
    if (g.master.is_cuda()) device_adagrad(g.master.device(), master, gr, sum, s.numel, h, grad_scale, out, kind);
    else optim::adagrad_update(master, gr, sum, s.numel, h, grad_scale, out, kind);
  } else {
    // OneCycle moves beta1 with the lr (bias correction then uses the
    // current beta1, as torch's Adam does when a scheduler sets its betas).
    const auto betas = this->betas();
    optim::AdamHyper h{rate, static_cast<float>(betas[0]), static_cast<float>(betas[1]), static_cast<float>(o.eps),
                       wd, optimizer_steps_, o.adam_w_mode, true};
    float* m = g.exp_avg.data_ptr<float>() + s.begin;
    float* v = g.exp_avg_sq.data_ptr<float>() + s.begin;
    if (g.master.is_cuda()) device_adam(g.master.device(), master, gr, m, v, s.numel, h, grad_scale, out, kind);
    else optim::adam_update(master, gr, m, v, s.numel, h, grad_scale, out, kind);
  }
}

nlohmann::json FlatOptimizer::state() const {
  const auto s = scaler_.state();
  return {{"global_steps", global_steps_}, {"skipped_steps", skipped_steps_},
          {"optimizer_steps", optimizer_steps_}, {"scheduler_iter", scheduler_iter_},
          {"schedule_written", schedule_written_},
          {"last_grad_norm", last_grad_norm_}, {"optimizer", to_string(config_.optimizer.type)},
          {"loss_scaler", {{"scale", s.scale}, {"cur_hysteresis", s.cur_hysteresis}, {"cur_iter", s.cur_iter},
                           {"last_overflow_iter", s.last_overflow_iter}}}};
}

void FlatOptimizer::restore(const nlohmann::json& j) {
  restore_counters(j);
  restore_update_state(j);
}

void FlatOptimizer::restore_counters(const nlohmann::json& j) {
  global_steps_ = j.at("global_steps");
  skipped_steps_ = j.at("skipped_steps");
  scheduler_iter_ = j.at("scheduler_iter");
  schedule_written_ = j.value("schedule_written", true);
  // NaN (no norm computed: compute_grad_norm false) is saved as null.
  const auto& norm = j.at("last_grad_norm");
  last_grad_norm_ = norm.is_null() ? std::numeric_limits<double>::quiet_NaN() : norm.get<double>();
}

void FlatOptimizer::restore_update_state(const nlohmann::json& j) {
  optimizer_steps_ = j.at("optimizer_steps");
  const auto& s = j.at("loss_scaler");
  scaler_.restore({s.at("scale"), s.at("cur_hysteresis"), s.at("cur_iter"), s.at("last_overflow_iter")});
}

}  // namespace zero
