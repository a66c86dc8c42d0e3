#include "zero/grad_reducer.h"

#include <algorithm>
#include <stdexcept>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <c10/core/DeviceGuard.h>

#include "common/guard_device.h"
#include "memory/page_buffer.h"
#include "offload/grad_swap.h"

namespace zero {

namespace {

using torch::autograd::variable_list;

// Runs before AccumulateGrad: begins a backward the engine did not start,
// makes room for a grad whose group was already reduced, and lets stage 2
// point .grad into a freshly allocated group buffer so the grad is
// accumulated straight into it.
struct BeforeAccumulate : torch::autograd::FunctionPreHook {
  BeforeAccumulate(std::weak_ptr<GradReducer> r, size_t group) : reducer(std::move(r)), group(group) {}
  variable_list operator()(const variable_list& grads) override {
    auto r = reducer.lock();
    if (!r || grads.empty() || !grads[0].defined()) return grads;
    // Autograd's thread for the grad's device; the guard says so whatever it set.
    const c10::OptionalDeviceGuard on_device(guard_device(grads[0]));
    return {r->on_grad_about_to_accumulate(group, grads[0])};
  }
  std::weak_ptr<GradReducer> reducer;
  size_t group;
};

// Runs after AccumulateGrad: one arrival of the param's grad is in.
struct AfterAccumulate : torch::autograd::FunctionPostHook {
  AfterAccumulate(std::weak_ptr<GradReducer> r, size_t group, size_t param)
      : reducer(std::move(r)), group(group), param(param) {}
  variable_list operator()(const variable_list& outputs, const variable_list&) override {
    if (auto r = reducer.lock()) {
      const c10::OptionalDeviceGuard on_device(r->guard_device_of_group(group));
      r->on_grad_accumulated(group, param);  // may launch the group's reduction
    }
    return outputs;
  }
  std::weak_ptr<GradReducer> reducer;
  size_t group, param;
};

}  // namespace

GradReducer::GradReducer(std::vector<partition::FlatGroup>& groups, comm::Comm& comm, const comm::Group& dp,
                         ReducerOptions opts)
    : groups_(groups), comm_(comm), dp_(dp), opts_(opts), state_(groups.size()) {
  memory::keeping_freed_pages();  // a bad ZERO_KEEP_FREED_PAGES throws here, as the engine is made, not mid-backward
  for (auto& g : groups_) {
    expected_.emplace_back(g.params.size(), 1);
    arrived_.emplace_back(g.params.size(), 0);
    if (opts_.policy.keeps_full_grads()) {
      g.grad_flat = memory::zeros_flat(g.layout.padded_numel, opts_.grad_dtype, g.param_flat.device());
      g.attach_grads();
      if (opts_.policy.reduces_into_resident_shard())
        // fp32 grads reduce in place into this rank's slot; 16-bit ones widen into an fp32 shard.
        g.grad_shard = opts_.grad_dtype == at::kFloat
                           ? g.own_slot(g.grad_flat, dp_.rank())
                           : at::zeros({g.layout.shard_numel}, g.param_flat.options().dtype(at::kFloat));
    } else if (opts_.grad_swap) {
      // Page-backed, so its pages can leave memory while it is on disk.
      g.grad_shard = memory::zeros_flat(g.layout.shard_numel, at::kFloat, at::kCPU, /*shared=*/false);
      opts_.grad_swap->adopt(static_cast<size_t>(&g - groups_.data()), g.grad_shard,
                             "group '" + g.names.front() + "' (" + std::to_string(g.params.size()) + " params)");
    } else {
      g.grad_shard = at::zeros({g.layout.shard_numel}, g.param_flat.options().dtype(at::kFloat));
    }
  }
}

std::optional<c10::Device> GradReducer::guard_device_of_group(size_t group) const {
  return guard_device(groups_[group].param_flat);
}

void GradReducer::install_hooks() {
  std::weak_ptr<GradReducer> self = shared_from_this();
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t pi = 0; pi < groups_[gi].params.size(); ++pi) {
      auto acc = torch::autograd::impl::grad_accumulator(groups_[gi].params[pi]);
      acc->add_pre_hook(std::make_unique<BeforeAccumulate>(self, gi));
      acc->add_post_hook(std::make_unique<AfterAccumulate>(self, gi, pi));
      grad_accumulators_.push_back(std::move(acc));
    }
}

