#include "zero/stage3.h"

#include <algorithm>

#include <ATen/core/grad_mode.h>

#include "memory/page_buffer.h"

namespace zero {

Stage3Runtime::Stage3Runtime(std::vector<partition::FlatGroup>& groups, std::vector<bool> persistent,
                             std::vector<size_t> unit_to_group, std::vector<std::string> unit_names,
                             comm::Comm& comm, const comm::Group& dp, Stage3Options opts)
    : groups_(groups), persistent_(std::move(persistent)), unit_to_group_(std::move(unit_to_group)),
      unit_names_(std::move(unit_names)), comm_(comm), dp_(dp), opts_(opts), gathered_(persistent_),
      inflight_(groups.size()), in_forward_(groups.size(), 0), awaiting_grads_(groups.size(), false),
      prefetched_(groups.size(), false), pinned_(groups.size(), 0), labels_(groups.size()) {
  // Each gather's label names its unit: ranks whose unit orders diverge get
  // an error naming both units at the first gather that differs.
  for (size_t u = 0; u < unit_to_group_.size(); ++u) {
    auto& label = labels_[unit_to_group_[u]];
    label += (label.empty() ? "params of unit '" : ", '") + unit_names_[u] + "'";
  }
  for (size_t i = 0; i < groups_.size(); ++i) {
    if (labels_[i].empty()) labels_[i] = "params of the root unit";
    if (!persistent_[i]) name_released_contents(i);
  }
}

void Stage3Runtime::name_released_contents(size_t i) {
  const auto& g = groups_[i];
  const size_t elem = g.param_flat.element_size();
  std::vector<memory::NamedRange> ranges;
  for (size_t p = 0; p < g.params.size(); ++p)
    ranges.push_back({static_cast<size_t>(g.layout.params[p].offset) * elem,
                      static_cast<size_t>(g.layout.params[p].numel) * elem,
                      "stage 3: param '" + g.names[p] + "' (" + labels_[i].substr(10) + ")"});
  memory::name_released_contents(
      g.param_flat, std::move(ranges),
      "between uses only this rank's shard of it exists. Read or change full params inside "
      "engine.gathered_parameters(...); save them with engine.state_dict() or engine.save_weights(); and a "
      "param that code outside its unit uses must be registered in that code's module too (it then stays "
      "gathered). After its engine is destroyed a stage-3 model's units stay released: take "
      "engine.state_dict() first. See docs/troubleshooting.md.");
}

void Stage3Runtime::pin(size_t i) {
  gather(i);
  ++pinned_[i];
}

void Stage3Runtime::unpin(size_t i) {
  if (pinned_[i] > 0 && --pinned_[i] == 0) release(i);
}

bool Stage3Runtime::any_pinned() const {
  return std::any_of(pinned_.begin(), pinned_.end(), [](int n) { return n > 0; });
}

template <typename F>
void Stage3Runtime::naming_divergence(size_t unit, Phase phase, F&& gathers) {
  try {
    gathers();
  } catch (const comm::CollectiveMismatch& e) {
    throw comm::CollectiveMismatch(
        "stage 3: the ranks of " + dp_.describe() + " run their units in different orders (every rank must call "
        "the same units in the same order); this rank was at use #" + std::to_string(position_ + 1) +
        " of its step, the " + (phase == Phase::Forward ? "forward" : "backward") + " of unit '" +
        unit_names_[unit] + "': " + e.what());
  }
}

void gather_params(const partition::FlatGroup& g, comm::Comm& comm, const comm::Group& dp, const std::string& label) {
  partition::restore_params(g);
  comm.all_gather(dp, g.param_flat, g.param_shard, label)->wait();
}

void Stage3Runtime::start_gather(size_t i) {
  auto& g = groups_[i];
  partition::restore_params(g);
  inflight_[i] = comm_.all_gather(dp_, g.param_flat, g.param_shard, labels_[i]);
  gathered_[i] = true;
  live_ += g.layout.padded_numel;
  if (!in_backward_) peak_live_forward_ = std::max(peak_live_forward_, live_);
}

void Stage3Runtime::evict_for(int64_t need) {
  for (size_t i = 0; i < groups_.size() && live_ + need > opts_.max_live_parameters; ++i)
    if (gathered_[i] && !persistent_[i] && in_forward_[i] == 0 && !awaiting_grads_[i] && !prefetched_[i])
      release(i);
}

void Stage3Runtime::gather(size_t i) {
  if (!gathered_[i]) {
    evict_for(groups_[i].layout.padded_numel);
    start_gather(i);
  }
  prefetched_[i] = false;
  if (inflight_[i]) {
    inflight_[i]->wait();  // on failure the handle stays: release() will not free a buffer still written
    inflight_[i] = nullptr;
  }
}

void Stage3Runtime::release(size_t i) {
  if (!gathered_[i] || persistent_[i] || pinned_[i]) return;
  if (inflight_[i]) gather(i);  // never free a buffer a collective is writing
  partition::release_params(groups_[i]);
  gathered_[i] = false;
  live_ -= groups_[i].layout.padded_numel;
}

void Stage3Runtime::use(size_t unit, Phase phase) {
  const size_t g = group_of(unit);
  if (recording_) {
    trace_.push_back({unit, phase});
  } else if (on_trace_ && (position_ >= trace_.size() || trace_[position_].unit != unit ||
                           trace_[position_].phase != phase)) {
    on_trace_ = false;  // the order changed this step: gather on demand only
  }
  naming_divergence(unit, phase, [&] {
    gather(g);
    if (!recording_ && on_trace_) prefetch_after(position_ + 1);
  });
  ++position_;
}

void Stage3Runtime::prefetch_after(size_t position) {
  int64_t in_flight = 0;
  for (size_t i = 0; i < groups_.size(); ++i)
    if (inflight_[i]) in_flight += groups_[i].layout.padded_numel;
  for (size_t p = position; p < trace_.size(); ++p) {
    const size_t g = group_of(trace_[p].unit);
    if (gathered_[g]) continue;
    const int64_t n = groups_[g].layout.padded_numel;
    if (in_flight + n > opts_.prefetch_bucket_size || live_ + n > opts_.max_live_parameters) break;
    start_gather(g);
    prefetched_[g] = true;
    in_flight += n;
  }
}

bool Stage3Runtime::reused_soon(size_t unit, size_t position) const {
  // Elements gathered between now and this unit's next use in the trace.
  int64_t distance = 0;
  for (size_t p = position; p < trace_.size(); ++p) {
    if (trace_[p].unit == unit) return distance < opts_.max_reuse_distance;
    distance += numel_of_unit(trace_[p].unit);
  }
  return false;
}

void Stage3Runtime::before_forward(size_t unit) {
  if (!at::GradMode::is_enabled()) {
    // Evaluation: gather on demand, outside the recorded training schedule.
    naming_divergence(unit, Phase::Forward, [&] { gather(group_of(unit)); });
  } else {
    use(unit, Phase::Forward);
  }
  ++in_forward_[group_of(unit)];
}

void Stage3Runtime::forward_failed(size_t unit) {
  --in_forward_[group_of(unit)];
  release(group_of(unit));
}

at::Tensor Stage3Runtime::after_forward(size_t unit, const at::Tensor& out) {
  const size_t g = group_of(unit);
  --in_forward_[g];
  const bool keep = at::GradMode::is_enabled() && !recording_ && on_trace_ &&
                    live_ <= opts_.max_live_parameters && reused_soon(unit, position_);
  if (!keep) release(g);
  if (!out.requires_grad()) return out;  // no backward will come (e.g. evaluation)
  // A grad hook on the output runs before the grad flows into the unit's
  // own backward ops, which need its params. (A hook, not a wrapping
  // autograd function: the output stays a plain tensor, in-place ops on it
  // included.)
  at::Tensor hooked = out;
  hooked.register_hook([this, unit](const at::Tensor&) { before_backward(unit); });
  return hooked;
}

void Stage3Runtime::before_backward(size_t unit) {
  in_backward_ = true;
  use(unit, Phase::Backward);
  awaiting_grads_[group_of(unit)] = true;
}

void Stage3Runtime::on_grads_complete(size_t group) {
  awaiting_grads_[group] = false;
  release(group);
}

void Stage3Runtime::after_backward(bool keep_awaited) {
  if (!keep_awaited) std::fill(awaiting_grads_.begin(), awaiting_grads_.end(), false);
  std::fill(prefetched_.begin(), prefetched_.end(), false);
  for (size_t i = 0; i < groups_.size(); ++i)
    if (!awaiting_grads_[i]) release(i);
  recording_ = false;
  in_backward_ = false;
  position_ = 0;
  on_trace_ = true;
}

void Stage3Runtime::reset_after_error() {
  std::fill(awaiting_grads_.begin(), awaiting_grads_.end(), false);
  std::fill(prefetched_.begin(), prefetched_.end(), false);
  std::fill(in_forward_.begin(), in_forward_.end(), 0);
  for (size_t i = 0; i < groups_.size(); ++i)
    if (!inflight_[i]) release(i);  // a gather still in flight keeps its buffer
  in_backward_ = false;
  position_ = 0;
  on_trace_ = true;
}

void Stage3Runtime::after_step() {
  std::fill(awaiting_grads_.begin(), awaiting_grads_.end(), false);
  for (size_t i = 0; i < groups_.size(); ++i) release(i);  // no-op for persistent groups
  std::vector<comm::WorkHandle> works;
  for (size_t i = 0; i < groups_.size(); ++i)
    if (persistent_[i] || pinned_[i])
      works.push_back(comm_.all_gather(dp_, groups_[i].param_flat, groups_[i].param_shard, labels_[i]));
  for (auto& w : works) w->wait();
}

}  // namespace zero
