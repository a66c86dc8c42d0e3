// DeepSpeed's offload_states / reload_states (engine.offload_states()): the
// engine's buffers on a device moved into host memory between phases of a
// job that needs the device for something else (RLHF's generation with
// another model, evaluation of a large one), and brought back before
// training goes on.
//
// A moved buffer keeps its identity: its contents go into a host copy
// (pinned, so the way back is a DMA), and its storage hands its device block
// back to the allocator (memory/storage_release.h), so the params and
// grads, views of it, see the same bytes once it is restored. Buffers
// already in host memory (a CPU engine, offload_optimizer "cpu") and stage
// 3's released buffers stay as they are: there is nothing to move.
//
// The kinds are DeepSpeed's OffloadStateTypeEnum: optim_states (the
// optimizer's moments), hp_params (fp32 master weights apart from the
// params), lp_params (the flat params and stage 3's shards), lp_grads (the
// reduced grad shards), contiguous_grad_buffer (the flat grads backward
// writes). Copies are synchronous (DeepSpeed's non_blocking is accepted by
// the Python front end and does nothing more).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "partition/flat_group.h"

namespace zero {

enum class StateKind { OptimStates, HpParams, LpParams, LpGrads, ContiguousGradBuffer };

// DeepSpeed's name of each kind, and the kind of a name (std::invalid_argument
// naming the known ones for another).
const char* state_kind_name(StateKind k);
StateKind state_kind_from_name(const std::string& name);
std::set<StateKind> all_state_kinds();

class StateOffload {
 public:
  // Moves the device buffers of `kinds` not moved yet into host memory;
  // returns the device bytes given back.
  int64_t offload(const std::vector<partition::FlatGroup>& groups, const std::set<StateKind>& kinds, bool pin_memory);
  // Brings every moved buffer back, its contents as they were.
  void reload();
  // Kinds offloaded and not reloaded -- on a CPU engine too, where nothing
  // moved: a script that forgets reload_states() fails on every device alike.
  bool any() const { return !kinds_.empty(); }
  // Those kinds, by DeepSpeed's names ("optim_states, lp_grads").
  std::string describe() const;

 private:
  struct Moved {
    at::Tensor whole;  // bytes over the buffer's whole storage, on the device
    at::Tensor host;   // its contents while moved
  };
  std::vector<Moved> moved_;
  std::set<StateKind> kinds_;
};

}  // namespace zero