void GradReducer::begin_backward(bool reduce, bool implicit) {
  if (!in_flight_.empty()) abort_backward();  // cannot happen: ends and aborts drain it; be safe
  if (flat_reduced_) restart_after_reduction();
  active_ = true;
  if (opts_.policy.shard_grads) keep_freed_grads_.emplace();
  implicit_ = implicit;
  reduce_ = reduce;
  grad_scale_ = 1.0f;
  next_launch_ = 0;
  for (size_t i = 0; i < groups_.size(); ++i) {
    auto& s = state_[i];
    s.pending = 0;
    for (int n : expected_[i]) s.pending += n;
    s.launched = s.late = false;
    s.work = nullptr;
    s.partial = s.wide = at::Tensor();
    std::fill(arrived_[i].begin(), arrived_[i].end(), 0);
  }
  if (opts_.policy.keeps_full_grads())  // re-point .grad at the buffers in case user code cleared them
    for (auto& g : groups_)
      if (!g.params.front().grad().defined()) g.attach_grads();
}

void GradReducer::restart_after_reduction() {
  // Rare (several reductions in one step), so the fp32 in-place shard is
  // only copied out here, never on the common one-reduction path.
  for (size_t i = 0; i < groups_.size(); ++i) restart_group(i);
  flat_reduced_ = false;
}

void GradReducer::restart_group(size_t i) {
  auto& g = groups_[i];
  if (g.grad_shard.is_alias_of(g.grad_flat)) g.grad_shard = g.grad_shard.clone();
  g.grad_flat.zero_();
}

void GradReducer::ensure_grad_buffer(partition::FlatGroup& g) {
  if (g.grad_flat.defined()) return;
  g.grad_flat = memory::zeros_flat(g.layout.padded_numel, opts_.grad_dtype, g.param_flat.device());
  if (opts_.contiguous_gradients) g.attach_grads();
}

at::Tensor GradReducer::on_grad_about_to_accumulate(size_t group, const at::Tensor& grad) {
  if (!active_ || implicit_) {
    if (!opts_.implicit_backward) throw std::logic_error("zero::Engine: a grad arrived outside engine.backward()");
    grad_scale_ = opts_.implicit_backward();  // begins one if none is active
  }
  if (state_[group].launched) reopen(group);
  if (opts_.policy.shard_grads && opts_.contiguous_gradients) ensure_grad_buffer(groups_[group]);
  return grad_scale_ == 1.0f ? grad : grad * grad_scale_;
}

void GradReducer::reopen(size_t i) {
  auto& s = state_[i];
  if (s.work) {
    in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), i));
    finish(i);  // stages 2/3: drops the full buffer; the next grad gets a fresh one
  }
  s.launched = false;
  s.late = true;
  // Stage 1 reduced in place: keep the shard, start the buffer over. Stage 0's
  // averaged grads A stay: the late ones add on top, and averaging A + b
  // again gives A + avg(b), as A is the same on every rank.
  if (opts_.policy.reduces_into_resident_shard()) restart_group(i);
}

void GradReducer::on_grad_accumulated(size_t group, size_t param) {
  if (!active_) throw std::logic_error("zero::Engine: a grad was accumulated outside any backward");
  auto& g = groups_[group];
  if (opts_.policy.shard_grads && !opts_.contiguous_gradients) {
    // The grad arrived as its own tensor: copy it into the group buffer and drop it.
    ensure_grad_buffer(g);
    const auto& slot = g.layout.params[param];
    at::Tensor& grad = g.params[param].mutable_grad();
    g.grad_flat.narrow(0, slot.offset, slot.numel).add_(grad.reshape(-1));
    grad = at::Tensor();
  }
  auto& s = state_[group];
  if (++arrived_[group][param] <= expected_[group][param]) --s.pending;
  if (s.pending == 0) {
    if (opts_.on_group_complete) opts_.on_group_complete(group);
    if (opts_.overlap_comm && reduce_) launch_ready_in_order();
  }
}

