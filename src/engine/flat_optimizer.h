// The optimizer over the flat groups' fp32 masters: global grad norm,
// overflow check (fp16/bf16), DeepSpeed's clipping, the fused update
// (optim/kernels: AdamW/Adam/SGD/Lion/Adagrad, writing the 16-bit params in the same
// pass), the LR schedule, the loss scaler and the step counters. It knows
// nothing of backward or of how params reach the ranks afterwards: the
// engine reduces grads before step() and publishes params after it.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <unordered_map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "zero/stage_policy.h"
#include "optim/loss_scaler.h"
#include "partition/flat_group.h"
#include "zero/comm.h"
#include "engine/update_chunks.h"
#include "optim/kernels.h"
#include "zero/config.h"

namespace zero::offload {
class StateSwapper;
class ParamSwap;
class GradSwap;
}

namespace zero {

class FlatOptimizer {
 public:
  FlatOptimizer(const Config& config, const StagePolicy& policy, comm::Comm& comm, const comm::Group& dp,
                std::function<void(const std::string&)> log);
  ~FlatOptimizer();

  // Optimizer state for a group whose master is set: moments (Adam),
  // momentum (SGD, Lion), sum of squared grads (Adagrad). With
  // offload_optimizer on NVMe the master (unless it is the params
  // themselves, fp32 on a host model) and the state then go to the swap
  // file (offload/state_swapper.h).
  void init_state(partition::FlatGroup& g);

  // A group's master and optimizer state -- and, with offload_param on
  // NVMe, its param shard -- in memory while alive, for code outside the
  // step that reads or writes them (checkpoints, gathered-params
  // write-backs, params_from_masters): nothing to do unless they are on
  // NVMe. `done()` ends the use -- each part written back when its flag
  // says it was changed -- and reports an I/O failure; a scope left without
  // it (an exception) drops its changes, keeping the copies on disk.
  class ResidentState {
   public:
    ResidentState(offload::StateSwapper* swapper, int slot, bool write_state, offload::ParamSwap* params,
                  const partition::FlatGroup* group, bool write_params);
    ResidentState(ResidentState&& other) noexcept;
    ResidentState(const ResidentState&) = delete;
    ResidentState& operator=(const ResidentState&) = delete;
    ResidentState& operator=(ResidentState&&) = delete;
    ~ResidentState();
    void done();

   private:
    offload::StateSwapper* swapper_;
    int slot_;
    bool write_state_;
    offload::ParamSwap* params_;
    const partition::FlatGroup* group_;
    bool write_params_;
  };
  ResidentState resident(const partition::FlatGroup& g, bool write) { return resident(g, write, write); }
  ResidentState resident(const partition::FlatGroup& g, bool write_state, bool write_params);
  // offload_param on NVMe: the step and resident() page the param shards in
  // too. Set before grouping (which adopts each group's shard).
  void set_param_swap(offload::ParamSwap* params) { param_swap_ = params; }
  offload::ParamSwap* param_swap() const { return param_swap_; }
  // Grads on NVMe (offload/grad_swap.h): the step reads each group's grad
  // shard beside its state, and takes the global norm from the norms the
  // reductions recorded.
  void set_grad_swap(offload::GradSwap* grads) { grad_swap_ = grads; }
  // Bytes of optimizer state in this rank's swap file (0 without NVMe offload).
  int64_t swapped_bytes() const;
  // Whether resident() pages anything in (NVMe offload of either kind).
  bool pages_state() const { return swapper_ || param_swap_; }

  // Param groups (torch's, DeepSpeed's model_parameters): hyper 0 is the
  // config's; a param in `group_of` uses hypers[index] instead.
  struct Hyper {
    double lr_scale = 1.0;  // the group's lr / the config's lr (the schedule scales both alike)
    double weight_decay = 0.0;
  };
  void set_param_groups(std::vector<Hyper> hypers, std::unordered_map<const void*, int> group_of);

  // Updates the masters (and the 16-bit params) from the reduced grads;
  // false when the step is skipped for an fp16/bf16 overflow (the loss
  // scale drops; reported as DeepSpeed does; counted as skipped at once).
  bool update(std::vector<partition::FlatGroup>& groups);
  // Groups whose update began in the last update() (so, after it threw,
  // whether any master may have changed).
  size_t groups_updated() const { return groups_updated_; }
  // After the updated params are published: the step counts (counters, LR
  // schedule, loss scaler), so a publish that fails leaves them as they were.
  void commit();

