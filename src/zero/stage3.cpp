#include "zero/stage3.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <utility>

#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceGuard.h>

#include "comm/hierarchical_transport.h"
#include "common/guard_device.h"
#include "memory/page_buffer.h"
#include "offload/param_swap.h"
#include "zero/config.h"

namespace zero {

at::Tensor shard_for_gather(const partition::FlatGroup& g) {
  if (g.param_shard.device() == g.param_flat.device()) return g.param_shard;
  // offload_param: the shard lives in pinned host memory; it goes up on the
  // current stream, which the gather waits for.
  return g.param_shard.to(g.param_flat.device(), /*non_blocking=*/true);
}

void gather_params(const partition::FlatGroup& g, comm::Comm& comm, const comm::Group& dp, const std::string& label,
                   offload::ParamSwap* param_swap) {
  if (param_swap) param_swap->acquire(g);
  partition::restore_params(g);
  comm.all_gather(dp, g.param_flat, shard_for_gather(g), label)->wait();
  if (param_swap) param_swap->release(g, /*dirty=*/false);
}

namespace {

// A collective followed by local work queued once it is done (on a device,
// on the caller's stream after its wait), exactly once.
class ThenWork : public comm::Work {
 public:
  ThenWork(comm::WorkHandle work, std::function<void()> then) : work_(std::move(work)), then_(std::move(then)) {}
  void wait() override {
    work_->wait();
    if (then_) std::exchange(then_, nullptr)();
  }
  bool is_completed() override { return !then_ && work_->is_completed(); }

