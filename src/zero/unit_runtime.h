// What a zero::Unit reports its forward to (the stage-3 runtime), and how
// the engine and zero::Init reach a unit's internals. Private to the
// library: user code sees neither (include/zero/unit.h only declares them).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "zero/unit.h"

namespace zero::detail {

class UnitRuntime {
 public:
  virtual ~UnitRuntime() = default;
  virtual void before_forward(size_t unit) = 0;
  // Returns `out`, with a hook that regathers the unit before its backward.
  virtual at::Tensor after_forward(size_t unit, const at::Tensor& out) = 0;
  // The same for a forward with several outputs (a tuple, a dict): each one
  // that requires grad is hooked in place, and the first of them whose grad
  // arrives regathers the unit, once for this forward call.
  virtual void after_forward(size_t unit, const std::vector<at::Tensor>& outs) = 0;
  // The wrapped forward threw: undo before_forward.
  virtual void forward_failed(size_t unit) = 0;
};

// A unit's params and buffers that no unit nested in it holds (names
// relative to the unit): what zero::Init shards and syncs for it. Units may
// nest (an outer unit holds what its inner units do not, as nested FSDP2
// fully_shard calls).
std::vector<std::pair<std::string, at::Tensor>> own_parameters(torch::nn::Module& unit);
std::vector<at::Tensor> own_buffers(torch::nn::Module& unit);

struct UnitAccess {
  // A null runtime makes the unit a pass-through.
  static void attach(UnitBase& u, UnitRuntime* runtime, size_t index) {
    u.runtime_ = runtime;
    u.index_ = index;
  }
  static std::shared_ptr<partition::FlatGroup> take_sharded_at_init(UnitBase& u) {
    return std::move(u.sharded_at_init_);
  }
  static void set_sharded_at_init(UnitBase& u, std::shared_ptr<partition::FlatGroup> g) {
    u.sharded_at_init_ = std::move(g);
  }
  static bool synced_at_init(const UnitBase& u) { return u.synced_at_init_; }
  static void set_synced_at_init(UnitBase& u) { u.synced_at_init_ = true; }
  static UnitRuntime* runtime(const UnitBase& u) { return u.runtime_; }
  static size_t index(const UnitBase& u) { return u.index_; }
};

}  // namespace zero::detail
