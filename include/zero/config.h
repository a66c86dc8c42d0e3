// DeepSpeed's ds_config.json as typed structs: same key names, aliases and
// defaults, so a DeepSpeed user's file works unchanged. Parsing is strict:
// an unknown key, a wrong type or value, or a DeepSpeed feature this project
// does not implement is a ConfigError that names the key.
//
// This header does not include torch, so tools and tests that only read
// configs build without it.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace zero {

class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Storage / communication precision of params and grads.
enum class DType { fp32, fp16, bf16 };
const char* to_string(DType);

struct FP16Config {
  bool enabled = false;
  double loss_scale = 0.0;  // 0 = dynamic loss scaling
  int64_t initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

struct BF16Config {
  bool enabled = false;
};

enum class OptimizerType { Adam, AdamW, SGD, Lion, Adagrad, Lamb, Muon };
const char* to_string(OptimizerType);

struct OptimizerConfig {
  OptimizerType type = OptimizerType::AdamW;
  bool given = false;  // false: no "optimizer" block (the engine then needs one from code)
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  // DeepSpeed's "Adam" is decoupled-weight-decay Adam (AdamW) unless
  // adam_w_mode is false; "AdamW" is always decoupled.
  bool adam_w_mode = true;
  double momentum = 0.0;  // SGD
  double dampening = 0.0;
  bool nesterov = false;
  double initial_accumulator_value = 0.0;  // Adagrad: where the sum of squared grads starts
  // LAMB (DeepSpeed's FusedLamb): the trust ratio's clamp, and whether the
  // step size carries Adam's bias correction.
  double max_coeff = 10.0, min_coeff = 0.01;
  bool bias_correction = true;
  // Muon (DeepSpeed's MuonWithAuxAdam): `lr` and `momentum` (0.95) are the
  // Muon params' (2-D+ weights whose name holds neither "embed" nor
  // "lm_head"); the others run AdamW at adam_lr with betas (0.9, 0.95) and
  // eps 1e-10. ns_method: "gram" or "standard" (the same orthogonalisation;
  // computed here by the standard quintic Newton-Schulz iteration, 5 steps).
  double adam_lr = 3e-4;
  std::string ns_method = "gram";

