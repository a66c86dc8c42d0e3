#include "offload/grad_swap.h"

#include <exception>
#include <stdexcept>
#include <utility>

namespace zero::offload {

GradSwap::GradSwap(SwapperOptions options) {
  options.config_key = "zero_optimization.offload_optimizer";
  options.what = "reduced grads";
  options.file_tag = "grad";
  // A shard's write overlaps the next group's backward.
  options.pipeline_write = true;
  swapper_ = std::make_unique<StateSwapper>(std::move(options));
}

void GradSwap::adopt(size_t group, const at::Tensor& shard, const std::string& label) {
  if (group != slots_.size()) throw std::logic_error("GradSwap::adopt: groups out of order");
  slots_.push_back(swapper_->adopt_empty({shard}, label));
  norms_.push_back(0.0f);
  held_.push_back(false);
}

void GradSwap::hold_for_reduction(size_t group, bool keep) {
  if (held_.at(group)) return;  // a second launch before reduced(): still held
  swapper_->acquire(slots_[group], keep ? StateSwapper::Contents::Read : StateSwapper::Contents::Overwrite);
  held_[group] = true;
}

void GradSwap::prefetch(size_t group) { swapper_->prefetch(slots_.at(group)); }

void GradSwap::reduced(size_t group, const at::Tensor& shard) {
  if (!held_.at(group)) throw std::logic_error("GradSwap::reduced: the shard was not held");
  // As FlatOptimizer::global_sumsq takes it from a shard in memory: at::norm in fp32.
  norms_[group] = at::norm(shard).item<float>();
  held_[group] = false;
  swapper_->release(slots_[group], /*dirty=*/true);
}

void GradSwap::acquire(size_t group) {
  if (held_.at(group)) throw std::logic_error("GradSwap::acquire: the shard is held already");
  swapper_->acquire(slots_[group]);
  held_[group] = true;
}

void GradSwap::release(size_t group) {
  if (!held_.at(group)) throw std::logic_error("GradSwap::release: the shard was not acquired");
  held_[group] = false;
  swapper_->release(slots_[group], /*dirty=*/false);
}

void GradSwap::flush() { swapper_->flush(); }

void GradSwap::discard_all() {
  std::exception_ptr first;  // every slot is tried; the first failure is reported
  for (size_t i = 0; i < slots_.size(); ++i) {
    norms_[i] = 0.0f;
    try {
      if (held_[i]) {
        held_[i] = false;
        swapper_->release(slots_[i], /*dirty=*/false);
      }
      swapper_->discard(slots_[i]);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace zero::offload