void GradReducer::launch_ready_in_order() {
  while (next_launch_ < groups_.size() && state_[next_launch_].pending == 0) {
    launch(next_launch_++);
    retire(false);  // bound the full buffers alive even when many groups become ready at once
  }
}

void GradReducer::retire(bool all) {
  while (!in_flight_.empty() &&
         (all || in_flight_.size() > kMaxInFlight || state_[in_flight_.front()].work->is_completed())) {
    const size_t i = in_flight_.front();
    in_flight_.pop_front();  // before finish(), which may throw
    finish(i);
  }
}

void GradReducer::launch(size_t i) {
  auto& g = groups_[i];
  auto& s = state_[i];
  s.launched = true;
  if (!opts_.policy.shard_optimizer_state) {
    if (opts_.wire_dtype != g.grad_flat.scalar_type()) s.wide = g.grad_flat.to(opts_.wire_dtype);
    s.work = comm_.all_reduce(dp_, s.wide.defined() ? s.wide : g.grad_flat, comm::ReduceOp::Avg, "grads");
  } else {
    ensure_grad_buffer(g);  // sharded grads: a group none of whose params got a grad still takes part
    // A later reduction in the same step lands apart and is added in finish().
    if (!s.shard_fresh) s.partial = at::empty_like(g.grad_shard);
    if (opts_.grad_swap) {  // NVMe: the shard is written whole now, or read in to add to
      if (s.shard_fresh) opts_.grad_swap->hold_for_reduction(i, /*keep=*/false);
      else opts_.grad_swap->prefetch(i);
    }
    at::Tensor out = s.shard_fresh ? g.grad_shard : s.partial;
    if (opts_.wire_dtype != g.grad_flat.scalar_type()) s.wide = g.grad_flat.to(opts_.wire_dtype);
    s.work = comm_.reduce_scatter(dp_, out, s.wide.defined() ? s.wide : g.grad_flat, comm::ReduceOp::Avg, "grads");
    s.shard_fresh = false;
  }
  in_flight_.push_back(i);
}

void GradReducer::finish(size_t i) {
  auto& g = groups_[i];
  auto& s = state_[i];
  s.work->wait();
  s.work = nullptr;
  if (s.wide.defined() && !opts_.policy.shard_optimizer_state) g.grad_flat.copy_(s.wide);  // the all-reduced sums, rounded once
  s.wide = at::Tensor();
  if (s.partial.defined()) {
    if (opts_.grad_swap) opts_.grad_swap->hold_for_reduction(i, /*keep=*/true);
    g.grad_shard.add_(s.partial);
  }
  s.partial = at::Tensor();
  if (opts_.grad_swap) opts_.grad_swap->reduced(i, g.grad_shard);  // stages 2/3 only: the shard is this reduction's
  if (opts_.policy.shard_grads) {
    // Only the shard survives the backward: release the full grads.
    if (opts_.contiguous_gradients) g.detach_grads();
    g.grad_flat = at::Tensor();
  }
}

void GradReducer::end_backward() {
  active_ = false;
  for (size_t i = 0; i < groups_.size(); ++i)
    for (size_t p = 0; p < expected_[i].size(); ++p)
      if (arrived_[i][p] > 0) expected_[i][p] = arrived_[i][p];  // unused this time: keep the count
  if (!reduce_) {
    keep_freed_grads_.reset();
    unreduced_ = true;
    return;
  }
  try {
    reduce_remaining();
    // Only early launches (overlap) can be overtaken by a later grad.
    if (opts_.overlap_comm) reduce_late_groups();
    if (opts_.grad_swap) opts_.grad_swap->flush();  // the last shard's write: none stays in memory to the step
  } catch (...) {
    abort_backward();  // nothing left in flight; this step's grads are gone
    throw;
  }
  // The last buffers, freed by the reductions above, were kept: the scope's
  // end carries what the next backward's first buffers take
  // (memory/shared_arena.h) and gives back the rest.
  keep_freed_grads_.reset();
}

