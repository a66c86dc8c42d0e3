// Backward-time gradient reduction for stages 0/1/2 (and 3, which reduces
// as stage 2 does).
//
// Hooks on each param's AccumulateGrad node count, per flat group, the
// grads that arrived in this backward. A group whose expected arrivals are
// all in is ready; ready groups are launched strictly in group order (groups
// are in reverse registration order, which is about backward order), so
// every rank issues the same collectives in the same order even when a
// rank's unused params make a group ready late. end_backward() launches what
// is left (groups with unused params), waits, and folds the results.
//
// Arrivals per backward. A param's grad usually arrives once per backward,
// but recompute-style activation checkpointing runs a nested backward per
// checkpointed piece, so a weight used in two pieces gets two arrivals. Each
// param's expected count is learned from the previous backward (1 at first).
// A grad that arrives after its group's reduction was launched (more
// arrivals than expected) is never lost: the pre-hook waits for that
// reduction and sets the buffers up to accumulate on top, and at the end of
// the backward the ranks agree (one small all-reduce, only with
// overlap_comm) which groups to reduce again, so all issue the same
// collectives; the second reduction adds to the first. After the first step
// the learned counts make that rare.
//
// A backward that does not reduce (stages 0/1 before the boundary or under
// no_sync; any stage under coalesce_grad_reduction) leaves its grads in the
// full grad buffers, where the next backward adds to them; flush() then
// reduces everything accumulated in one pass. Reductions add into the
// shard, so several of them before a step (several backward calls at the
// boundary) sum as they should.
//
// A backward the engine did not start (a plain loss.backward()) is noticed
// at its first grad: ReducerOptions::implicit_backward lets the engine begin
// it (and arrange its end), and returns the factor the grads are scaled by
// on their way into the buffers (1 / gradient_accumulation_steps, the
// scaling engine.backward applies to the loss). It is asked again for every
// grad of such a backward, so it can follow nested (reentrant) backwards.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "memory/shared_arena.h"
#include "partition/flat_group.h"
#include "zero/comm.h"
#include "zero/stage_policy.h"

namespace torch::autograd {
struct Node;
}

namespace zero::offload {
class GradSwap;
}

namespace zero {

struct ReducerOptions {
  StagePolicy policy;
  bool overlap_comm = false;          // launch groups during backward, not after it
  bool contiguous_gradients = true;   // stage 2: grads land directly in the group buffer
  at::ScalarType grad_dtype = at::kFloat;
  // What the grads travel in: grad_dtype, or fp32 for 16-bit grads
  // (communication_data_type "fp32": a widened copy is reduced, as DeepSpeed
  // does; NCCL otherwise sums 16-bit grads in 16 bits).
  at::ScalarType wire_dtype = at::kFloat;
  // Stage 3: called when all of a group's grads are accumulated in this
  // backward (its params are no longer needed for it); called again if
  // more arrive later.
  std::function<void(size_t group)> on_group_complete;
  // A grad arrived outside any backward begun by engine.backward() (see
  // above). Must call begin_backward(reduce, true) if none is active, and
  // may throw (e.g. fp16, which needs the loss scaled before backward).
  std::function<float()> implicit_backward;
  // Stages 2/3 with offload_optimizer on NVMe: the grad shards live in this
  // swap file between their reduction and the step (offload/grad_swap.h).
  offload::GradSwap* grad_swap = nullptr;
};

class GradReducer : public std::enable_shared_from_this<GradReducer> {
 public:
  GradReducer(std::vector<partition::FlatGroup>& groups, comm::Comm& comm, const comm::Group& dp,
              ReducerOptions opts);
  ~GradReducer();
  // Installs the hooks (needs shared_from_this, so after construction).
  void install_hooks();

