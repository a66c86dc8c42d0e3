/// @file
/// DeepSpeed's ds_config.json as typed structs: same key names, aliases and
/// defaults, so a DeepSpeed user's file works unchanged. Parsing is strict:
/// an unknown key, a wrong type or value, or a DeepSpeed feature this project
/// does not implement is a ConfigError that names the key.
///
/// This header does not include torch, so tools and tests that only read
/// configs build without it.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace zero {

/// A ds_config that cannot be run: an unknown key (with a did-you-mean), a wrong type or value, or a feature set to a value zero-cpp does not implement. The message names the key.
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Storage / communication precision of params and grads.
enum class DType { fp32, fp16, bf16 };
/// Its ds_config spelling ("fp32", "fp16", "bf16").
const char* to_string(DType);

/// The `fp16` block: 16-bit storage with DeepSpeed's dynamic loss scaler. Fields are its keys.
struct FP16Config {
  bool enabled = false;  ///< fp16.enabled
  double loss_scale = 0.0;  ///< 0 = dynamic loss scaling
  int64_t initial_scale_power = 16;  ///< fp16.initial_scale_power: the dynamic scale starts at 2^this
  int64_t loss_scale_window = 1000;  ///< fp16.loss_scale_window: steps without overflow before the scale doubles
  int64_t hysteresis = 2;  ///< fp16.hysteresis: overflows tolerated before the scale halves
  bool consecutive_hysteresis = false;  ///< fp16.consecutive_hysteresis: hysteresis restored by a step without overflow
  double min_loss_scale = 1.0;  ///< fp16.min_loss_scale: the scale's floor
};

/// The `bf16` block: params stored and communicated in bf16, fp32 masters.
struct BF16Config {
  bool enabled = false;  ///< bf16.enabled
};

/// The optimizers the fused kernels run (the config's `optimizer.type`).
enum class OptimizerType { Adam, AdamW, SGD, Lion, Adagrad, Lamb, Muon };
/// Its ds_config spelling ("Adam", "AdamW", ...).
const char* to_string(OptimizerType);

/// The `optimizer` block (its `type` and `params`), or an optimizer from code (with_optimizer). Fields are DeepSpeed's param names.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::AdamW;  ///< optimizer.type
  bool given = false;  ///< false: no "optimizer" block (the engine then needs one from code)
  double lr = 1e-3;  ///< learning rate (before any schedule)
  std::array<double, 2> betas{0.9, 0.999};  ///< Adam/AdamW/Lion/LAMB betas
  double eps = 1e-8;  ///< Adam/AdamW/LAMB/Adagrad epsilon
  double weight_decay = 0.0;  ///< weight decay: decoupled (AdamW, Lion), inside the trust-ratio update (LAMB), or L2 into the grad (Adam with adam_w_mode false, SGD, Adagrad)
  /// DeepSpeed's "Adam" is decoupled-weight-decay Adam (AdamW) unless
  /// adam_w_mode is false; "AdamW" is always decoupled.
  bool adam_w_mode = true;
  double momentum = 0.0;  ///< SGD; Muon (default 0.95 there)
  double dampening = 0.0;  ///< SGD
  bool nesterov = false;  ///< SGD
  double initial_accumulator_value = 0.0;  ///< Adagrad: where the sum of squared grads starts
  /// LAMB (DeepSpeed's FusedLamb): the trust ratio's clamp, and whether the
  /// step size carries Adam's bias correction.
  double max_coeff = 10.0, min_coeff = 0.01;  ///< (see max_coeff)
  bool bias_correction = true;  ///< LAMB: the step size carries Adam's bias correction
  /// Muon (DeepSpeed's MuonWithAuxAdam): `lr` and `momentum` (0.95) are the
  /// Muon params' (2-D+ weights whose name holds neither "embed" nor
  /// "lm_head"); the others run AdamW at adam_lr with betas (0.9, 0.95) and
  /// eps 1e-10.
  double adam_lr = 3e-4;
  /// Muon: "gram" or "standard" (the same orthogonalisation; computed here by
  /// the standard quintic Newton-Schulz iteration, 5 steps).
  std::string ns_method = "gram";

  /// An optimizer from code (zero::with_optimizer below), run by the same
  /// fused kernels as the config's.
  static OptimizerConfig adamw(double lr, double weight_decay = 0.01, std::array<double, 2> betas = {0.9, 0.999},
                               double eps = 1e-8);
  static OptimizerConfig adam(double lr, double weight_decay = 0.0, std::array<double, 2> betas = {0.9, 0.999},
                              double eps = 1e-8);  ///< L2 weight decay (torch.optim.Adam)
  /// SGD, with optional momentum and Nesterov (torch.optim.SGD).
  static OptimizerConfig sgd(double lr, double momentum = 0.0, double weight_decay = 0.0, bool nesterov = false);
  /// Defaults are DeepSpeed's (FusedLion / DeepSpeedCPULion; torch.optim.Adagrad
  /// and DeepSpeedCPUAdagrad), which differ from the papers' (Lion: beta2 0.99).
  static OptimizerConfig lion(double lr = 1e-3, double weight_decay = 0.0, std::array<double, 2> betas = {0.9, 0.999});
  /// Adagrad, DeepSpeed's and torch's defaults.
  static OptimizerConfig adagrad(double lr = 1e-2, double weight_decay = 0.0, double eps = 1e-10);
  /// LAMB (DeepSpeed's FusedLamb), DeepSpeed's defaults.
  static OptimizerConfig lamb(double lr = 1e-3, double weight_decay = 0.0, std::array<double, 2> betas = {0.9, 0.999},
                              double eps = 1e-8);
  /// DeepSpeed's Muon: lr 0.02 and momentum 0.95 for the Muon params, the
  /// AdamW fallback at adam_lr 3e-4, betas (0.9, 0.95), eps 1e-10.
  static OptimizerConfig muon(double lr = 0.02, double weight_decay = 0.0, double momentum = 0.95,
                              double adam_lr = 3e-4, std::array<double, 2> betas = {0.9, 0.95}, double eps = 1e-10);
};