 private:
  comm::WorkHandle work_;
  std::function<void()> then_;
};

}  // namespace

// ---- the recorded order -----------------------------------------------------------

void UnitSchedule::use(size_t unit, Phase phase) {
  if (recording_) {
    trace_.push_back({unit, phase});
  } else if (on_trace_ && (position_ >= trace_.size() || trace_[position_].unit != unit ||
                           trace_[position_].phase != phase)) {
    on_trace_ = false;  // the order changed this step: gather on demand only
  }
  ++position_;
}

void UnitSchedule::end_step() {
  recording_ = false;
  reset_position();
}

// ---- the runtime --------------------------------------------------------------------

Stage3Runtime::Stage3Runtime(std::vector<partition::FlatGroup>& groups, std::vector<bool> persistent,
                             std::vector<size_t> unit_to_group, std::vector<std::string> unit_names,
                             size_t root_group, comm::Comm& comm, const comm::Group& dp, Stage3Options opts)
    : groups_(groups), state_(groups.size()), unit_to_group_(std::move(unit_to_group)),
      unit_names_(std::move(unit_names)), comm_(comm), dp_(dp), opts_(opts) {
  // Each gather's label names its unit: ranks whose unit orders diverge get
  // an error naming both units at the first gather that differs.
  for (size_t u = 0; u < unit_to_group_.size(); ++u) {
    if (unit_to_group_[u] >= groups_.size()) continue;  // no trainable params: never gathered
    if (unit_to_group_[u] == root_group) continue;      // a unit whose params all live in the root
    auto& label = state_[unit_to_group_[u]].label;
    label += (label.empty() ? "params of unit '" : ", '") + unit_names_[u] + "'";
  }
  for (size_t i = 0; i < groups_.size(); ++i) {
    auto& s = state_[i];
    if (s.label.empty()) s.label = "params of the root unit";
    s.persistent = persistent[i];
    s.residency = s.persistent ? Residency::Gathered : Residency::Released;
    if (!s.persistent) {
      // No peer reads a released unit's full buffer (gathers read the
      // shards): private pages, which fault in faster at each regather
      // than a shared memfd's. It holds nothing yet, released.
      auto& g = groups_[i];
      if (memory::shared_backed(g.param_flat)) {
        partition::view_params_in(g, memory::zeros_flat(g.param_flat.numel(), g.param_flat.scalar_type(),
                                                        g.param_flat.device(), /*shared=*/false));
        partition::release_params(g);
      }
      name_released_contents(i);
    }
  }
}

Stage3Runtime::~Stage3Runtime() {
  try {
    drop_held();  // the units stay released after the engine (stage3.h): without pages
  } catch (...) {   // a failed release (mprotect) leaves them to the buffer's own unmap
  }
}

int64_t Stage3Runtime::root_numel() const {
  return root_unit_ == kNoUnit ? 0 : groups_[unit_to_group_[root_unit_]].layout.numel;
}

void Stage3Runtime::name_released_contents(size_t i) {
  const auto& g = groups_[i];
  // The root's size decides whether it is sharded at all: say so, since the
  // same code works on a model whose root stays under the threshold.
  const bool root = root_unit_ != kNoUnit && i == unit_to_group_[root_unit_];
  const std::string why_root =
      root ? "The root's " + std::to_string(g.layout.numel) + " params are above stage3_param_persistence_threshold (" +
                 std::to_string(opts_.param_persistence_threshold) +
                 "), so since the first engine.forward(...) they are full only inside engine.forward(...) and its "
                 "backward: call the model through engine.forward(...) (under torch::NoGradGuard to evaluate), or "
                 "raise the threshold above their count to keep them gathered. "
           : std::string();
  const size_t elem = g.param_flat.element_size();
  std::vector<memory::NamedRange> ranges;
  for (size_t p = 0; p < g.params.size(); ++p)
    ranges.push_back({static_cast<size_t>(g.layout.params[p].offset) * elem,
                      static_cast<size_t>(g.layout.params[p].numel) * elem,
                      "stage 3: param '" + g.names[p] + "' (" + state_[i].label.substr(10) + ")"});
  memory::name_released_contents(
      g.param_flat, std::move(ranges),
      why_root +
      "between uses only this rank's shard of it exists (the root unit's params, those outside every "
      "zero::Unit, are full only inside engine.forward(...) and its backward, once it is used). Read or "
      "change full params inside "
      "engine.gathered_parameters(...); save them with engine.state_dict() or engine.save_weights(); and a "
      "param that code outside its unit uses must be registered in that code's module too (it then stays "
      "gathered). After its engine is destroyed a stage-3 model's units stay released: take "
      "engine.state_dict() first. See docs/troubleshooting.md.");
}

void Stage3Runtime::pin(size_t i) {
  gather(i);
  ++state_[i].pinned;
}

void Stage3Runtime::unpin(size_t i) {
  if (state_[i].pinned > 0 && --state_[i].pinned == 0) {
    state_[i].secondary_valid = false;  // the scope may have written the params
    release(i);
  }
}

template <typename F>
void Stage3Runtime::naming_divergence(size_t unit, Phase phase, F&& gathers) {
  try {
    gathers();
  } catch (const comm::CollectiveMismatch& e) {
    throw comm::CollectiveMismatch(
        "stage 3: the ranks of " + dp_.describe() + " run their units in different orders (every rank must call "
        "the same units in the same order); this rank was at use #" + std::to_string(schedule_.position()) +
        " of its step, the " + (phase == Phase::Forward ? "forward" : "backward") + " of unit '" +
        unit_names_[unit] + "': " + e.what());
  }
}

void Stage3Runtime::start_gather(size_t i) {
  auto& g = groups_[i];
  auto& s = state_[i];
  // On the unit's device: this runs on the caller's thread or, in backward,
  // on autograd's, and what it allocates and queues belongs there.
  const c10::OptionalDeviceGuard on_device(guard_device(g.param_flat));
  // hpZ: a backward gather reads the secondary shards of this host's ranks.
  s.from_secondary = in_backward_ && s.secondary_valid;
  // offload_param nvme: on a device model with pin_memory, the shard goes
  // up from a pinned buffer it was read into; else it is paged into host
  // memory until the gather is done. Either first: a failed read leaves the
  // group as it was.
  std::optional<at::Tensor> uploaded;
  if (!s.from_secondary && opts_.param_swap && !gathers_fp32_master(i)) {
    uploaded = opts_.param_swap->upload_for_gather(g, g.param_flat.device());
    if (!uploaded) {
      opts_.param_swap->acquire(g);
      s.shard_acquired = true;
    }
  }
  if (held_ && partition::take_held_params(g, groups_[*held_])) {
    held_.reset();
  } else {
    drop_held();  // of another size (or device memory): it goes before this one's pages come
    partition::restore_params(g);
  }
  try {
    s.gather = s.from_secondary
                   ? comm_.all_gather(*opts_.secondary_group, g.param_flat, s.secondary, s.label + " (hpZ)")
                   : launch_gather(i, std::move(uploaded));
  } catch (...) {
    // Not gathered: inaccessible again (its pages may hold another unit's params).
    partition::release_params(g);
    throw;
  }
  s.residency = Residency::Gathering;
  live_ += g.layout.padded_numel;
  if (!in_backward_) peak_live_forward_ = std::max(peak_live_forward_, live_);
}

bool Stage3Runtime::gathers_fp32_master(size_t i) const {
  const auto& g = groups_[i];
  return opts_.gather_fp32_master && g.param_flat.element_size() == 2 && g.master.defined() &&
         g.master.device() == g.param_flat.device();
}

comm::WorkHandle Stage3Runtime::launch_gather(size_t i, std::optional<at::Tensor> uploaded) {
  const auto& g = groups_[i];
  if (!gathers_fp32_master(i))
    return comm_.all_gather(dp_, g.param_flat, uploaded ? *uploaded : shard_for_gather(g), state_[i].label);
  // Seed 000's "before": the fp32 master travels and a cast follows. The
  // fused path above moves the 16-bit shard the optimizer wrote in its pass.
  at::Tensor wide = at::empty({g.param_flat.numel()}, g.master.options());
  return std::make_shared<ThenWork>(comm_.all_gather(dp_, wide, g.master, state_[i].label),
                                    [flat = g.param_flat, wide] { flat.copy_(wide); });
}

void Stage3Runtime::evict_for(int64_t need) {
  for (size_t i = 0; i < groups_.size() && live_ + need > opts_.max_live_parameters; ++i) {
    const auto& s = state_[i];
    if (gathered(i) && !s.persistent && s.in_forward == 0 && !s.awaiting_grads && !s.prefetched)
      release(i, /*to_next_gather=*/in_backward_ || at::GradMode::is_enabled());
  }
}

void Stage3Runtime::gather(size_t i) {
  auto& s = state_[i];
  if (s.residency == Residency::Released) {
    evict_for(groups_[i].layout.padded_numel);
    start_gather(i);
  }
  s.prefetched = false;
  if (s.residency == Residency::Gathering) {
    s.gather->wait();  // on failure the group stays Gathering: release() will not free a buffer still written
    s.gather = nullptr;
    s.residency = Residency::Gathered;
    // Every peer has read the shard too (a collective completes when all
    // are done with its buffers): its pages can go.
    if (std::exchange(s.shard_acquired, false)) opts_.param_swap->release(groups_[i], /*dirty=*/false);
    if (!s.from_secondary) keep_secondary(i);
  }
}

void Stage3Runtime::keep_secondary(size_t i) {
  auto& s = state_[i];
  if (!opts_.secondary_group || s.persistent || s.secondary_valid) return;
  const auto& g = groups_[i];
  const int64_t part = g.param_flat.numel() / opts_.secondary_group->size();
  if (!s.secondary.defined())
    // A flat buffer: backward's gathers read it in place (zero-copy).
    s.secondary = memory::zeros_flat(part, g.param_shard.scalar_type(), g.param_flat.device());
  s.secondary.copy_(g.param_flat.narrow(0, opts_.secondary_rank * part, part));
  s.secondary_valid = true;
}

void Stage3Runtime::drop_secondaries() {
  for (auto& s : state_) s.secondary_valid = false;
}

void configure_hpz(Stage3Options& o, int64_t size, const comm::Group& dp) {
  if (size <= 1) return;
  const comm::HierGroup* h = comm::hier_group(dp);
  if (!h) {
    if (size == dp.size()) return;  // every rank on one host: gathers stay there already
    throw ConfigError("ds_config: zero_optimization.zero_hpz_partition_size = " + std::to_string(size) + ", but " +
                      dp.describe() + " is not spread evenly over several hosts (hpZ's secondary partition is " +
                      "one host's ranks; on one host set it to the group's size, " + std::to_string(dp.size()) +
                      ", or leave it at 1)");
  }
  if (size != h->layout.per_host)
    throw ConfigError("ds_config: zero_optimization.zero_hpz_partition_size = " + std::to_string(size) + ", but " +
                      dp.describe() + " has " + std::to_string(h->layout.per_host) + " ranks on each of " +
                      std::to_string(h->layout.hosts) + " hosts; hpZ's secondary partition is one host's ranks, so " +
                      "it must be " + std::to_string(h->layout.per_host));
  o.secondary_group = h->host_local.get();
  o.secondary_rank = h->local;
}

void Stage3Runtime::release(size_t i, bool to_next_gather) {
  auto& s = state_[i];
  // in_forward: a unit whose params live in the root ends its forward inside the root's.
  if (s.residency == Residency::Released || s.persistent || s.pinned || s.in_forward > 0) return;
  if (s.residency == Residency::Gathering) gather(i);  // never free a buffer a collective is writing
  if (to_next_gather) drop_held();  // at most one held
  if (to_next_gather && partition::hold_params(groups_[i])) held_ = i;
  else partition::release_params(groups_[i]);
  s.residency = Residency::Released;
  live_ -= groups_[i].layout.padded_numel;
}

void Stage3Runtime::drop_held() {
  if (held_) partition::release_params(groups_[*std::exchange(held_, std::nullopt)]);
}

void Stage3Runtime::use(size_t unit, Phase phase) {
  schedule_.use(unit, phase);
  naming_divergence(unit, phase, [&] {
    gather(group_of(unit));
    if (schedule_.following()) prefetch_after(schedule_.position());
  });
  if (opts_.param_swap && schedule_.following()) read_ahead(schedule_.position());
}

void Stage3Runtime::read_ahead(size_t position) {
  auto& swap = *opts_.param_swap;
  const auto& trace = schedule_.trace();
  for (size_t p = position; p < trace.size() && swap.room_to_read_ahead(); ++p) {
    const size_t g = group_of(trace[p].unit);
    if (!gathered(g)) swap.read_ahead_for_gather(groups_[g]);  // no-op for a shard in memory or on its way
  }
}

void Stage3Runtime::prefetch_after(size_t position) {
  int64_t in_flight = 0;
  for (size_t i = 0; i < groups_.size(); ++i)
    if (state_[i].residency == Residency::Gathering) in_flight += groups_[i].layout.padded_numel;
  const auto& trace = schedule_.trace();
  for (size_t p = position; p < trace.size(); ++p) {
    const size_t g = group_of(trace[p].unit);
    if (gathered(g)) continue;
    const int64_t n = groups_[g].layout.padded_numel;
    if (in_flight + n > opts_.prefetch_bucket_size || live_ + n > opts_.max_live_parameters) break;
    start_gather(g);
    state_[g].prefetched = true;
    in_flight += n;
  }
}

bool Stage3Runtime::reused_soon(size_t unit, size_t position) const {
  const int64_t d = schedule_.reuse_distance(unit, position, [&](size_t u) { return numel_of_unit(u); });
  return d >= 0 && d < opts_.max_reuse_distance;
}

void Stage3Runtime::before_forward(size_t unit) {
  if (!at::GradMode::is_enabled()) {
    // Evaluation: gather on demand, outside the recorded training schedule.
    naming_divergence(unit, Phase::Forward, [&] { gather(group_of(unit)); });
  } else {
    use(unit, Phase::Forward);
  }
  ++state_[group_of(unit)].in_forward;
}

void Stage3Runtime::set_shardable_root(size_t group) {
  if (group >= groups_.size()) return;
  root_unit_ = unit_to_group_.size();
  unit_to_group_.push_back(group);
  unit_names_.push_back("the root");
}

void Stage3Runtime::begin_root_forward() {
  if (root_unit_ == kNoUnit) return;
  if (!root_sharded_) {
    root_sharded_ = true;
    const size_t root = group_of(root_unit_);
    state_[root].persistent = false;
    // Gathered until now as a persistent group, which live_ leaves out: from
    // here on it counts against stage3_max_live_parameters like any unit.
    if (gathered(root)) live_ += groups_[root].layout.padded_numel;
    name_released_contents(root);
    if (!schedule_.recording()) schedule_ = UnitSchedule{};  // re-learn the order with the root in it
  }
  before_forward(root_unit_);
}

at::Tensor Stage3Runtime::end_root_forward(const at::Tensor& out) {
  return root_unit_ == kNoUnit ? out : after_forward(root_unit_, out);
}

void Stage3Runtime::end_root_forward(const std::vector<at::Tensor>& outs) {
  if (root_unit_ != kNoUnit) after_forward(root_unit_, outs);
}

void Stage3Runtime::root_forward_failed() {
  if (root_unit_ != kNoUnit) forward_failed(root_unit_);
}

void Stage3Runtime::forward_failed(size_t unit) {
  --state_[group_of(unit)].in_forward;
  release(group_of(unit));
}

at::Tensor Stage3Runtime::after_forward(size_t unit, const at::Tensor& out) {
  after_forward(unit, std::vector<at::Tensor>{out});
  return out;
}

void Stage3Runtime::after_forward(size_t unit, const std::vector<at::Tensor>& outs) {
  const size_t g = group_of(unit);
  --state_[g].in_forward;
  const bool keep = at::GradMode::is_enabled() && schedule_.following() && live_ <= opts_.max_live_parameters &&
                    reused_soon(unit, schedule_.position());
  // Its pages go to the next gather where the recorded order says another
  // unit's forward comes next (whose prefetch gathers at once); not where
  // the model's head and loss come first, as activations peak there.
  const auto& trace = schedule_.trace();
  const size_t next = schedule_.position();
  const bool forward_follows = at::GradMode::is_enabled() && schedule_.following() && next < trace.size() &&
                               trace[next].phase == Phase::Forward;
  // A forward that runs inside backward is a recompute (activation
  // checkpointing, torch's non-reentrant kind included: the recompute fills
  // the saved tensors the unit's own backward reads next): the unit stays
  // gathered until its grads are in.
  const bool recompute = in_backward_ && at::GradMode::is_enabled();
  if (recompute) state_[g].awaiting_grads = true;
  else if (!keep) release(g, forward_follows);
  // A grad hook on each output runs before the grad flows into the unit's
  // own backward ops, which need its params. (Hooks, not a wrapping
  // autograd function: the outputs stay plain tensors, in-place ops on
  // them included.) The first one to fire regathers, once per forward call:
  // a unit called twice is used twice in backward too. An output that
  // does not require grad has no backward (e.g. evaluation).
  auto fired = std::make_shared<bool>(false);
  for (const auto& out : outs) {
    if (!out.defined() || !out.requires_grad()) continue;
    at::Tensor hooked = out;  // the same tensor: the hook is registered on the caller's
    hooked.register_hook([this, unit, fired](const at::Tensor&) {
      if (!std::exchange(*fired, true)) before_backward(unit);
    });
  }
}

void Stage3Runtime::before_backward(size_t unit) {
  in_backward_ = true;
  use(unit, Phase::Backward);
  state_[group_of(unit)].awaiting_grads = true;
}

void Stage3Runtime::on_grads_complete(size_t group) {
  state_[group].awaiting_grads = false;
  release(group, /*to_next_gather=*/true);
}

void Stage3Runtime::after_backward(bool keep_awaited) {
  for (size_t i = 0; i < groups_.size(); ++i) {
    auto& s = state_[i];
    if (!keep_awaited) s.awaiting_grads = false;
    s.prefetched = false;
    if (!s.awaiting_grads) release(i);
  }
  drop_held();
  schedule_.end_step();
  in_backward_ = false;
  drop_secondaries();  // the next forward takes fresh ones
}

void Stage3Runtime::reset_after_error() {
  for (size_t i = 0; i < groups_.size(); ++i) {
    auto& s = state_[i];
    s.awaiting_grads = s.prefetched = false;
    s.in_forward = 0;
    if (s.residency != Residency::Gathering) release(i);  // a gather still in flight keeps its buffer
  }
  drop_held();
  in_backward_ = false;
  schedule_.reset_position();
  drop_secondaries();
}

void Stage3Runtime::after_step() {
  drop_secondaries();
  drop_held();
  for (size_t i = 0; i < groups_.size(); ++i) {
    state_[i].awaiting_grads = false;
    release(i);  // no-op for persistent and pinned groups
  }
  std::vector<comm::WorkHandle> works;
  std::vector<size_t> paged_in;  // offload_param nvme: shards read in for these gathers
  for (size_t i = 0; i < groups_.size(); ++i)
    if (state_[i].persistent || state_[i].pinned) {
      if (opts_.param_swap) opts_.param_swap->acquire(groups_[i]), paged_in.push_back(i);
      works.push_back(launch_gather(i, std::nullopt));
    }
  for (auto& w : works) w->wait();
  for (size_t i : paged_in) opts_.param_swap->release(groups_[i], /*dirty=*/false);
}

}  // namespace zero
