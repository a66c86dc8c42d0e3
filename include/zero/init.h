/// @file
/// zero::Init: build a model that never exists whole on one rank (as
/// DeepSpeed's zero.Init). Inside the scope, each zero::Unit is sharded the
/// moment it is constructed: its params are flattened, synced from rank 0
/// (so all ranks start identical whatever their seeds), and only this rank's
/// shard is kept. Building a model then peaks at about one unit's full params
/// plus the shards, not the model. Params outside units (the root) are built
/// normally. Pass the model to a stage-3 zero::Engine on the same group.
///
///   {
///     zero::Init init(*world, config);
///     model = GPT(cfg);
///   }
///   zero::Engine engine(*model, config, *world);
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <c10/core/Device.h>

#include "zero/comm.h"
#include "zero/config.h"
#include "zero/unit.h"

namespace zero {

namespace detail {
/// An init a module deferred (zero::defer_init): the module, the params and
/// buffers it had then (held, so that a module found later at its address
/// is known to be it), and the init.
struct DeferredInit {
  torch::nn::Module* module;
  std::vector<at::Tensor> tensors;
  std::function<void()> init;
};
}  // namespace detail

/// A scope in which stage-3 units are sharded as they are built, so a model too large for one rank never exists whole there (DeepSpeed's zero.Init): each unit is broadcast from rank 0 and sharded the moment its constructor returns. Make the Engine with the same config afterwards; it adopts the shards.
class Init {
 public:
  /// Below stage 3 the scope does nothing (params are whole on every rank
  /// there), so the same program runs at every stage.
  /// `device`: where the shards (and the units' buffers, released) go. A
  /// unit is built on the host by its constructor, then flattened on the
  /// device if it has room for it, else in pinned host memory with only the
  /// shard moved (DeepSpeed's on-device flatten; never the model twice).
  /// Move the rest of the model (its root) to the device before the engine.
  Init(World& world, const Config& config, at::Device device = at::kCPU);
  /// The same with an explicit data-parallel group (the Engine's other constructor).
  Init(comm::Comm& comm, std::shared_ptr<comm::Group> dp, const Config& config, at::Device device = at::kCPU);
  ~Init();
  Init(const Init&) = delete;
  Init& operator=(const Init&) = delete;

  int64_t units_sharded() const { return units_sharded_; }  ///< units sharded in this scope so far
  /// On a device: how many units were flattened there, and how many in
  /// pinned host memory for want of room.
  int64_t units_flattened_on_device() const { return units_flattened_on_device_; }
  int64_t units_flattened_on_host() const { return units_flattened_on_host_; }  ///< (see units_flattened_on_device)

 private:
  friend void detail::on_unit_constructed(UnitBase&);
  Init(comm::Comm& comm, std::shared_ptr<comm::Group> owner, const comm::Group& dp, const Config& config,
       at::Device device);
  void shard(UnitBase& unit, const std::vector<detail::DeferredInit>& deferred);
  void flatten_onto_device(partition::FlatGroup& g, const partition::InPlaceInit& init);

  comm::Comm& comm_;
  std::shared_ptr<comm::Group> dp_owner_;
  const comm::Group& dp_;
  Init* previous_;
  std::shared_ptr<void> page_backed_;  ///< memory::PageBackedScope for the scope's lifetime
  at::Device device_;
  int64_t units_sharded_ = 0;
  int64_t units_flattened_on_device_ = 0, units_flattened_on_host_ = 0;
  bool inactive_ = false;  ///< below stage 3
};

/// Deferred init: FSDP2's meta-device `to_empty` + `reset_parameters`, for
/// C++ modules (issue 36 item 4). Call it in a module's constructor, after
/// registering its params, in place of drawing them: `init` must set, in
/// place and under no-grad, every trainable param of `module`'s subtree but
/// those of units nested in it (stock children included: call their
/// reset_parameters()); the params should have been made with at::empty
/// (never written: no host page is touched). Buffers and frozen params keep
/// what the constructor gave them unless `init` sets them too. Inside a
/// zero::Init scope at stage 3, while a zero::Unit is being built (or built
/// as the argument of one), `init` runs once that unit is, its params
/// already views of its flat buffer on the scope's device -- on a GPU the
/// draws are the device's and nothing of the unit is written on the host
/// (where the device has no room for the unit, in its pinned host buffer:
/// drawn there) -- before rank 0's values are broadcast. Anywhere else --
/// no scope, below stage 3, outside every unit (the root), a module with
/// no params or buffers, ZERO_INIT_DEFER=off -- `init` runs at once. A
/// module that defers must be registered in the unit being built and live
/// in it (zero::Init names it otherwise). Values drawn on a device differ
/// from the host's (another generator); their distribution does not.
void defer_init(torch::nn::Module& module, std::function<void()> init);

}  // namespace zero
