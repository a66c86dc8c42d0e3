/// @file
/// zero::Unit<M>: the one change stage 3 asks of a model. Declare the
/// sub-modules that should be gathered and released as a whole (e.g. each
/// transformer block) as zero::Unit<Block> instead of Block:
///
///   std::vector<zero::Unit<Block>> blocks;
///   blocks.push_back(register_module("h0", zero::Unit<Block>(cfg)));
///   x = blocks[0]->forward(x);
///
/// Under a stage-3 engine a unit gathers its params before its forward (or
/// waits for their prefetch), releases them after, and gathers them again
/// before its backward (a hook on its output, so the unit's forward must
/// return the one tensor its backward starts from). Under stages 0-2, or
/// with no engine, it is a plain pass-through to the wrapped module. Params
/// outside every unit (embeddings, final norm, head) form the root unit,
/// which stays gathered unless the model's forward runs inside
/// engine.forward(...) (zero/engine.h): then it is gathered around that
/// forward and its backward like a unit.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace zero {

namespace partition {
struct FlatGroup;
struct InPlaceInit;
}

class UnitBase;

namespace detail {
/// Shards a just-built unit when a zero::Init scope is active (zero/init.h).
void on_unit_constructed(UnitBase& unit);
/// While a zero::Unit is built: the frame its modules' deferred inits go
/// to (zero::defer_init, zero/init.h), opened before the wrapped module is
/// built and closed by on_unit_constructed -- or, if the build throws, by
/// this going first.
class BuildingUnit {
 public:
  explicit BuildingUnit(UnitBase& unit);
  ~BuildingUnit();
  BuildingUnit(const BuildingUnit&) = delete;
  BuildingUnit& operator=(const BuildingUnit&) = delete;

 private:
  UnitBase* unit_;
};
class UnitRuntime;   ///< the stage-3 runtime a unit reports its forward to (internal)
struct UnitAccess;   ///< how the engine and zero::Init reach a unit's internals (internal)
}  // namespace detail

/// What every zero::Unit is, whatever it wraps: a torch::nn::Module the engine gathers and releases as a whole at stage 3.
class UnitBase : public torch::nn::Module {
 public:
  /// The wrapped module (its params are the unit's).
  virtual torch::nn::Module& inner_module() = 0;

 protected:
  /// Registers the wrapped module's params, buffers and submodules as the
  /// unit's own, under their own names: a unit registered as "h0" names its
  /// block's params "h0.fc.weight", exactly as the plain model does (not
  /// "h0.inner.fc.weight"), so checkpoints and state dicts match the
  /// unsharded model and its Python twin. What the wrapped module registers
  /// after construction is not seen.
  void adopt_members(torch::nn::Module& inner);
  /// The wrapped forward, bracketed for the stage-3 runtime (zero/unit.cpp):
  /// enter gathers (or waits for a prefetch), leave releases and hooks the
  /// output so its backward regathers first, failed undoes enter.
  bool managed() const { return runtime_ != nullptr; }
  /// Gathers the unit's params before its forward (stage 3).
  void enter_forward();
  /// Releases them after its forward and hooks `out` so backward regathers them.
  at::Tensor leave_forward(const at::Tensor& out);
  /// The same for a forward with several outputs: every one that requires
  /// grad is hooked in place; the first whose grad arrives regathers.
  void leave_forward(const std::vector<at::Tensor>& outs);
  /// Undoes enter_forward() when the wrapped forward throws.
  void forward_failed();

 private:
  friend struct detail::UnitAccess;
  detail::UnitRuntime* runtime_ = nullptr;  ///< null: a pass-through
  size_t index_ = 0;
  /// zero::Init sharded the unit at construction: its flat group holding
  /// this rank's shard only, adopted by the engine.
  std::shared_ptr<partition::FlatGroup> sharded_at_init_;
  bool synced_at_init_ = false;  ///< zero::Init synced its frozen params and buffers
};

template <typename Holder>
/// The module a zero::Unit<Holder> holds: it wraps one module (a ModuleHolder such as torch::nn::Linear or your Block) and forwards to it, gathering around the call at stage 3.
class UnitImpl : public UnitBase {
  detail::BuildingUnit building_{*this};  ///< before `inner`: open while it is built

 public:
  template <typename... Args>
  /// Builds the wrapped module from `args` and adopts its members; inside a zero::Init scope, shards it.
  explicit UnitImpl(Args&&... args) : inner(std::forward<Args>(args)...) {
    adopt_members(*inner);
    detail::on_unit_constructed(*this);
  }

  /// Sets training mode on the unit and the wrapped module.
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    inner->train(on);  // the wrapped module's own flag (its children are the unit's)
  }

  template <typename... Args>
  /// The wrapped module's forward, gathered around at stage 3 (a plain call otherwise). Must return the one tensor its backward starts from.
  at::Tensor forward(Args&&... args) {
    if (!managed()) return inner->forward(std::forward<Args>(args)...);
    enter_forward();
    at::Tensor out;
    try {
      out = inner->forward(std::forward<Args>(args)...);
    } catch (...) {
      forward_failed();
      throw;
    }
    return leave_forward(out);
  }

  torch::nn::Module& inner_module() override { return *inner; }

  Holder inner;  ///< the wrapped module
};

template <typename Holder>
/// `zero::Unit<Block>` in place of `Block` marks a stage-3 unit (see the file's description).
using Unit = torch::nn::ModuleHolder<UnitImpl<Holder>>;

}  // namespace zero
