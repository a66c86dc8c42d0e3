// zero::Unit<M>: the one change stage 3 asks of a model. Declare the
// sub-modules that should be gathered and released as a whole (e.g. each
// transformer block) as zero::Unit<Block> instead of Block:
//
//   std::vector<zero::Unit<Block>> blocks;
//   blocks.push_back(register_module("h0", zero::Unit<Block>(cfg)));
//   x = blocks[0]->forward(x);
//
// Under a stage-3 engine a unit gathers its params before its forward (or
// waits for their prefetch), releases them after, and gathers them again
// before its backward (a hook on its output, so the unit's forward must
// return the one tensor its backward starts from). Under stages 0-2, or with no engine, it is a plain
// pass-through to the wrapped module. Params outside every unit (embeddings,
// final norm, head) form the root unit, which stays gathered.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace zero {

namespace partition {
struct FlatGroup;
}

class UnitBase;

namespace detail {
// Shards a just-built unit when a zero::Init scope is active (zero/init.h).
void on_unit_constructed(UnitBase& unit);

// Implemented by the stage-3 runtime.
class UnitRuntime {
 public:
  virtual ~UnitRuntime() = default;
  virtual void before_forward(size_t unit) = 0;
  // Returns `out`, with a hook that regathers the unit before its backward.
  virtual at::Tensor after_forward(size_t unit, const at::Tensor& out) = 0;
  // The wrapped forward threw: undo before_forward.
  virtual void forward_failed(size_t unit) = 0;
};
}  // namespace detail

class UnitBase : public torch::nn::Module {
 public:
  // The wrapped module (its params are the unit's).
  virtual torch::nn::Module& inner_module() = 0;
  // Called by the engine; a null runtime makes the unit a pass-through.
  void attach(detail::UnitRuntime* runtime, size_t index) {
    runtime_ = runtime;
    index_ = index;
  }

  // Set when the unit was sharded at construction (inside zero::Init): its
  // flat group, holding only this rank's shard. The engine adopts it.
  std::shared_ptr<partition::FlatGroup> sharded_at_init;
  // Set when zero::Init synced the unit's frozen params and buffers from rank 0.
  bool synced_at_init = false;

 protected:
  detail::UnitRuntime* runtime_ = nullptr;
  size_t index_ = 0;
};

template <typename Holder>
class UnitImpl : public UnitBase {
 public:
  template <typename... Args>
  explicit UnitImpl(Args&&... args) : inner(register_module("inner", Holder(std::forward<Args>(args)...))) {
    detail::on_unit_constructed(*this);
  }

  template <typename... Args>
  at::Tensor forward(Args&&... args) {
    if (!runtime_) return inner->forward(std::forward<Args>(args)...);
    runtime_->before_forward(index_);
    at::Tensor out;
    try {
      out = inner->forward(std::forward<Args>(args)...);
    } catch (...) {
      runtime_->forward_failed(index_);
      throw;
    }
    return runtime_->after_forward(index_, out);
  }

  torch::nn::Module& inner_module() override { return *inner; }

  Holder inner;
};

template <typename Holder>
using Unit = torch::nn::ModuleHolder<UnitImpl<Holder>>;

}  // namespace zero