  // An optimizer from code (zero::with_optimizer below), run by the same
  // fused kernels as the config's.
  static OptimizerConfig adamw(double lr, double weight_decay = 0.01, std::array<double, 2> betas = {0.9, 0.999},
                               double eps = 1e-8);
  static OptimizerConfig adam(double lr, double weight_decay = 0.0, std::array<double, 2> betas = {0.9, 0.999},
                              double eps = 1e-8);  // L2 weight decay (torch.optim.Adam)
  static OptimizerConfig sgd(double lr, double momentum = 0.0, double weight_decay = 0.0, bool nesterov = false);
  // Defaults are DeepSpeed's (FusedLion / DeepSpeedCPULion; torch.optim.Adagrad
  // and DeepSpeedCPUAdagrad), which differ from the papers' (Lion: beta2 0.99).
  static OptimizerConfig lion(double lr = 1e-3, double weight_decay = 0.0, std::array<double, 2> betas = {0.9, 0.999});
  static OptimizerConfig adagrad(double lr = 1e-2, double weight_decay = 0.0, double eps = 1e-10);
  static OptimizerConfig lamb(double lr = 1e-3, double weight_decay = 0.0, std::array<double, 2> betas = {0.9, 0.999},
                              double eps = 1e-8);
  // DeepSpeed's Muon: lr 0.02 and momentum 0.95 for the Muon params, the
  // AdamW fallback at adam_lr 3e-4, betas (0.9, 0.95), eps 1e-10.
  static OptimizerConfig muon(double lr = 0.02, double weight_decay = 0.0, double momentum = 0.95,
                              double adam_lr = 3e-4, std::array<double, 2> betas = {0.9, 0.95}, double eps = 1e-10);
};

enum class SchedulerType { None, WarmupLR, WarmupDecayLR, WarmupCosineLR, LRRangeTest, OneCycle };
const char* to_string(SchedulerType);
enum class WarmupType { Log, Linear };

struct SchedulerConfig {
  SchedulerType type = SchedulerType::None;
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::Log;
  int64_t total_num_steps = 0;     // WarmupDecayLR, WarmupCosineLR (required there)
  double warmup_min_ratio = 0.0;   // WarmupCosineLR
  double cos_min_ratio = 1e-4;     // WarmupCosineLR
  bool warmup_max_lr_follows_optimizer = false;  // WarmupLR without warmup_max_lr: the optimizer's lr
  // LRRangeTest: min_lr * (1 + step_rate * (iteration + 1) / step_size), the
  // interval floored when staircase.
  double lr_range_test_min_lr = 1e-3;
  int64_t lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
  // OneCycle (DeepSpeed's 1Cycle): lr rises from cycle_min_lr to cycle_max_lr
  // over the first step size and falls back over the second, then decays;
  // with cycle_momentum (Adam-type optimizers) beta1 moves the opposite way
  // between cycle_max_mom and cycle_min_mom, and beta2 is 0.99, as DeepSpeed sets it.
  double cycle_min_lr = 0.0, cycle_max_lr = 0.0;
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  int64_t cycle_second_step_size = 2000;  // DeepSpeed: unset means the first's
  int64_t cycle_first_stair_count = 0;    // 0: no staircase
  int64_t cycle_second_stair_count = 0;   // unset means the first's
  int64_t decay_step_size = 0;            // 0: no decay after the cycle
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8, cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
};

enum class OffloadDevice { None, CPU, NVMe };
const char* to_string(OffloadDevice);

struct OffloadConfig {
  OffloadDevice device = OffloadDevice::None;
  bool pin_memory = true;
};

struct ZeroConfig {
  int64_t stage = 0;
  bool contiguous_gradients = true;
  // DeepSpeed: unset means true for stage 3 and false otherwise.
  std::optional<bool> overlap_comm_given;
  bool overlap_comm() const { return overlap_comm_given.value_or(stage == 3); }
  int64_t reduce_bucket_size = 500'000'000;
  int64_t prefetch_bucket_size = 50'000'000;          // stage3_prefetch_bucket_size
  int64_t param_persistence_threshold = 100'000;      // stage3_param_persistence_threshold
  int64_t max_live_parameters = 1'000'000'000;        // stage3_max_live_parameters
  int64_t max_reuse_distance = 1'000'000'000;         // stage3_max_reuse_distance
  // ZeRO++ hpZ (zero_hpz_partition_size): stage 3 keeps a second copy of
  // each unit's params sharded over one host's ranks, so backward gathers
  // stay inside the host. 1: off. Otherwise the data-parallel group's ranks
  // per host (checked at engine construction); no effect below stage 3.
  int64_t hpz_partition_size = 1;
  // false skips the global grad norm at fp32 stages 1-2 (DeepSpeed's rule: only
  // without clipping or optimizer offload); last_grad_norm() is then NaN.
  bool compute_grad_norm = true;
  // Validated (offload_param needs stage 3); on CPU the state already lives
  // in host memory, so they change nothing yet.
  OffloadConfig offload_optimizer;
  OffloadConfig offload_param;
  // (reduce_scatter, allgather_partitions, allgather_bucket_size,
  // stage3_model_persistence_threshold, sub_group_size,
  // stage3_gather_16bit_weights_on_model_save, ignore_unused_parameters and
  // round_robin_gradients are accepted and type-checked but inert: see
  // docs/config.md.)
};

// The three batch numbers after resolution against the data-parallel size:
// train_batch_size = micro_batch_per_gpu * gradient_accumulation_steps * dp_size.
struct BatchConfig {
  int64_t train_batch_size = 0;
  int64_t micro_batch_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;
};

struct Config {
  // Batch keys as given (unset or "auto" means: derive from the others).
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;

