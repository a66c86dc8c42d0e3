#include "zero/stage3.h"

#include <ATen/core/grad_mode.h>
#include <ATen/native/Resize.h>

namespace zero {

namespace {

void resize_storage(const at::Tensor& t, size_t bytes) {
  at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(), bytes);
}

}  // namespace

Stage3Runtime::Stage3Runtime(std::vector<partition::FlatGroup>& groups, std::vector<bool> persistent,
                             std::vector<size_t> unit_to_group, std::vector<std::string> unit_names,
                             comm::Comm& comm, const comm::Group& dp, Stage3Options opts)
    : groups_(groups), persistent_(std::move(persistent)), unit_to_group_(std::move(unit_to_group)),
      unit_names_(std::move(unit_names)), comm_(comm), dp_(dp), opts_(opts), gathered_(persistent_),
      inflight_(groups.size()), in_forward_(groups.size(), 0), awaiting_grads_(groups.size(), false),
      prefetched_(groups.size(), false) {}

void Stage3Runtime::release_storage(partition::FlatGroup& g) { resize_storage(g.param_flat, 0); }

void Stage3Runtime::fill_from_shards(partition::FlatGroup& g, comm::Comm& comm, const comm::Group& dp) {
  resize_storage(g.param_flat, g.layout.padded_numel * g.param_flat.element_size());
  comm.all_gather(dp, g.param_flat, g.param_shard)->wait();
}

void Stage3Runtime::start_gather(size_t i) {
  auto& g = groups_[i];
  resize_storage(g.param_flat, g.layout.padded_numel * g.param_flat.element_size());
  inflight_[i] = comm_.all_gather(dp_, g.param_flat, g.param_shard);
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
  if (!gathered_[i] || persistent_[i]) return;
  if (inflight_[i]) gather(i);  // never free a buffer a collective is writing
  release_storage(groups_[i]);
  gathered_[i] = false;
  live_ -= groups_[i].layout.padded_numel;
}

void Stage3Runtime::check_same_unit_on_all_ranks(size_t unit, Phase phase) {
  // Before each gather of the first step: every rank says which unit it is
  // about to gather; any difference is an error on all ranks at once.
  auto mine = at::tensor({static_cast<int64_t>(unit), static_cast<int64_t>(phase)}, at::kLong);
  auto all = at::empty({2 * dp_.size()}, at::kLong);
  comm_.all_gather(dp_, all, mine)->wait();
  auto a = all.accessor<int64_t, 1>();
  for (int r = 0; r < dp_.size(); ++r) {
    if (a[2 * r] == a[0] && a[2 * r + 1] == a[1]) continue;
    auto describe = [&](int rank) {
      const char* ph = a[2 * rank + 1] == static_cast<int64_t>(Phase::Forward) ? "forward" : "backward";
      return "rank " + std::to_string(dp_.global_ranks()[rank]) + " runs unit '" +
             unit_names_[static_cast<size_t>(a[2 * rank])] + "' (" + ph + ")";
    };
    throw comm::CommError("stage 3: the ranks of " + dp_.describe() + " run their units in different orders; at use #" +
                          std::to_string(position_ + 1) + " of the first step " + describe(0) + " but " +
                          describe(r) + ". Every rank must call the same units in the same order.");
  }
}

void Stage3Runtime::use(size_t unit, Phase phase) {
  const size_t g = group_of(unit);
  step_hash_ = step_hash_ * 1000003u + 2 * unit + static_cast<uint64_t>(phase) + 1;
  if (recording_) {
    check_same_unit_on_all_ranks(unit, phase);
    trace_.push_back({unit, phase});
  } else if (on_trace_ && (position_ >= trace_.size() || trace_[position_].unit != unit ||
                           trace_[position_].phase != phase)) {
    on_trace_ = false;  // the order changed this step: gather on demand only
  }
  gather(g);
  ++position_;
  if (!recording_ && on_trace_) prefetch_after(position_);
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
    gather(group_of(unit));
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

void Stage3Runtime::after_backward() {
  std::fill(awaiting_grads_.begin(), awaiting_grads_.end(), false);
  std::fill(prefetched_.begin(), prefetched_.end(), false);
  for (size_t i = 0; i < groups_.size(); ++i) release(i);
  if (!recording_) {
    // A rank whose order changed after the first step would pair its
    // gathers with other units' on its peers; say so instead of training on.
    const uint64_t h = step_hash_;
    auto mine = at::tensor({static_cast<int64_t>(h & 0xffffffffu), static_cast<int64_t>(h >> 32),
                            static_cast<int64_t>(position_)}, at::kLong);
    auto all = at::empty({3 * dp_.size()}, at::kLong);
    comm_.all_gather(dp_, all, mine)->wait();
    for (int r = 1; r < dp_.size(); ++r)
      if (!all.narrow(0, 3 * r, 3).equal(all.narrow(0, 0, 3)))
        throw comm::CommError("stage 3: the ranks of " + dp_.describe() +
                              " ran their units in different orders in this step (rank " +
                              std::to_string(dp_.global_ranks()[r]) + " differs from rank " +
                              std::to_string(dp_.global_ranks()[0]) +
                              "); every rank must call the same units in the same order");
  }
  recording_ = false;
  in_backward_ = false;
  position_ = 0;
  on_trace_ = true;
  step_hash_ = 0;
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
  step_hash_ = 0;
}

void Stage3Runtime::after_step() {
  for (size_t i = 0; i < groups_.size(); ++i) release(i);  // no-op for persistent groups
  std::vector<comm::WorkHandle> works;
  for (size_t i = 0; i < groups_.size(); ++i)
    if (persistent_[i]) works.push_back(comm_.all_gather(dp_, groups_[i].param_flat, groups_[i].param_shard));
  for (auto& w : works) w->wait();
}

}  // namespace zero