GradReducer::~GradReducer() {
  keep_freed_grads_.reset();
  memory::release_kept_shared_pages();  // no next backward of this engine's to take them
}

void GradReducer::reduce_late_groups() {
  auto late = at::zeros({static_cast<int64_t>(groups_.size())}, at::kFloat);
  for (size_t i = 0; i < groups_.size(); ++i)
    if (state_[i].late) late[static_cast<int64_t>(i)] = 1.0f;
  comm_.all_reduce(dp_, late, comm::ReduceOp::Sum, "grads that arrived after their group's reduction")->wait();
  for (size_t i = 0; i < groups_.size(); ++i) {
    if (late[static_cast<int64_t>(i)].item<float>() == 0.0f) continue;
    // A rank without late grads here still takes part, adding nothing new.
    if (!state_[i].late && opts_.policy.reduces_into_resident_shard()) restart_group(i);
    launch(i);
    retire(false);
    ++late_reductions_;
  }
  retire(true);
}

void GradReducer::flush() {
  if (active_) throw std::logic_error("GradReducer::flush() during a backward");
  if (flat_reduced_) return;  // stage 1: nothing accumulated since the last reduction
  for (auto& s : state_) s.launched = s.late = false;
  next_launch_ = 0;
  try {
    reduce_remaining();
    if (opts_.grad_swap) opts_.grad_swap->flush();
  } catch (...) {
    abort_backward();  // nothing left in flight; the accumulated grads are gone
    throw;
  }
}

void GradReducer::reduce_remaining() {
  for (size_t i = next_launch_; i < groups_.size(); ++i) {
    launch(i);
    retire(false);
  }
  next_launch_ = groups_.size();
  retire(true);
  unreduced_ = false;
  if (opts_.policy.reduces_into_resident_shard()) flat_reduced_ = true;
}

void GradReducer::abort_backward() {
  active_ = false;
  keep_freed_grads_.reset();
  // Reductions already launched still write into the grad buffers when they
  // complete (the transports hold the tensors): let them land before the
  // buffers are cleared, or they would race with the next backward. A peer
  // that never joins makes this end at the collective timeout; the error is
  // dropped, as the backward's own exception is the one to report.
  for (size_t i : in_flight_) {
    try {
      state_[i].work->wait();
    } catch (const std::exception&) {
    }
  }
  in_flight_.clear();
  drop_grads();
}

void GradReducer::drop_grads() {
  for (size_t i = 0; i < groups_.size(); ++i) {
    state_[i] = {};
    if (opts_.policy.shard_grads) {
      if (opts_.contiguous_gradients) groups_[i].detach_grads();
      groups_[i].grad_flat = at::Tensor();
    }
  }
  zero_grads();
}

void GradReducer::zero_grads() {
  for (auto& g : groups_) {
    if (opts_.policy.keeps_full_grads()) g.grad_flat.zero_();
    if (opts_.policy.reduces_into_resident_shard()) {
      // fp32 reduces in place into this rank's slot again (restart_after_reduction
      // may have copied it out); 16-bit grads widen into a separate fp32 shard.
      if (opts_.grad_dtype == at::kFloat) g.grad_shard = g.own_slot(g.grad_flat, dp_.rank());
      else g.grad_shard.zero_();
    }
  }
  // Stages 2/3: the next reduction overwrites the shard instead of adding
  // to it; zeroed too, so a step with no backward in between applies nothing.
  if (opts_.grad_swap) opts_.grad_swap->discard_all();  // zeros without touching the disk
  else if (opts_.policy.shard_grads)
    for (auto& g : groups_) g.grad_shard.zero_();
  for (auto& s : state_) s.shard_fresh = true;
  flat_reduced_ = false;
  unreduced_ = false;
}

}  // namespace zero
