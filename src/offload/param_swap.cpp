#include "offload/param_swap.h"

#include <atomic>
#include <cstdint>
#include <string>

#include "zero/config.h"

namespace zero::offload {

namespace {
std::atomic<int64_t> g_gathers_through_pinned_staging{0};
}  // namespace

int64_t gathers_through_pinned_staging() { return g_gathers_through_pinned_staging.load(); }

ParamSwap::ParamSwap(ParamSwapOptions options) : options_(std::move(options)) {
  options_.swapper.config_key = "zero_optimization.offload_param";
  options_.swapper.what = "param shard";
  // Its writes (after a step's update) finish during the next group's update.
  options_.swapper.pipeline_write = true;
  // Opened now, whatever stays in memory: a bad nvme_path is named at once.
  swapper_ = std::make_unique<StateSwapper>(options_.swapper);
  if (options_.pinned_staging) staging_ = std::make_unique<ShardStaging>(*swapper_, options_.buffer_count);
}

ParamSwap::~ParamSwap() = default;

void ParamSwap::adopt(const partition::FlatGroup& g) {
  const at::Tensor& shard = g.param_shard;
  if (!shard.defined()) return;
  const std::string label =
      "group '" + g.names.front() + "' (" + std::to_string(g.params.size()) + " params)";
  if (shard.numel() > options_.buffer_size)
    throw ConfigError("ds_config: zero_optimization.offload_param.buffer_size = " +
                      std::to_string(options_.buffer_size) + " elements, but the param shard of " + label +
                      " has " + std::to_string(shard.numel()) +
                      "; raise buffer_size to at least that (each shard is read and written whole)");
  if (kept_in_memory_ + shard.numel() <= options_.max_in_cpu) {
    kept_in_memory_ += shard.numel();  // max_in_cpu: stays in memory
    return;
  }
  const int slot = swapper_->adopt({shard}, label);
  slot_by_shard_[shard.data_ptr()] = slot;
  if (staging_) staging_->reserve(swapper_->copy_bytes(slot));
}

int ParamSwap::slot_of(const partition::FlatGroup& g) const {
  if (!g.param_shard.defined()) return -1;
  const auto it = slot_by_shard_.find(g.param_shard.data_ptr());
  return it == slot_by_shard_.end() ? -1 : it->second;
}

void ParamSwap::prefetch(const partition::FlatGroup& g) {
  if (const int slot = slot_of(g); slot >= 0) swapper_->prefetch(slot);
}

void ParamSwap::read_ahead_for_gather(const partition::FlatGroup& g) {
  const int slot = slot_of(g);
  if (slot < 0) return;
  if (staging_)
    staging_->stage(slot);  // nothing if no buffer is free or the shard is in memory
  else
    swapper_->prefetch(slot);
}

std::optional<at::Tensor> ParamSwap::upload_for_gather(const partition::FlatGroup& g, at::Device device) {
  const int slot = slot_of(g);
  if (!staging_ || slot < 0) return std::nullopt;
  auto up = staging_->upload(slot, g.param_shard.scalar_type(), g.param_shard.numel(), device);
  if (up) g_gathers_through_pinned_staging.fetch_add(1, std::memory_order_relaxed);
  return up;
}

void ParamSwap::acquire(const partition::FlatGroup& g, bool overwrite) {
  if (const int slot = slot_of(g); slot >= 0) {
    if (staging_) staging_->drop(slot);  // its read must end before a write-back can follow
    swapper_->acquire(slot, overwrite ? StateSwapper::Contents::Overwrite : StateSwapper::Contents::Read);
  }
}

void ParamSwap::release(const partition::FlatGroup& g, bool dirty) {
  if (const int slot = slot_of(g); slot >= 0) swapper_->release(slot, dirty);
}

void ParamSwap::flush() { swapper_->flush(); }

bool ParamSwap::room_to_read_ahead() const {
  return swapper_->resident_slots() + (staging_ ? staging_->busy() : 0) < options_.buffer_count;
}

}  // namespace zero::offload