/// The learning-rate schedules of the `scheduler` block (DeepSpeed's names); None: the constant lr.
enum class SchedulerType { None, WarmupLR, WarmupDecayLR, WarmupCosineLR, LRRangeTest, OneCycle };
/// Its ds_config spelling.
const char* to_string(SchedulerType);
/// How WarmupLR and its kin warm up: logarithmically (DeepSpeed's default) or linearly.
enum class WarmupType { Log, Linear };

/// The `scheduler` block: its `type` and `params`, with DeepSpeed's names and defaults.
struct SchedulerConfig {
  SchedulerType type = SchedulerType::None;  ///< scheduler.type
  double warmup_min_lr = 0.0;  ///< warmup_min_lr: the lr at step 0
  double warmup_max_lr = 1e-3;  ///< warmup_max_lr: the lr warmup reaches
  int64_t warmup_num_steps = 1000;  ///< warmup_num_steps
  WarmupType warmup_type = WarmupType::Log;  ///< warmup_type: "log" or "linear"
  int64_t total_num_steps = 0;     ///< WarmupDecayLR, WarmupCosineLR (required there)
  double warmup_min_ratio = 0.0;   ///< WarmupCosineLR
  double cos_min_ratio = 1e-4;     ///< WarmupCosineLR
  bool warmup_max_lr_follows_optimizer = false;  ///< WarmupLR without warmup_max_lr: the optimizer's lr
  /// last_batch_iteration: where the schedule begins (a resumed run's); -1 is
  /// the start. Begun part way, it writes nothing until its first step, as
  /// DeepSpeed's: the first step takes the optimizer's lr and betas.
  int64_t last_batch_iteration = -1;
  /// LRRangeTest: min_lr * (1 + step_rate * (iteration + 1) / step_size), the
  /// interval floored when staircase.
  double lr_range_test_min_lr = 1e-3;
  int64_t lr_range_test_step_size = 2000;  ///< LRRangeTest: lr_range_test_step_size
  double lr_range_test_step_rate = 1.0;  ///< LRRangeTest: lr_range_test_step_rate
  bool lr_range_test_staircase = false;  ///< LRRangeTest: lr_range_test_staircase
  /// OneCycle (DeepSpeed's 1Cycle): lr rises from cycle_min_lr to cycle_max_lr
  /// over the first step size and falls back over the second, then decays;
  /// with cycle_momentum (Adam-type optimizers) beta1 moves the opposite way
  /// between cycle_max_mom and cycle_min_mom, and beta2 is 0.99, as DeepSpeed sets it.
  double cycle_min_lr = 0.0, cycle_max_lr = 0.0;  ///< (see cycle_min_lr)
  double decay_lr_rate = 0.0;  ///< OneCycle: decay_lr_rate, the lr's decay after the cycle
  int64_t cycle_first_step_size = 2000;  ///< OneCycle: cycle_first_step_size
  int64_t cycle_second_step_size = 2000;  ///< DeepSpeed: unset means the first's
  int64_t cycle_first_stair_count = 0;    ///< 0: no staircase
  int64_t cycle_second_stair_count = 0;   ///< unset means the first's
  int64_t decay_step_size = 0;            ///< 0: no decay after the cycle
  bool cycle_momentum = true;  ///< OneCycle: cycle_momentum (Adam-type optimizers' beta1)
  /// OneCycle: the range beta1 moves through.
  double cycle_min_mom = 0.8, cycle_max_mom = 0.9;  ///< (see cycle_min_mom)
  double decay_mom_rate = 0.0;  ///< OneCycle: decay_mom_rate
};