  double gradient_clipping = 1.0;  // DeepSpeed >= 0.19.3 default; 0 = no clipping
  int64_t steps_per_print = 10;
  // DeepSpeed's timers: forward, backward, reduction, step and all-gather
  // times, printed with the progress line (ms per optimizer step).
  bool wall_clock_breakdown = false;
  // DeepSpeed's csv_monitor: rank 0 writes one CSV per event
  // (Train/Samples/train_loss, .../lr, ...) into output_path/job_name.
  struct CsvMonitor {
    bool enabled = false;
    std::string output_path;
    std::string job_name = "DeepSpeedJobName";
  } csv_monitor;
  FP16Config fp16;
  BF16Config bf16;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  std::optional<DType> communication_data_type;  // default: the params' dtype
  std::optional<DType> grad_accum_dtype;         // data_types.grad_accum_dtype
  ZeroConfig zero;
  // "zero_cpp": {"comm_fast_path": false} routes every collective to the
  // backend (Gloo) instead of the shared-memory transport between ranks on
  // one host (as ZERO_COMM_FASTPATH=off does).
  bool comm_fast_path = true;
  // "zero_cpp": {"broadcast_buffers": false} stops the engine from copying
  // rank 0's module buffers (BatchNorm running statistics) to every rank at
  // each step boundary (DDP's broadcast_buffers; on by default, as there).
  bool broadcast_buffers = true;
  // "zero_cpp": {"malloc_mmap_threshold": bytes}: the engine fixes glibc's
  // mmap threshold there, so freed activations and scratch go back to the OS
  // instead of holding the heap at its high-water mark (src/memory/malloc_policy.h);
  // 0 leaves glibc's moving threshold alone, as does MALLOC_MMAP_THRESHOLD_.
  int64_t malloc_mmap_threshold = 1 << 20;
  // "zero_cpp": {"compute_dtype": "auto" | "fp32" | "bf16" | "fp16"}: the
  // dtype the module's params have in forward and backward under bf16/fp16
  // (they are stored and communicated in 16 bits either way). "auto" (the
  // default, nullopt here) times a GEMM in both on this CPU at engine
  // construction and takes the faster (engine/precision.h); a 16-bit value
  // must be the enabled block's.
  std::optional<DType> compute_dtype;
  // "zero_cpp": {"stage3_gather_fp32_master": true}: stage 3 gathers the
  // fp32 master shards and downcasts the gathered buffer after (twice the
  // bytes, a cast kernel, an fp32 buffer per gather) -- the unfused path
  // seed 000 replaced, kept as the baseline `gpu-bench` measures the fused
  // one against. Same values; only with 16-bit compute (else nothing to fuse).
  bool stage3_gather_fp32_master = false;

  // Parses and validates; throws ConfigError naming the offending key.
  static Config from_json(const nlohmann::json& j);
  static Config from_string(const std::string& text);
  static Config from_file(const std::string& path);

  // Fills in the batch numbers DeepSpeed derives, or throws when the given
  // ones disagree with `dp_size`.
  BatchConfig resolve_batch(int64_t dp_size) const;

  // 16-bit storage dtype when bf16/fp16 is enabled, else fp32.
  DType param_dtype() const;
  // What grads travel in: communication_data_type, else param_dtype().
  DType comm_dtype() const { return communication_data_type.value_or(param_dtype()); }

  // The config with every default filled in, under DeepSpeed's key names
  // (for logs; from_json(to_json()) gives back an equal config).
  nlohmann::json to_json() const;
};

// `config` with `optimizer` as its optimizer, for a ds_config without an
// "optimizer" block (the client optimizer of deepspeed.initialize). Throws
// ConfigError when the config has one too. A WarmupLR without warmup_max_lr
// then warms up to this optimizer's lr.
Config with_optimizer(Config config, OptimizerConfig optimizer);

}  // namespace zero
