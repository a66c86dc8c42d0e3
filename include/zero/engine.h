/// @file
/// The ZeRO engine: shards a module's training state across the
/// data-parallel ranks as the ds_config's stage asks, and runs backward
/// reduction and the optimizer step.
///
///   auto world = zero::init_distributed();
///   auto config = zero::Config::from_file("ds_config.json");
///   GPT model(cfg);
///   zero::Engine engine(*model, config, *world);
///   for (...) {
///     auto loss = model->loss(x, y);
///     engine.backward(loss);   // scales by 1/gradient_accumulation_steps (and the fp16 loss scale)
///     engine.step();           // steps only at the accumulation boundary
///   }
///
/// Stage 0: full grads all-reduced (DDP). Stage 1: optimizer state and fp32
/// master weights sharded, grads reduce-scattered at the boundary. Stage 2:
/// also grads sharded, reduce-scattered per group as soon as the group's grads
/// are ready during backward. After a step the updated shards are all-gathered
/// into the params. Stage 3: params sharded too, gathered per zero::Unit
/// around its forward and backward (see zero/unit.h). With bf16/fp16 the
/// params, grads and communication are 16-bit and the master weights and
/// optimizer state fp32.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "zero/comm.h"
#include "zero/config.h"

namespace torch::nn {
class Module;
}