/// Which allocator torch's CPU tensors come from (`zero_cpp.cpu_allocator`).
/// Caching: blocks of 1 MiB and more are kept mapped between uses and reused
/// by size, within the peak the step already held (src/memory/large_block_cache.h);
/// smaller ones, and Torch, are torch's own default allocator.
enum class CpuAllocator { Caching, Torch };
/// Its ds_config spelling ("caching", "torch").
const char* to_string(CpuAllocator);

/// Where offloaded state lives: nowhere (on the model's device), host memory, or NVMe (ZeRO-Infinity: the optimizer's state only, so far).
enum class OffloadDevice { None, CPU, NVMe };
/// Its ds_config spelling ("none", "cpu", "nvme").
const char* to_string(OffloadDevice);

/// An `offload_optimizer` / `offload_param` block of `zero_optimization`.
struct OffloadConfig {
  OffloadDevice device = OffloadDevice::None;  ///< device
  bool pin_memory = true;  ///< pin_memory: page-locked host buffers (for device copies)
  /// nvme_path: the directory the swap files go in (device "nvme", where it
  /// is required; docs/nvme.md).
  std::string nvme_path;
  int64_t buffer_count = 4;            ///< buffer_count (offload_param's default is 5)
  int64_t buffer_size = 100'000'000;   ///< buffer_size (offload_param only)
  int64_t max_in_cpu = 1'000'000'000;  ///< max_in_cpu (offload_param only)
  bool pipeline_read = false;   ///< offload_optimizer.pipeline_read: read group k+1 while k is updated
  bool pipeline_write = false;  ///< offload_optimizer.pipeline_write: write group k while k+1 is updated
};

/// The ds_config `aio` block: the asynchronous I/O engine behind NVMe
/// offload (io/aio_engine.h), with DeepSpeed's defaults.
struct AioSettings {
  int64_t block_size = 1 << 20;  ///< block_size: bytes per request piece
  int64_t queue_depth = 8;       ///< queue_depth: pieces in flight per thread
  int64_t thread_count = 1;      ///< intra_op_parallelism (thread_count before DeepSpeed 0.15)
  bool single_submit = false;    ///< single_submit: submit pieces one at a time
  bool overlap_events = true;    ///< overlap_events: submit new pieces while earlier ones complete
};