  double loss_scale() const { return scaler_.scale(); }
  double lr() const;  // the lr the next step uses
  // Replaces the config's scheduler: fn(k) is the lr after k optimizer steps.
  void set_lr_schedule(std::function<double(int64_t)> fn) { schedule_ = std::move(fn); }
  // The lr of every hyper (0: the config's, then each param group's) for
  // the steps that follow, replacing the schedule and the groups' scales
  // until set again; empty returns to them. A front end whose scheduler
  // sets each group's lr itself (torch's param_groups) pushes them here.
  void set_lr_override(std::vector<double> per_hyper);
  // The same for each hyper's weight decay (a weight-decay schedule).
  void set_weight_decay_override(std::vector<double> per_hyper);
  size_t hyper_count() const { return hypers_.size(); }
  int64_t global_steps() const { return global_steps_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  double last_grad_norm() const { return last_grad_norm_; }

  // Counters, loss scaler and schedule position, for checkpoints.
  nlohmann::json state() const;
  void restore(const nlohmann::json& state);
  // Parts of restore(): the step counters and the schedule's position; the
  // update's own state (its count, for bias correction, and the loss scale).
  void restore_counters(const nlohmann::json& state);
  void restore_update_state(const nlohmann::json& state);

 private:
  at::Tensor grads_of(const partition::FlatGroup& g) const;  // fp32: a shard, or all of it
  double global_sumsq(const std::vector<at::Tensor>& grads);
  // ZeRO-Offload's pinned host buffers for one group, kept across steps.
  struct OffloadStaging {
    at::Tensor grads;   // the reduced grads, brought down
    at::Tensor params;  // the params' new 16-bit values, sent up
  };
  // LAMB: two passes over every group with one all-reduce of the per-param
  // norms between them (docs/design.md, "LAMB over flat shards").
  void update_lamb(std::vector<partition::FlatGroup>& groups, const std::vector<at::Tensor>& grads, double lr,
                   float grad_scale);
  void update_group(size_t index, partition::FlatGroup& g, const at::Tensor& grad, double lr, float grad_scale);
  void update_offloaded(OffloadStaging& staging, partition::FlatGroup& g, const at::Tensor& grad, double lr,
                        float grad_scale);
  // Runs of the master (this rank's shard, or all of it) under one hyper.
  using Span = UpdateSpan;
  std::vector<Span> spans_of(const partition::FlatGroup& g) const;
  void update_span(partition::FlatGroup& g, const at::Tensor& grad, const Span& s, double lr, float grad_scale,
                   void* out16, optim::Out16 kind);

  const Config& config_;
  const StagePolicy& policy_;
  std::function<double(int64_t)> schedule_;      // the user's, if set
  std::vector<double> lr_override_;              // set_lr_override: per hyper, when not empty
  std::vector<double> wd_override_;              // set_weight_decay_override: likewise
  // The lr a hyper's params step at: the override's, else lr() scaled.
  double rate_of(double lr, int hyper) const;
  double weight_decay_of(int hyper) const;  // the override's, else the group's
  std::vector<Hyper> hypers_;                    // [0]: the config's
  std::unordered_map<const void*, int> group_of_;  // param -> hyper, when not 0
  comm::Comm& comm_;
  const comm::Group& dp_;
  std::function<void(const std::string&)> log_;
  optim::LossScaler scaler_;
  int64_t global_steps_ = 0;     // steps taken (skipped ones excluded)
  int64_t skipped_steps_ = 0;
  int64_t optimizer_steps_ = 0;  // updates applied (bias correction / momentum start)
  int64_t scheduler_iter_ = -1;  // DeepSpeed's last_batch_iteration
  // false while a schedule begun part way has not stepped: it has written
  // nothing yet, so the optimizer's own lr and betas hold (DeepSpeed's).
  bool schedule_written_ = true;
  std::array<double, 2> betas() const;  // the betas this step takes
  double last_grad_norm_ = 0.0;
  size_t groups_updated_ = 0;
  std::vector<OffloadStaging> offload_staging_;  // by group, when the optimizer is offloaded
  std::unique_ptr<offload::StateSwapper> swapper_;  // offload_optimizer.device "nvme"
  std::unordered_map<const void*, int> swap_slot_;       // a group's master -> its slot in swapper_
  offload::ParamSwap* param_swap_ = nullptr;             // offload_param.device "nvme" (the engine's)
  offload::GradSwap* grad_swap_ = nullptr;               // grads on NVMe with the optimizer's state (the engine's)
  int swap_slot_of(const partition::FlatGroup& g) const;  // -1: nothing of it swapped
};

}  // namespace zero