  // `reduce` says whether this backward's grads are reduced (always in
  // stage 2; at the accumulation boundary in stages 0/1); `implicit`: it was
  // begun from a grad of a plain loss.backward(). Collectives a failed
  // earlier end left in flight are waited for first.
  void begin_backward(bool reduce, bool implicit = false);
  // Reduces what is left. If that throws, the backward is aborted (as
  // abort_backward) before the error propagates, so nothing stays in flight.
  void end_backward();
  bool in_backward() const { return active_; }
  bool in_implicit_backward() const { return active_ && implicit_; }
  // Reduces every group's accumulated grads now, outside a backward: the
  // one reduction pass at the end of a coalesce_grad_reduction() scope.
  void flush();
  // Grads accumulated by a backward that did not reduce, not reduced since.
  bool has_unreduced() const { return unreduced_; }
  // After an exception in backward: no new collectives; the ones already
  // launched are waited for, then every grad accumulated since the last
  // step is dropped (this backward's cannot be told apart from the rest).
  void abort_backward();
  // Clears all grads and releases the transient grad buffers (stages 2/3).
  void drop_grads();
  // After an optimizer step: grads start from zero again.
  void zero_grads();

  // Arrivals each param's grad made per backward, as learned so far.
  int expected_arrivals(size_t group, size_t param) const { return expected_[group][param]; }
  // Groups reduced a second time because grads arrived after their
  // reduction was launched, since construction (for tests).
  int64_t late_reductions() const { return late_reductions_; }

  // Hook entry points. The first returns the grad to accumulate.
  at::Tensor on_grad_about_to_accumulate(size_t group, const at::Tensor& grad);
  void on_grad_accumulated(size_t group, size_t param);
  // Where the group's buffers live (for the hooks' device guard); none on the host.
  std::optional<c10::Device> guard_device_of_group(size_t group) const;

 private:
  void ensure_grad_buffer(partition::FlatGroup& g);
  // Stage 1, before grads accumulate on top of already-reduced ones: keep
  // the reduced shard apart and restart the full buffer from zero.
  void restart_after_reduction();
  void restart_group(size_t group);
  // A grad is about to arrive for a group whose reduction was launched in
  // this backward: wait for it, and make room for the grads still coming.
  void reopen(size_t group);
  // Launches the groups not launched yet, in order, and waits for all.
  void reduce_remaining();
  // With overlap: the ranks agree which groups got grads after their
  // reduction (on any rank) and reduce those again, in order.
  void reduce_late_groups();
  void launch_ready_in_order();
  void launch(size_t group);
  void finish(size_t group);
  // Finishes reductions that are done, and the oldest ones beyond
  // kMaxInFlight, so at most that many groups' full grad buffers and
  // reduce-scatter scratch are alive at once.
  void retire(bool all);
  static constexpr size_t kMaxInFlight = 2;

  std::vector<partition::FlatGroup>& groups_;
  comm::Comm& comm_;
  const comm::Group& dp_;
  ReducerOptions opts_;
  std::vector<std::shared_ptr<torch::autograd::Node>> grad_accumulators_;  // keeps hooks alive

  struct GroupState {
    int64_t pending = 0;      // expected arrivals still to come in this backward
    bool launched = false;    // its reduction of this backward is in flight or done
    bool late = false;        // got grads after that: to be reduced again
    bool shard_fresh = true;  // grad_shard holds nothing since the last step (reduce straight into it)
    comm::WorkHandle work;
    at::Tensor partial;  // a later reduction's shard, to add into grad_shard
    at::Tensor wide;     // the fp32 copy that travels (wire_dtype fp32 for 16-bit grads), until its wait
  };
  std::vector<GroupState> state_;
  std::vector<std::vector<int>> expected_;  // per group and param: arrivals per backward (learned)
  std::vector<std::vector<int>> arrived_;   // ... in this backward
  bool active_ = false;
  bool implicit_ = false;
  bool reduce_ = false;
  float grad_scale_ = 1.0f;    // applied to arriving grads (implicit backward only)
  bool unreduced_ = false;
  bool flat_reduced_ = false;  // stage 1: grad_flat's contents are already in grad_shard
  size_t next_launch_ = 0;
  int64_t late_reductions_ = 0;
  std::deque<size_t> in_flight_;  // launched, not finished, in launch order
  // Stages 2 and 3 (where a reduction can end within the backward: stage 3,
  // stage 2 with overlap_comm), from a backward's start to its last
  // reduction: a unit's full grad buffer, freed after its reduce-scatter,
  // leaves its pages to the next unit's instead of faulting in a fresh
  // buffer's, and the last ones to the next backward's first
  // (memory/shared_arena.h).
  std::optional<memory::KeepFreedSharedPages> keep_freed_grads_;
};

}  // namespace zero