/// The `zero_optimization` block (DeepSpeed's key names; stage 3 keys without their `stage3_` prefix here).
struct ZeroConfig {
  int64_t stage = 0;  ///< stage: 0 (DDP-like), 1 (optimizer state sharded), 2 (+ grads), 3 (+ params)
  bool contiguous_gradients = true;  ///< contiguous_gradients (grads always land in flat buffers here)
  /// DeepSpeed: unset means true for stage 3 and false otherwise.
  std::optional<bool> overlap_comm_given;
  /// overlap_comm as DeepSpeed resolves it.
  bool overlap_comm() const { return overlap_comm_given.value_or(stage == 3); }
  int64_t reduce_bucket_size = 500'000'000;  ///< reduce_bucket_size: elements per flat group
  int64_t prefetch_bucket_size = 50'000'000;          ///< stage3_prefetch_bucket_size
  int64_t param_persistence_threshold = 100'000;      ///< stage3_param_persistence_threshold
  int64_t max_live_parameters = 1'000'000'000;        ///< stage3_max_live_parameters
  int64_t max_reuse_distance = 1'000'000'000;         ///< stage3_max_reuse_distance
  /// ZeRO++ hpZ (zero_hpz_partition_size): stage 3 keeps a second copy of
  /// each unit's params sharded over one host's ranks, so backward gathers
  /// stay inside the host. 1: off. Otherwise the data-parallel group's ranks
  /// per host (checked at engine construction); no effect below stage 3.
  int64_t hpz_partition_size = 1;
  /// false skips the global grad norm at fp32 stages 1-2 (DeepSpeed's rule: only
  /// without clipping or optimizer offload); last_grad_norm() is then NaN.
  bool compute_grad_norm = true;
  /// offload_param needs stage 3. "cpu": with a CPU model it changes
  /// nothing (the state already lives in host memory); with a CUDA model the
  /// optimizer state (and at stage 3 the param shards) live in host memory
  /// (ZeRO-Offload; docs/gpu.md). "nvme" (the optimizer only, so far): the
  /// fp32 master and optimizer state live in swap files under nvme_path,
  /// paged in group by group for the step (ZeRO-Infinity; docs/nvme.md).
  OffloadConfig offload_optimizer;
  OffloadConfig offload_param;  ///< (see offload_optimizer)
  // (reduce_scatter, allgather_partitions, allgather_bucket_size,
  // stage3_model_persistence_threshold, sub_group_size,
  // stage3_gather_16bit_weights_on_model_save, ignore_unused_parameters and
  // round_robin_gradients are accepted and type-checked but inert: see
  // docs/config.md.)
};

/// The three batch numbers after resolution against the data-parallel size:
/// train_batch_size = micro_batch_per_gpu * gradient_accumulation_steps * dp_size.
struct BatchConfig {
  int64_t train_batch_size = 0;  ///< train_batch_size: samples per optimizer step, over all ranks
  int64_t micro_batch_per_gpu = 0;  ///< train_micro_batch_size_per_gpu: samples per forward on one rank
  int64_t gradient_accumulation_steps = 0;  ///< gradient_accumulation_steps: micro-batches per optimizer step
};

/// A ds_config.json, parsed (from_file). Fields are DeepSpeed's keys; zero-cpp's own settings come from its `zero_cpp` block. docs/config.md lists every key.
struct Config {
  /// Batch keys as given (unset or "auto" means: derive from the others).
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;  ///< (see train_batch_size)
  std::optional<int64_t> gradient_accumulation_steps;  ///< (see train_batch_size)

