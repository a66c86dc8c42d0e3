// Engine::Impl: the engine's state and its orchestration -- which groups
// reduce when, the accumulation boundary, the step, the guards -- shared by
// the engine's translation units (engine.cpp: construction, backward, step,
// accessors, checkpoints; gathered_params.cpp: gathered scopes and the
// state dict). The jobs it delegates live behind their own interfaces:
// grouping (engine/grouping.h), the flat optimizer (engine/flat_optimizer.h),
// grad reduction (zero/grad_reducer.h), the stage-3 runtime (zero/stage3.h),
// checkpoints (engine/checkpoint.h). What differs by stage is asked of the
// StagePolicy (zero/stage_policy.h).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/DeviceGuard.h>

#include "common/guard_device.h"
#include "engine/checkpoint.h"
#include "engine/flat_optimizer.h"
#include "engine/grouping.h"
#include "engine/module_state.h"
#include "engine/precision.h"
#include "engine/state_offload.h"
#include "engine/training_log.h"
#include "zero/engine.h"
#include "zero/grad_reducer.h"
#include "zero/stage3.h"
#include "zero/stage_policy.h"

namespace zero {

namespace offload {
class ParamSwap;
class GradSwap;
}

// A master value set while the master is the params' memory (fp32):
// `values` for elements [first, first + values.numel()) of param `param` of
// flat group `group` (Engine::Impl::pending_masters).
struct PendingMasterWrite {
  size_t group = 0, param = 0;
  int64_t first = 0;
  at::Tensor values;  // fp32, flat
};

struct Engine::Impl {
  Impl(torch::nn::Module& model, const Config& c, comm::Comm& cm, std::shared_ptr<comm::Group> owner,
       const comm::Group& group, const std::vector<ParamGroup>& param_groups);
  ~Impl();
  Impl(const Impl&) = delete;  // `groups` refers into `model`
  Impl& operator=(const Impl&) = delete;

  Config config;
  BatchConfig batch;
  comm::Comm& comm;
  std::shared_ptr<comm::Group> dp_owner;
  const comm::Group& dp;
  StagePolicy policy;
  // Where the model's params and buffers live, and everything the engine
  // allocates for them. Each public entry holds a guard for it
  // (common/guard_device.h): the caller's current device may be another.
  at::Device device;
  std::optional<c10::OptionalDeviceGuard> on_device_while_building;  // construction only (reset at its end)
  Precision precision;  // storage, compute and grad dtypes (engine/precision.h)
  TrainingLog training_log;  // progress lines, timers, csv_monitor (engine/training_log.h)
  std::chrono::steady_clock::time_point forward_started;
  // The losses given to backward() since the last report, summed where they
  // live (no host sync per backward), read once per report.
  at::Tensor logged_loss_sum;
  int64_t logged_losses = 0;
  int64_t tokens_unreported = 0;  // this rank's, since the last report
  int64_t global_tokens = 0;      // all ranks', reported so far
  FlatOptimizer optimizer;
  ModelGroups model;  // the flat groups, and what grouping learned of the model
  std::vector<partition::FlatGroup>& groups;  // = model.groups
  std::vector<ReplicatedTensor> replicated;   // frozen params and buffers
  // Grads on NVMe (offload_optimizer "nvme", stages 2/3, a host model):
  // before the reducer, which uses it, so it is destroyed after.
  std::unique_ptr<offload::GradSwap> grad_swap;
  std::shared_ptr<GradReducer> reducer;
  // offload_param.device "nvme": the param shards' swap file (before stage3,
  // which uses it, so it is destroyed after).
  std::unique_ptr<offload::ParamSwap> param_swap;
  std::unique_ptr<Stage3Runtime> stage3;      // with policy.shard_params only
  StateOffload offloaded;  // offload_states(): the device buffers now in host memory

  // The training loop's state.
  int64_t micro_steps = 0;
  // The step tag of the dp group's collectives (comm Group::set_step):
  // forwards and backwards begun since the last optimizer step, counting a
  // forward abandoned by an exception (its batch is gone) -- so a rank whose
  // loop skipped a batch carries another tag than its peers from then on.
  int64_t attempts = 0;
  bool forward_open = false;  // a training engine.forward() began; its backward has not
  bool scaled_loss_given = false;  // scale() handed out an fp16-scaled loss its plain backward runs from
  void tag_collectives();     // the dp group's tag: (steps taken, attempts)
  void begin_attempt(bool from_forward);
  std::optional<bool> boundary_override;  // set_gradient_accumulation_boundary
  bool no_sync = false;
  bool coalescing = false;  // inside coalesce_grad_reduction()
  int gathered_scopes = 0;  // gathered_parameters() guards alive
  // A plain loss.backward() in progress (engine.cpp): held by its queued
  // end; expired with the end unrun, the backward died.
  std::weak_ptr<void> implicit_alive;
  // A load_checkpoint/load_weights failed after some ranks had overwritten
  // their state: training on would mix old and new shards.
  std::string state_lost;
  // A guard's destructor could not finish its collective (it may not throw):
  // the next backward(), step() or save reports it, once.
  std::string deferred_error;

  // The library's own messages: one line on stderr, from the group's rank 0.
  void log(const std::string& line) const;
  // Throws if a failed load left the ranks' state inconsistent, if states
  // are offloaded (offload_states), or (once) if a guard's destructor failed.
  void check_usable();
  void check_no_gathered_scope(const char* what) const;
  // The reduced grads are readable (state_access.cpp): at a boundary, after
  // its backward's reduction, outside no_sync and coalescing, not on NVMe.
  void check_grads_reduced(const std::string& what);
  // What every accessor of a param's `kind` of state checks first, `what`
  // naming the call in its errors: the engine usable, the grads reduced
  // where it reads or writes them; returns the trainable param's group and
  // index there (state_access.cpp).
  std::pair<const partition::FlatGroup*, size_t> begin_state_access(const std::string& what, const std::string& kind,
                                                                    const std::string& name);
  // set_state of a master that is the params themselves (fp32): as
  // DeepSpeed's, the params take it at the next step, so the value waits
  // here and the getters read through it. Applied by the next step (before
  // its update) or save_checkpoint; dropped by a load.
  std::vector<PendingMasterWrite> pending_masters;
  void apply_pending_masters();

  bool boundary() const;
  // Sharded grads reduce every backward, unless the caller coalesces.
  bool reduce_this_backward() const;
  // The end of a backward begun by engine.backward() or by a grad arriving
  // from a plain loss.backward(). An implicit end keeps the stage-3 units
  // whose grads are still awaited: a reentrant backward other than
  // zero::checkpoint_activations' (nested_backward.h) may end it before the
  // enclosing one is done.
  void end_backward(bool implicit_end = false);
  float implicit_backward();
  // A backward that threw inside autograd never reached its end (a plain
  // loss.backward() has no place to catch it): drop what it left behind.
  void recover_if_backward_failed();

  bool step();
  // After an optimizer step (taken or skipped): the log's progress line,
  // timers and csv rows; the loss mean over ranks when one is due (collective).
  void report_step(bool stepped);
  // Every rank's params show the masters' values (after a load or a write-back).
  void params_from_masters();
  // DDP's broadcast_buffers, at each step boundary.
  void sync_buffers();
  StateBytes state_bytes() const;
  CheckpointTarget checkpoint_target();
};

}  // namespace zero