namespace zero {

/// Bytes of model state this rank holds, by kind (see Engine::state_bytes).
struct StateBytes {
  int64_t params = 0;     ///< the flat param buffers (compute dtype)
  int64_t grads = 0;      ///< grad buffers and grad shards
  int64_t master = 0;     ///< fp32 master weights not aliasing the params
  int64_t optimizer = 0;  ///< optimizer state (Adam moments, SGD momentum)
  int64_t total() const { return params + grads + master + optimizer; }  ///< the sum of the four: bytes in memory
  /// Bytes reserved in this rank's NVMe swap files: master, optimizer state
  /// and grad shards (offload_optimizer.device "nvme"), param shards
  /// (offload_param.device "nvme"); not in total().
  int64_t nvme = 0;
};

/// One progress report (rank 0, every steps_per_print optimizer steps):
/// what the engine's progress line prints (see Engine::on_progress).
struct Progress {
  int64_t step = 0;         ///< optimizer steps so far (skipped ones counted, as DeepSpeed counts them)
  double loss = 0;          ///< mean over ranks and over the micro-steps since the last report
  int64_t window_steps = 0; ///< optimizer steps that mean covers
  double lr = 0;            ///< the lr of the next step
  double loss_scale = 1;    ///< the fp16 loss scale (1 otherwise)
  double grad_norm = 0;     ///< global grad norm of the last step (before clipping)
  bool skipped = false;     ///< the last step was skipped (fp16/bf16 overflow)
  double samples_per_s = 0; ///< over the steps since the last report, all ranks
  double tokens_per_s = 0;  ///< likewise; 0 when no tokens are counted
  double peak_rss_mb = 0;   ///< this process's peak resident memory
};

/// An optimizer param group (torch's param groups; DeepSpeed's
/// model_parameters given as a list of dicts): the config's optimizer with
/// these settings changed for `params`. Trainable params in no group use the
/// config's. `lr` is scaled by the config's scheduler as the config's lr is
/// (the group trains at lr_now * lr / optimizer.params.lr).
struct ParamGroup {
  std::vector<at::Tensor> params;  ///< the group's params (the model's own tensors)
  std::optional<double> lr;  ///< this group's lr; unset: the config's
  std::optional<double> weight_decay;  ///< this group's weight decay; unset: the config's
};

/// The standard recipe: `weight_decay` on matrices (weights of Linear,
/// Embedding, ...), none on biases and norm weights (params of one dimension).
std::vector<ParamGroup> weight_decay_groups(torch::nn::Module& model, double weight_decay);

/// ZeRO data parallelism over one model: flattens and shards its params, grads and optimizer state per the config's stage, and runs forward (stage 3), backward's reductions, the optimizer step and checkpoints. DeepSpeed's engine; every rank builds one over the same model.
class Engine {
 public:
  /// The data-parallel group is the whole world.
  Engine(torch::nn::Module& model, const Config& config, World& world, std::vector<ParamGroup> param_groups = {});
  /// An explicit data-parallel group (e.g. a strict subset of the world).
  Engine(torch::nn::Module& model, const Config& config, comm::Comm& comm,
         std::shared_ptr<comm::Group> dp_group, std::vector<ParamGroup> param_groups = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Runs the model's forward, as DeepSpeed's engine(inputs): `fn` calls it
  /// and returns the tensor backward starts from (or one it flows through,
  /// e.g. the logits), which is returned:
  ///   auto loss = engine.forward([&] { return model->loss(x, y); });
  /// At stage 3 the root unit's params (those outside every zero::Unit:
  /// embeddings, final norm, head) are gathered for `fn` and again for its
  /// backward, and released after each, as a unit's are; so between steps
  /// every param, the root's too, is held only as this rank's shard. A model
  /// whose forward is called directly keeps its root gathered throughout
  /// (and works as before); once engine.forward() has been used, the root's
  /// params may be used only inside it. A root smaller than
  /// stage3_param_persistence_threshold stays gathered either way. At stages
  /// 0-2 it only calls `fn`.
  template <typename Fn>
  at::Tensor forward(Fn&& fn) {
    begin_forward();
    at::Tensor out;
    try {
      out = std::forward<Fn>(fn)();
    } catch (...) {
      forward_failed();
      throw;
    }
    return end_forward(out);
  }

  /// forward(fn) for a forward whose result holds several tensors (a tuple,
  /// a dict of outputs; a Python model's): `fn` runs it and returns every
  /// tensor of its result, which keeps its own structure (capture it). Each
  /// returned tensor that requires grad is hooked in place, so the root is
  /// regathered before its backward from whichever output it starts.
  void forward_each(const std::function<std::vector<at::Tensor>()>& fn);

  /// The module's forward with its floating-point tensor arguments cast to
  /// the dtype the params compute in (FSDP2's cast_forward_inputs), inside
  /// forward(fn) above:
  ///   auto logits = engine.forward(model, x);
  /// Needed only when params compute in 16 bits (compute_dtype()) and the
  /// model takes float inputs; token ids and other integer tensors pass as they are.
  /// An integer first argument is counted as this micro-batch's tokens (count_tokens).
  template <typename Module, typename Arg, typename... Args>
  at::Tensor forward(Module& module, Arg&& arg, Args&&... args) {
    if constexpr (std::is_convertible_v<const Arg&, const at::Tensor&>) count_input_tokens(arg);
    return forward([&] {
      return module->forward(cast_input(std::forward<Arg>(arg)), cast_input(std::forward<Args>(args))...);
    });
  }
  /// A floating-point tensor in the compute dtype; anything else as it is.
  at::Tensor cast_input(const at::Tensor& t) const;
  template <typename T, typename = std::enable_if_t<!std::is_convertible_v<T, const at::Tensor&>>>
  /// Anything but a tensor passes through cast_input() as it is.
  T&& cast_input(T&& v) const {
    return std::forward<T>(v);
  }
  /// Tokens this rank trained on in this micro-batch, for the progress
  /// line's tokens/s (engine.forward(model, ids, ...) counts an integer first
  /// argument itself; a forward(fn) caller counts here).
  void count_tokens(int64_t n);
  void count_input_tokens(const at::Tensor& first_input);  ///< its numel when integer, else nothing
  /// The dtype the module's params have in forward and backward: fp32, or the
  /// 16-bit dtype they are stored in (zero_cpp.compute_dtype; measured by default).
  at::ScalarType compute_dtype() const;

  /// Backpropagates loss * loss_scale / gradient_accumulation_steps and
  /// reduces grads as the stage requires. Returns the unscaled loss / gas
  /// (as DeepSpeed's backward does). If the backward throws, the engine
  /// stays usable: reductions already launched are waited for and every
  /// grad accumulated since the last step is dropped (the failed backward's
  /// cannot be told apart from the others'); the next backward starts over.
  at::Tensor backward(const at::Tensor& loss);
  /// DeepSpeed's engine.scale(loss), for a backward the program runs itself
  /// (`engine.scale(loss).backward()`): the loss times the fp16 loss scale
  /// (the loss itself without fp16). With fp16 a plain loss.backward() is
  /// refused unless it runs from this; its grads arrive divided by the
  /// accumulation steps, as under backward(). std::invalid_argument for a
  /// loss that is not a scalar requiring grad.
  at::Tensor scale(const at::Tensor& loss);
  /// At the accumulation boundary: unscale, check overflow, clip, update,
  /// all-gather, zero grads. Elsewhere only counts the micro-step. Returns
  /// true when the optimizer stepped (false also for a skipped fp16 step).
  bool step();
  /// Clears accumulated grads (step() does this after each update).
  void zero_grad();

  /// Whether the next step() is at the gradient accumulation boundary (it updates).
  bool is_gradient_accumulation_boundary() const;
  /// As DeepSpeed's: overrides the computed boundary for the backward and
  /// step calls that follow (set it before each backward; the last one of an
  /// accumulation window must be true). clear_... returns to counting.
  void set_gradient_accumulation_boundary(bool is_boundary);
  /// Returns to counting the boundary from gradient_accumulation_steps.
  void clear_gradient_accumulation_boundary();

  /// While the returned guard lives, backward accumulates grads locally with
  /// no communication (as DDP's no_sync); the first backward after it, at the
  /// boundary, reduces everything accumulated. Stages 0 and 1 only: stages 2
  /// and 3 keep only grad shards, so they cannot defer reduction this way.
  class NoSync {
   public:
    explicit NoSync(Engine& e);  ///< starts the guard (use no_sync())
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    Engine& engine_;
  };
  NoSync no_sync() { return NoSync(*this); }  ///< a NoSync guard (stages 0-1)

  /// While the returned guard lives, backward calls accumulate grads locally
  /// with no communication; leaving it reduces everything accumulated in one
  /// pass (one reduce-scatter per group), leaving the grads as the separate
  /// reductions would (up to float rounding: the sum is reduced once instead
  /// of each part), ready for step(). For callers that run several backward
  /// passes per step (GradCache-style chunked losses, custom autograd
  /// functions); DeepSpeed's engine.coalesce_grad_reduction().
  ///
  /// Stages 1-3. The cost is memory: stages 2/3 hold every group's full grad
  /// buffer (one full grad per rank) until the guard ends, instead of one or
  /// two groups at a time. At stage 1 the guard ends with the boundary
  /// backward's reduction (none before the accumulation boundary, where stage 1
  /// does not reduce anyway). Errors: stage 0 (use no_sync()), nesting, a
  /// no_sync() guard alive, and step() inside the guard.
  ///
  /// finish() ends the guard and reduces (a collective; errors are thrown
  /// there). The destructor calls it if it was not called, and never throws:
  /// if the scope is left by an exception the reduction is skipped (the peers
  /// may not be there) and the next step() reduces instead; if the reduction
  /// itself fails, the engine's next call that trains or saves reports it, once.
  class CoalesceGradReduction {
   public:
    explicit CoalesceGradReduction(Engine& e);  ///< starts the guard (use coalesce_grad_reduction())
    void finish();  ///< ends the guard now and reduces (a collective)
    /// Ends the guard without reducing and without a collective, as when its
    /// scope is left by an exception (the peers may not be there): step()
    /// reduces what was accumulated. For callers whose errors are not C++
    /// exceptions (the Python front end's context managers).
    void abandon();
    ~CoalesceGradReduction();
    CoalesceGradReduction(const CoalesceGradReduction&) = delete;
    CoalesceGradReduction& operator=(const CoalesceGradReduction&) = delete;

   private:
    Engine& engine_;
    int uncaught_at_entry_;
    bool finished_ = false;
  };
  CoalesceGradReduction coalesce_grad_reduction() { return CoalesceGradReduction(*this); }  ///< a CoalesceGradReduction guard (stages 1-3)
  /// The mean over the data-parallel ranks of a scalar each computed (its
  /// loss, say), for logging: every rank gets the same value. Collective:
  /// every rank calls it. Does not touch autograd.
  double global_mean(const at::Tensor& value);
  double global_mean(double value);  ///< the same for a plain number

  int64_t global_steps() const;   ///< optimizer steps taken (skipped ones excluded)
  int64_t skipped_steps() const;  ///< steps skipped for fp16/bf16 overflow
  int64_t micro_steps() const;  ///< micro-batches (backward calls) since the start
  double loss_scale() const;  ///< the current loss scale (1 without fp16)
  double lr() const;              ///< the lr the next optimizer step uses
  /// A schedule of your own, replacing the config's scheduler: fn(k) is the
  /// lr of the optimizer step that follows k steps (skipped fp16 steps not
  /// counted; a resumed checkpoint continues k). Param groups scale it as
  /// they scale the config's lr.
  void set_lr_schedule(std::function<double(int64_t)> fn);
  /// Sets each param group's lr for the optimizer steps that follow, as a
  /// torch scheduler writes param_groups[i]["lr"]: lrs[0] for the params in
  /// no ParamGroup (the config's), lrs[k + 1] for ParamGroup k. It replaces
  /// the schedule and the groups' lr ratios until called again; an empty
  /// vector returns to them. lr() then reports lrs[0].
  void set_param_group_lrs(std::vector<double> lrs);
  /// The same for each param group's weight decay (a weight-decay schedule):
  /// wds[0] for the params in no ParamGroup, wds[k + 1] for ParamGroup k; an
  /// empty vector returns to the groups' own.
  void set_param_group_weight_decays(std::vector<double> wds);
  double last_grad_norm() const;  ///< global grad norm of the last boundary (before clipping)
  /// With `wall_clock_breakdown`: the last optimizer step's time in ms by
  /// DeepSpeed's timer names -- forward and backward of its micro-steps,
  /// backward_allreduce (the wait for their reductions, part of backward),
  /// step (the update) and step_allgather (stages 1-3 publishing the
  /// updated params, part of step); on a device each read of the clock
  /// synchronises it first. Empty otherwise.
  std::map<std::string, double> last_step_times() const;
  /// Replaces the engine's progress line (steps_per_print) with `report`,
  /// called on rank 0 at each report instead of printing it, so a training
  /// script can print one line of its own per report. The
  /// wall_clock_breakdown line still follows; an empty function restores
  /// the engine's line.
  void on_progress(std::function<void(const Progress&)> report);

  const Config& config() const;  ///< the ds_config it was built with
  const BatchConfig& batch() const;  ///< the batch numbers resolved against the data-parallel size
  /// Another micro-batch size or accumulation count from now on
  /// (DeepSpeed's set_train_batch_size / set_train_micro_batch_size: a
  /// batch-size warm-up). Between steps, as DeepSpeed's: the micro-steps
  /// counted so far stay, so the next boundary is the next count the new
  /// accumulation count divides. std::logic_error inside a forward,
  /// no_sync() or coalesce_grad_reduction(); std::invalid_argument for a
  /// count under 1.
  void set_batch(int64_t micro_batch_per_gpu, int64_t gradient_accumulation_steps);
  /// DeepSpeed's offload_states: the engine's buffers on the device moved into
  /// host memory (pinned unless `pin_memory` is false), their device memory
  /// given back, so the device is free for another job between training
  /// phases. `include`: DeepSpeed's state names -- "optim_states",
  /// "hp_params", "lp_params", "lp_grads", "contiguous_grad_buffer" -- empty
  /// for all. Buffers already in host memory stay (on a CPU engine nothing
  /// moves). Returns the device bytes given back. Training, saving and state
  /// access throw until reload_states(); std::logic_error inside a forward,
  /// backward or gathered_parameters(), std::invalid_argument for an unknown
  /// name.
  int64_t offload_states(const std::vector<std::string>& include = {}, bool pin_memory = true);
  /// Brings every offloaded buffer back to the device, its contents as they were.
  void reload_states();
  bool states_offloaded() const;  ///< some buffer is offloaded (reload_states() not called since)
  const comm::Group& dp_group() const;  ///< the data-parallel group
  comm::Comm& comm();  ///< the dispatcher its collectives go through
  int64_t num_params() const;     ///< trainable elements (unpadded)
  StateBytes state_bytes() const; ///< what this rank holds now
  std::string describe() const;   ///< groups, sizes, stage, dtypes (one paragraph)
  /// Stage 3: the most param elements of non-persistent units gathered at
  /// once during forward since the last reset (what stage3_max_live_parameters
  /// bounds; a single unit larger than it is still gathered); 0 otherwise.
  int64_t peak_live_params() const;
  void reset_peak_live_params();  ///< restarts peak_live_params()
  /// Stage 3: padded elements of the groups that stay gathered (root unit and
  /// units under stage3_param_persistence_threshold); 0 otherwise.
  int64_t persistent_params() const;
  /// Every trainable param in fp32 by name (a copy of the param's value).
  /// Under stage 3 this gathers each unit in turn: every rank must call it.
  std::map<std::string, at::Tensor> full_parameters();

  /// Full params outside forward and backward, at any stage (DeepSpeed's
  /// GatheredParameters, FSDP2's unshard()). While the guard lives, `params`
  /// (every trainable param when empty) hold their full values on every
  /// rank -- at stage 3 their units are gathered and kept -- so code may
  /// read them, print them or run evaluation with them. With
  /// `modifier_rank`, the changes that rank makes to them are written back
  /// when the guard finishes: broadcast to every rank, into the fp32 master
  /// weights the optimizer updates (16-bit params: only the elements that
  /// changed), and at stage 3 into the shards. Frozen params and buffers may
  /// be passed too (broadcast likewise). Every rank creates and finishes the
  /// guard alike (collective); backward and step() inside it are errors.
  /// Outside such a scope, at stage 3, a unit's param may be used only
  /// inside its unit's forward and backward: any other read or write stops
  /// the process with a message naming the param.
  class GatheredParameters {
   public:
    /// Gathers (collective); use Engine::gathered_parameters().
    GatheredParameters(Engine& e, std::vector<at::Tensor> params, std::optional<int> modifier_rank);
    /// Writes back and releases (collective; errors are thrown here). The
    /// destructor calls it if it was not called, and never throws: if the
    /// scope is left by an exception the units are released with nothing
    /// written back and no collective issued (the peers may not be there);
    /// if the write-back fails, the engine's next call that trains or saves reports it, once.
    void finish();
    /// Releases the params with nothing written back and no collective, as
    /// when the scope is left by an exception (the peers may not be there).
    void abandon();
    ~GatheredParameters();
    GatheredParameters(const GatheredParameters&) = delete;
    GatheredParameters& operator=(const GatheredParameters&) = delete;

   private:
    Engine& engine_;
    std::vector<size_t> groups_;          ///< flat groups holding the params
    std::vector<at::Tensor> replicated_;  ///< frozen params and buffers passed
    std::optional<int> modifier_rank_;
    int uncaught_at_entry_;
    bool finished_ = false;
  };
  /// A GatheredParameters guard over `params` (every trainable param when empty).
  GatheredParameters gathered_parameters(std::vector<at::Tensor> params = {},
                                         std::optional<int> modifier_rank = std::nullopt) {
    return GatheredParameters(*this, std::move(params), modifier_rank);
  }

  /// The whole model by name, as a plain (unsharded) model registers it:
  /// every trainable param (its fp32 master value, under each name it is
  /// registered by), every frozen param and buffer -- for saving and
  /// evaluation. Every rank must call it; with rank0_only the other ranks
  /// get an empty map (and hold no full copy).
  std::map<std::string, at::Tensor> state_dict(bool rank0_only = false);
  /// One kind of the full state of the trainable param `name`, in fp32:
  /// "master" (its fp32 weights), "exp_avg" and "exp_avg_sq" (the
  /// optimizer's moments), or "grad" (the reduced grad the step will take:
  /// between a boundary's backward and its step) -- DeepSpeed's
  /// safe_get_full_* debugging accessors. Every rank must call it for the
  /// same param (where the state is sharded, one all-reduce of that param's
  /// size assembles it). Throws std::invalid_argument for an unknown param,
  /// a kind the optimizer does not keep or grads on NVMe, and
  /// std::logic_error for grads not reduced yet.
  at::Tensor full_state(const std::string& kind, const std::string& name);
  /// The part of param `name` this rank's shard holds: {first element in
  /// the param (flattened), element count} -- the whole param at stage 0,
  /// possibly none at stages 1-3 (the layout lays the params end to end and
  /// shards the whole, so a param's parts differ in size between ranks).
  std::pair<int64_t, int64_t> local_range(const std::string& name) const;
  /// Stage 3: this rank's part of param `name` as it rests between uses --
  /// a view of the shard, in the storage dtype (DeepSpeed's `ds_tensor`);
  /// undefined below stage 3 or where the shards are paged to NVMe.
  at::Tensor local_param(const std::string& name) const;
  /// full_state's `kind` of this rank's part alone (local_range), flat, in
  /// fp32: no collective (DeepSpeed's safe_get_local_*).
  at::Tensor local_state(const std::string& kind, const std::string& name);
  /// Writes `value` into one kind of the state (DeepSpeed's safe_set_*):
  /// the whole param's value (each rank keeps its part; every rank passes
  /// the same), or with `local` this rank's part alone. No collective. The
  /// params take a new master value at the next step, as DeepSpeed's (in
  /// fp32, where the master is the params' memory, the value waits for that
  /// step, or a save_checkpoint, and the getters read it); grads as
  /// full_state reads them. Throws std::invalid_argument for a value of
  /// another size.
  void set_state(const std::string& kind, const std::string& name, const at::Tensor& value, bool local);
  /// Writes state_dict() as one safetensors file (rank 0 writes, every rank
  /// calls): the same file zero-ckpt consolidate makes from a checkpoint,
  /// readable by load_weights() and any safetensors reader.
  void save_weights(const std::string& path);

  /// Checkpoints (every rank calls these; DIR must be one directory all
  /// ranks see). save_checkpoint writes this rank's fp32 master weights and
  /// optimizer state (the 16-bit params are derived from them), and rank 0 a
  /// manifest, into DIR/.partial-TAG, then renames it to DIR/TAG and points
  /// DIR/latest at it: a save that dies midway leaves the previous checkpoint
  /// loadable. Only at an accumulation boundary (grads are not saved).
  /// `client_state` is stored as given (e.g. the data position).
  void save_checkpoint(const std::string& dir, const std::string& tag,
                       const nlohmann::json& client_state = nlohmann::json::object());
  /// What save_checkpoint leaves out.
  struct SaveOptions {
    /// The frozen params (DeepSpeed's exclude_frozen_parameters: a
    /// fine-tuned adapter's checkpoint without its frozen base); loading it
    /// needs LoadOptions::strict false.
    bool exclude_frozen_params = false;
  };
  /// save_checkpoint, leaving out what `how` says.
  void save_checkpoint(const std::string& dir, const std::string& tag, const nlohmann::json& client_state,
                       const SaveOptions& how);
  /// Loads DIR/TAG (TAG "" = DIR/latest), whatever world size and stage saved
  /// it: each rank reads the ranges its own shards need. Restores weights,
  /// optimizer state, step counters, loss scale and LR schedule position, and
  /// returns the client_state. A param missing, extra or of another shape is
  /// an error naming it; truncated or corrupt files are errors naming them.
  nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag = "");
  /// What load_checkpoint restores beside the weights (DeepSpeed's
  /// load_optimizer_states and load_module_only).
  struct LoadOptions {
    /// The optimizer's state (moments, its update count, the fp16 loss
    /// scale); false keeps this engine's own.
    bool optimizer_state = true;
    /// The step counters (global and skipped steps, the schedule's
    /// position); false keeps this engine's own.
    bool step_counters = true;
    /// false (DeepSpeed's load_module_strict=False): what only one side has
    /// -- a frozen param saved with SaveOptions::exclude_frozen_params, a
    /// param or buffer added to the model or dropped from it -- is left
    /// alone (the model's keep their values and state); true makes any such
    /// difference an error naming it. Shapes must match either way.
    bool strict = true;
  };
  /// load_checkpoint restoring the weights (and frozen params and buffers)
  /// and what `what` asks for besides.
  nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag, const LoadOptions& what);
  /// Sets the weights from a safetensors file of full tensors by param name
  /// (zero-ckpt consolidate's output; fp32 or bf16); optimizer state and
  /// counters stay as they are (a fresh start from those weights).
  void load_weights(const std::string& safetensors_path);

 private:
  /// forward()'s brackets: the stage-3 root's gather, and its release and
  /// backward hook on `out`.
  void begin_forward();
  at::Tensor end_forward(const at::Tensor& out);
  void end_forward(const std::vector<at::Tensor>& outs);
  void forward_failed();

  struct Impl;  ///< src/engine/engine_impl.h
  std::unique_ptr<Impl> impl_;
};

/// Returns `t` in fp32 (differentiable). No longer needed: the engine gives
/// the module its params in the compute dtype (zero_cpp.compute_dtype), so
/// stock modules train at every precision; kept for models written for it.
at::Tensor compute(const at::Tensor& t);

}  // namespace zero