  double gradient_clipping = 1.0;  ///< DeepSpeed >= 0.19.3 default; 0 = no clipping
  /// steps_per_print: rank 0's progress line every this many optimizer
  /// steps; 0 (DeepSpeed's default, null) prints none.
  int64_t steps_per_print = 0;
  /// DeepSpeed's timers: forward, backward, reduction, step and all-gather
  /// times, printed with the progress line (ms per optimizer step).
  bool wall_clock_breakdown = false;
  /// DeepSpeed's csv_monitor: rank 0 writes one CSV per event
  /// (Train/Samples/train_loss, .../lr, ...) into output_path/job_name.
  struct CsvMonitor {
    bool enabled = false;  ///< csv_monitor.enabled
    std::string output_path;  ///< csv_monitor.output_path
    std::string job_name = "DeepSpeedJobName";  ///< csv_monitor.job_name
  } csv_monitor;  ///< the `csv_monitor` block
  AioSettings aio;  ///< the `aio` block: NVMe offload's I/O engine
  FP16Config fp16;  ///< the `fp16` block
  BF16Config bf16;  ///< the `bf16` block (also spelled `bfloat16`)
  OptimizerConfig optimizer;  ///< the `optimizer` block
  SchedulerConfig scheduler;  ///< the `scheduler` block
  std::optional<DType> communication_data_type;  ///< default: the params' dtype
  std::optional<DType> grad_accum_dtype;         ///< data_types.grad_accum_dtype
  /// data_types.buffer_dtype: the dtype floating-point buffers are cast to
  /// (DeepSpeed 0.19.8's key). Unset, they follow keep_buffer_dtype.
  std::optional<DType> buffer_dtype;
  ZeroConfig zero;  ///< the `zero_optimization` block
  /// "zero_cpp": {"comm_fast_path": false} routes every collective to the
  /// backend (Gloo) instead of the shared-memory transport between ranks on
  /// one host (as ZERO_COMM_FASTPATH=off does).
  bool comm_fast_path = true;
  /// "zero_cpp": {"broadcast_buffers": false} stops the engine from copying
  /// rank 0's module buffers (BatchNorm running statistics) to every rank at
  /// each step boundary (DDP's broadcast_buffers; on by default, as there).
  bool broadcast_buffers = true;
  /// "zero_cpp": {"keep_buffer_dtype": true} leaves floating-point buffers in
  /// the dtype the model holds them in under 16-bit compute, as DeepSpeed
  /// 0.19.8 does (the Python front end's default: a rotary table kept in
  /// fp32). Off, as the C++ API's default, they move to the compute dtype
  /// with the frozen params, as torch's CPU batch_norm wants its running
  /// statistics in its weight's dtype.
  bool keep_buffer_dtype = false;
  /// "zero_cpp": {"malloc_mmap_threshold": bytes}: the engine fixes glibc's
  /// mmap threshold there, so freed activations and scratch go back to the OS
  /// instead of holding the heap at its high-water mark (src/memory/malloc_policy.h);
  /// 0 leaves glibc's moving threshold alone, as does MALLOC_MMAP_THRESHOLD_.
  int64_t malloc_mmap_threshold = 1 << 20;
  /// "zero_cpp": {"cpu_allocator": "caching" | "torch"}: the allocator the
  /// engine installs for torch's CPU tensors, process-wide (CpuAllocator).
  CpuAllocator cpu_allocator = CpuAllocator::Caching;
  /// "zero_cpp": {"compute_dtype": "auto" | "fp32" | "bf16" | "fp16"}: the
  /// dtype the module's params have in forward and backward under bf16/fp16
  /// (they are stored and communicated in 16 bits either way). "auto" (the
  /// default, nullopt here) times a GEMM in both on this CPU at engine
  /// construction and takes the faster (engine/precision.h); a 16-bit value
  /// must be the enabled block's.
  std::optional<DType> compute_dtype;
  /// "zero_cpp": {"stage3_gather_fp32_master": true}: stage 3 gathers the
  /// fp32 master shards and downcasts the gathered buffer after (twice the
  /// bytes, a cast kernel, an fp32 buffer per gather) -- the unfused path
  /// seed 000 replaced, kept as the baseline `gpu-bench` measures the fused
  /// one against. Same values; only with 16-bit compute (else nothing to fuse).
  bool stage3_gather_fp32_master = false;

  /// Parses and validates; throws ConfigError naming the offending key.
  static Config from_json(const nlohmann::json& j);
  /// Parses a JSON text (comments allowed) as from_json().
  static Config from_string(const std::string& text);
  /// Reads and parses a ds_config file as from_json(); the error names the file too.
  static Config from_file(const std::string& path);

  /// Fills in the batch numbers DeepSpeed derives, or throws when the given
  /// ones disagree with `dp_size`.
  BatchConfig resolve_batch(int64_t dp_size) const;

  /// 16-bit storage dtype when bf16/fp16 is enabled, else fp32.
  DType param_dtype() const;
  /// What grads travel in: communication_data_type, else param_dtype().
  DType comm_dtype() const { return communication_data_type.value_or(param_dtype()); }

  /// The config with every default filled in, under DeepSpeed's key names
  /// (for logs; from_json(to_json()) gives back an equal config).
  nlohmann::json to_json() const;
};

/// `config` with `optimizer` as its optimizer, for a ds_config without an
/// "optimizer" block (the client optimizer of deepspeed.initialize). Throws
/// ConfigError when the config has one too. A WarmupLR without warmup_max_lr
/// then warms up to this optimizer's lr.
Config with_optimizer(Config config, OptimizerConfig optimizer);

}  // namespace zero
