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

#include <memory>

#include <c10/core/Device.h>

#include "zero/comm.h"
#include "zero/config.h"
#include "zero/unit.h"

namespace zero {

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
  void shard(UnitBase& unit);
  void flatten_onto_device(partition::FlatGroup& g);

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

}  // namespace zero
