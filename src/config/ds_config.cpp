// ds_config parsing: DeepSpeed's key names, aliases and defaults.
//
// Policy for DeepSpeed keys this project does not implement: they are
// accepted only at DeepSpeed's default value (then the run behaves exactly as
// configured) and are an error naming the key otherwise. Keys DeepSpeed does
// not know are errors too, with a did-you-mean suggestion.
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "config/json_reader.h"
#include "zero/config.h"

namespace zero {

using nlohmann::json;
using config_detail::ObjectReader;

namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

const std::vector<std::string> kDTypeNames{"fp32", "fp16", "bf16"};

DType parse_dtype(const std::string& s) {
  if (s == "fp16") return DType::fp16;
  if (s == "bf16") return DType::bf16;
  return DType::fp32;
}

// DeepSpeed also spells the dtypes as torch names in a few places.
// null is DeepSpeed's default for these keys (None: follow the params' dtype).
std::optional<DType> read_dtype(ObjectReader& r, const std::string& key) {
  if (const json* v = r.find(key); v && v->is_null()) return std::nullopt;
  auto s = r.get_opt_choice(key, {"fp32", "fp16", "bf16", "float32", "float16", "bfloat16"}, true);
  if (!s) return std::nullopt;
  if (*s == "float32") return DType::fp32;
  if (*s == "float16") return DType::fp16;
  if (*s == "bfloat16") return DType::bf16;
  return parse_dtype(*s);
}

bool read_enabled(ObjectReader& block) {
  const json* v = block.find("enabled");
  if (!v) return false;
  if (ObjectReader::is_auto(v))
    block.fail("enabled", "is \"auto\": the HF Trainer resolves it from its --fp16/--bf16 "
                          "arguments; give true or false");
  if (!v->is_boolean()) return block.bad_value("enabled", *v, "true or false"), false;
  return v->get<bool>();
}

// Blocks of DeepSpeed features outside this project (monitors, profilers...):
// present and disabled is fine; enabled is an error naming the block.
void disabled_feature_block(ObjectReader& top, const std::string& key) {
  ObjectReader b = top.child(key);
  if (read_enabled(b))
    b.fail("enabled", "= true: " + key + " is not supported by zero-cpp");
  // The rest of a disabled block's keys configure a feature that is off.
  b.accept_all_remaining();
}

// DeepSpeed's checkpoint block. tag_validation is checked (the Python front
// end carries it out; the C++ API's saves always agree on their tag); the
// writer's settings say how DeepSpeed writes its files, not what, so any are
// taken; a universal checkpoint and node-local storage are refused: zero-cpp
// reads neither (its own checkpoints load at any world size and stage).
void read_checkpoint_block(ObjectReader& top) {
  ObjectReader ckpt = top.child("checkpoint");
  ckpt.get_choice("tag_validation", "Warn", {"Ignore", "Warn", "Fail"}, /*ignore_case=*/true);
  ckpt.unsupported_unless("load_universal", false);
  ckpt.unsupported_unless("use_node_local_storage", false);
  ckpt.accept_any("parallel_write");  // pipeline stages' writes: there is no pipeline
  ckpt.accept_any("writer");
  ckpt.accept_any("checkpoint_serialization");
  ckpt.finish();
}

// DeepSpeed's activation-checkpointing settings (deepspeed.checkpointing)
// have no "enabled" key: the block is always read, so each key is accepted
// only at DeepSpeed's default. zero-cpp has no counterpart of the
// deepspeed.checkpointing API these keys configure.
void read_activation_checkpointing(ObjectReader& top) {
  ObjectReader r = top.child("activation_checkpointing");
  r.unsupported_unless("partition_activations", false);
  r.unsupported_unless("contiguous_memory_optimization", false);
  r.unsupported_unless("cpu_checkpointing", false);
  r.unsupported_unless("number_checkpoints", nullptr);
  r.unsupported_unless("synchronize_checkpoint_boundary", false);
  r.unsupported_unless("profile", false);
  r.finish();
}

FP16Config read_fp16(ObjectReader& top) {
  FP16Config c;
  ObjectReader r = top.child("fp16");
  c.enabled = read_enabled(r);
  r.auto_means_default();
  c.loss_scale = r.get_double("loss_scale", c.loss_scale, 0.0, 1e30);
  c.initial_scale_power = r.get_int("initial_scale_power", c.initial_scale_power, 0, 126);
  c.loss_scale_window = r.get_int("loss_scale_window", c.loss_scale_window, 1, kMaxInt);
  c.hysteresis = r.get_int("hysteresis", c.hysteresis, 1, kMaxInt);
  c.consecutive_hysteresis = r.get_bool("consecutive_hysteresis", c.consecutive_hysteresis);
  c.min_loss_scale = r.get_double("min_loss_scale", c.min_loss_scale, 0.0, 1e30);
  r.unsupported_unless("auto_cast", false);
  r.unsupported_unless("fp16_master_weights_and_grads", false);
  r.finish();
  return c;
}

BF16Config read_bf16(ObjectReader& top) {
  BF16Config c;
  ObjectReader r = top.child("bf16", {"bfloat16"});
  c.enabled = read_enabled(r);
  r.auto_means_default();
  r.unsupported_unless("immediate_grad_update", false);
  // DeepSpeed >= 0.19.3 checks bf16 grads for inf/nan and skips such steps; so does zero-cpp.
  r.unsupported_unless("check_grad_overflow", true);
  r.unsupported_unless("bf16_master_weights_and_grads", false);
  r.unsupported_unless("bf16_optimizer_states", false);
  r.finish();
  return c;
}

// betas: two numbers in [0, 1) (Adam, Lion).
void read_betas(ObjectReader& p, OptimizerConfig& c) {
  const json* b = p.find("betas");
  if (!b) return;
  if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number() || !(*b)[1].is_number() ||
      (*b)[0].get<double>() < 0 || (*b)[0].get<double>() >= 1 || (*b)[1].get<double>() < 0 ||
      (*b)[1].get<double>() >= 1)
    return p.bad_value("betas", *b, "two numbers in [0, 1), e.g. [0.9, 0.999]");
  c.betas = {(*b)[0].get<double>(), (*b)[1].get<double>()};
}

// OneCycle's cycle_momentum moves an Adam-type optimizer's beta1; Muon's
// two kinds of param have two momenta (DeepSpeed's OneCycle finds no betas
// in MuonWithAuxAdam's defaults), so that pairing is refused.
void check_optimizer_with_scheduler(const Config& c) {
  if (c.optimizer.type == OptimizerType::Muon && c.scheduler.type == SchedulerType::OneCycle &&
      c.scheduler.cycle_momentum)
    throw ConfigError("ds_config: scheduler OneCycle with cycle_momentum = true is not supported with optimizer "
                      "Muon; set scheduler.params.cycle_momentum to false");
}

OptimizerConfig read_optimizer(ObjectReader& top) {
  OptimizerConfig c;
  ObjectReader r = top.child("optimizer");
  auto type = r.get_opt_choice("type", {"Adam", "AdamW", "SGD", "Lion", "Adagrad", "Lamb", "Muon"},
                                /*ignore_case=*/true);
  ObjectReader p = r.child("params");
  r.finish();
  if (!type) {
    p.finish();
    return c;
  }
  c.given = true;
  c.type = *type == "Adam" ? OptimizerType::Adam : *type == "AdamW" ? OptimizerType::AdamW
           : *type == "SGD"  ? OptimizerType::SGD
           : *type == "Lion" ? OptimizerType::Lion
           : *type == "Lamb" ? OptimizerType::Lamb
           : *type == "Muon" ? OptimizerType::Muon
                             : OptimizerType::Adagrad;
  if (p.find("max_grad_norm"))
    p.fail("max_grad_norm", "is not an optimizer parameter; use the top-level gradient_clipping");
  // Each type's defaults are its DeepSpeed class's constructor's.
  if (c.type == OptimizerType::Lion) c = OptimizerConfig::lion();
  if (c.type == OptimizerType::Adagrad) c = OptimizerConfig::adagrad();
  if (c.type == OptimizerType::Lamb) c = OptimizerConfig::lamb();
  if (c.type == OptimizerType::Muon) c = OptimizerConfig::muon();
  c.lr = p.get_double("lr", c.lr, 0.0, 1e6);
  c.weight_decay = p.get_double("weight_decay", c.weight_decay, 0.0, 1e6);
  if (c.type == OptimizerType::SGD) {
    c.momentum = p.get_double("momentum", c.momentum, 0.0, 1.0);
    c.dampening = p.get_double("dampening", c.dampening, 0.0, 1.0);
    c.nesterov = p.get_bool("nesterov", c.nesterov);
    if (c.nesterov && (c.momentum <= 0.0 || c.dampening != 0.0))
      p.fail("nesterov", "= true requires momentum > 0 and dampening = 0");
  } else if (c.type == OptimizerType::Lion) {
    read_betas(p, c);  // FusedLion and DeepSpeedCPULion take lr, betas, weight_decay only
  } else if (c.type == OptimizerType::Lamb) {
    read_betas(p, c);  // FusedLamb's keys
    c.eps = p.get_double("eps", c.eps, 0.0, 1.0);
    c.bias_correction = p.get_bool("bias_correction", true);
    c.max_coeff = p.get_double("max_coeff", c.max_coeff, 0.0, 1e6);
    c.min_coeff = p.get_double("min_coeff", c.min_coeff, 0.0, 1e6);
    if (c.min_coeff > c.max_coeff) p.fail("min_coeff", "must not exceed max_coeff");
    p.unsupported_unless("eps_inside_sqrt", false);
    p.unsupported_unless("amsgrad", false);
  } else if (c.type == OptimizerType::Muon) {
    // DeepSpeed's engine passes these to MuonWithAuxAdam: lr to both kinds
    // of param, muon_lr / adam_lr override it for one kind; momentum and
    // ns_method to the Muon params, betas and eps to the AdamW ones.
    if (p.find("lr")) c.adam_lr = c.lr;
    c.lr = p.get_double("muon_lr", c.lr, 0.0, 1e6);
    c.adam_lr = p.get_double("adam_lr", c.adam_lr, 0.0, 1e6);
    c.momentum = p.get_double("momentum", c.momentum, 0.0, 1.0);
    if (c.momentum >= 1.0) p.fail("momentum", "must be in [0, 1)");
    c.ns_method = p.get_choice("ns_method", c.ns_method, {"gram", "standard"});
    read_betas(p, c);
    c.eps = p.get_double("eps", c.eps, 0.0, 1.0);
  } else if (c.type == OptimizerType::Adagrad) {
    // torch.optim.Adagrad's keys (DeepSpeed builds it without offload;
    // DeepSpeedCPUAdagrad takes lr, eps, weight_decay).
    c.eps = p.get_double("eps", c.eps, 0.0, 1.0);
    c.initial_accumulator_value = p.get_double("initial_accumulator_value", 0.0, 0.0, 1e6);
    p.unsupported_unless("lr_decay", 0);
    p.unsupported_unless("amsgrad", false);
    p.unsupported_unless("maximize", false);
    p.accept_any("foreach");  // which implementation; ours is one kernel either way
    p.accept_any("fused");
  } else {
    read_betas(p, c);
    c.eps = p.get_double("eps", c.eps, 0.0, 1.0);
    // As DeepSpeed: AdamW is always decoupled; Adam is unless adam_w_mode is false.
    c.adam_w_mode = p.get_bool("adam_w_mode", true) || c.type == OptimizerType::AdamW;
    p.unsupported_unless("amsgrad", false);
    // Which implementation (ours is one kernel either way) -- but with it
    // DeepSpeed builds torch.optim.AdamW from the params as given, and
    // torch's AdamW decays by 0.01 where no weight_decay is given
    // (FusedAdam's default is 0; torch.optim.Adam's is 0 too).
    if (p.get_bool("torch_adam", false) && c.adam_w_mode && !p.find("weight_decay")) c.weight_decay = 0.01;
    p.unsupported_unless("bias_correction", true);
  }
  p.finish();
  c.given = true;
  return c;
}

SchedulerConfig read_one_cycle(ObjectReader& p) {
  SchedulerConfig c;
  c.type = SchedulerType::OneCycle;
  // Both bounds are required (DeepSpeed's constructor has no defaults for them).
  constexpr double kUnset = std::numeric_limits<double>::quiet_NaN();
  c.cycle_min_lr = p.get_double("cycle_min_lr", kUnset, 0.0, 1e6);
  c.cycle_max_lr = p.get_double("cycle_max_lr", kUnset, 0.0, 1e6);
  if (std::isnan(c.cycle_min_lr)) p.fail("cycle_min_lr", "is required for OneCycle");
  if (std::isnan(c.cycle_max_lr)) p.fail("cycle_max_lr", "is required for OneCycle");
  c.decay_lr_rate = p.get_double("decay_lr_rate", 0.0, 0.0, 1e6);
  c.cycle_first_step_size = p.get_int("cycle_first_step_size", c.cycle_first_step_size, 1, kMaxInt);
  c.cycle_second_step_size = p.get_int("cycle_second_step_size", c.cycle_first_step_size, 0, kMaxInt);
  c.cycle_first_stair_count = p.get_int("cycle_first_stair_count", 0, 0, kMaxInt);
  c.cycle_second_stair_count = p.get_int("cycle_second_stair_count", c.cycle_first_stair_count, 0, kMaxInt);
  c.decay_step_size = p.get_int("decay_step_size", 0, 0, kMaxInt);
  c.cycle_momentum = p.get_bool("cycle_momentum", true);
  c.cycle_min_mom = p.get_double("cycle_min_mom", c.cycle_min_mom, 0.0, 1.0);
  c.cycle_max_mom = p.get_double("cycle_max_mom", c.cycle_max_mom, 0.0, 1.0);
  c.decay_mom_rate = p.get_double("decay_mom_rate", 0.0, 0.0, 1e6);
  c.last_batch_iteration = p.get_int("last_batch_iteration", -1, -1, kMaxInt);
  p.finish();
  return c;
}

SchedulerConfig read_scheduler(ObjectReader& top) {
  SchedulerConfig c;
  ObjectReader r = top.child("scheduler");
  auto type = r.get_opt_choice("type", {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "LRRangeTest", "OneCycle"});
  ObjectReader p = r.child("params");
  r.finish();
  if (!type) {
    p.finish();
    return c;
  }
  if (*type == "LRRangeTest") {
    c.type = SchedulerType::LRRangeTest;
    c.lr_range_test_min_lr = p.get_double("lr_range_test_min_lr", c.lr_range_test_min_lr, 0.0, 1e6);
    c.lr_range_test_step_size = p.get_int("lr_range_test_step_size", c.lr_range_test_step_size, 1, kMaxInt);
    c.lr_range_test_step_rate = p.get_double("lr_range_test_step_rate", c.lr_range_test_step_rate, 0.0, 1e6);
    c.lr_range_test_staircase = p.get_bool("lr_range_test_staircase", c.lr_range_test_staircase);
    c.last_batch_iteration = p.get_int("last_batch_iteration", -1, -1, kMaxInt);
    p.finish();
    return c;
  }
  if (*type == "OneCycle") return read_one_cycle(p);
  c.type = *type == "WarmupLR" ? SchedulerType::WarmupLR
           : *type == "WarmupDecayLR" ? SchedulerType::WarmupDecayLR
                                      : SchedulerType::WarmupCosineLR;
  c.warmup_num_steps = p.get_int("warmup_num_steps", c.warmup_num_steps, 0, kMaxInt);
  c.warmup_type = p.get_choice("warmup_type", "log", {"log", "linear"}) == "log" ? WarmupType::Log
                                                                               : WarmupType::Linear;
  c.last_batch_iteration = p.get_int("last_batch_iteration", -1, -1, kMaxInt);
  if (c.type == SchedulerType::WarmupCosineLR) {
    c.warmup_min_ratio = p.get_double("warmup_min_ratio", c.warmup_min_ratio, 0.0, 1.0);
    c.cos_min_ratio = p.get_double("cos_min_ratio", c.cos_min_ratio, 0.0, 1.0);
  } else {
    c.warmup_min_lr = p.get_double("warmup_min_lr", c.warmup_min_lr, 0.0, 1e6);
    // DeepSpeed: WarmupLR warms up to the optimizer's lr unless told otherwise;
    // WarmupDecayLR's default is 0.001.
    c.warmup_max_lr = p.get_double("warmup_max_lr", c.type == SchedulerType::WarmupLR ? -1.0 : 1e-3,
                                   0.0, 1e6);
  }
  if (c.type != SchedulerType::WarmupLR) {
    auto total = p.get_opt_int("total_num_steps", 1, kMaxInt);
    if (!total) p.fail("total_num_steps", "is required for " + *type);
    c.total_num_steps = *total;
    if (c.total_num_steps < c.warmup_num_steps)
      p.fail("total_num_steps", "= " + std::to_string(c.total_num_steps) +
                                    " must be >= warmup_num_steps (" +
                                    std::to_string(c.warmup_num_steps) + ")");
  }
  p.finish();
  return c;
}

OffloadConfig read_offload(ObjectReader& zero, const std::string& key, bool is_param) {
  OffloadConfig c;
  ObjectReader r = zero.child(key);
  r.auto_means_default();
  auto dev = r.get_choice("device", "none", {"none", "cpu", "nvme"});
  c.device = dev == "cpu" ? OffloadDevice::CPU : dev == "nvme" ? OffloadDevice::NVMe : OffloadDevice::None;
  c.pin_memory = r.get_bool("pin_memory", true);  // DeepSpeed >= 0.19.5
  // DeepSpeed's null means unset; required only where it is used.
  if (const json* v = r.find("nvme_path"); v && !v->is_null()) {
    if (!v->is_string() || v->get<std::string>().empty())
      r.bad_value("nvme_path", *v, "a directory path");
    else
      c.nvme_path = v->get<std::string>();
  }
  if (c.device == OffloadDevice::NVMe && c.nvme_path.empty())
    r.fail("nvme_path", "is required with device \"nvme\": the directory (on a fast local disk) for the swap files");
  c.buffer_count = r.get_int("buffer_count", is_param ? 5 : 4, 0, 1 << 20);
  if (is_param) {
    c.buffer_size = r.get_size("buffer_size", c.buffer_size);
    c.max_in_cpu = r.get_size("max_in_cpu", c.max_in_cpu);
  } else {
    c.pipeline_read = r.get_bool("pipeline_read", false);
    c.pipeline_write = r.get_bool("pipeline_write", false);
    r.get_bool("fast_init", false);  // how DeepSpeed fills its swap files at start; ours are written once
    r.unsupported_unless("ratio", 1.0);
    r.unsupported_unless("super_offload", false);
    r.accept_any("cpuadam_cores_perc");
  }
  r.finish();
  return c;
}

AioSettings read_aio(ObjectReader& top) {
  AioSettings c;
  ObjectReader r = top.child("aio");
  r.auto_means_default();
  c.block_size = r.get_size("block_size", c.block_size);
  if (c.block_size <= 0 || c.block_size % 4096 != 0)
    r.fail("block_size", "= " + std::to_string(c.block_size) +
                             " must be a positive multiple of 4096 (direct I/O moves whole 4 KiB blocks)");
  c.queue_depth = r.get_int("queue_depth", c.queue_depth, 1, 4096);
  c.thread_count = r.get_int("intra_op_parallelism", c.thread_count, 1, 256, {"thread_count"});
  c.single_submit = r.get_bool("single_submit", c.single_submit);
  c.overlap_events = r.get_bool("overlap_events", c.overlap_events);
  r.unsupported_unless("use_gds", false);  // GPUDirect Storage
  r.finish();
  return c;
}

ZeroConfig read_zero(ObjectReader& top) {
  ZeroConfig c;
  // Legacy form: "zero_optimization": true means stage 1 (DeepSpeed still accepts it).
  if (const json* v = top.find("zero_optimization"); v && v->is_boolean()) {
    c.stage = v->get<bool>() ? 1 : 0;
    return c;
  }
  ObjectReader r = top.child("zero_optimization");
  r.auto_means_default();
  c.stage = r.get_int("stage", 0, 0, 3);
  c.contiguous_gradients = r.get_bool("contiguous_gradients", c.contiguous_gradients);
  if (const json* v = r.find("overlap_comm"); v && !ObjectReader::is_auto(v) && !v->is_null()) {
    if (!v->is_boolean())
      r.bad_value("overlap_comm", *v, "true or false");
    else
      c.overlap_comm_given = v->get<bool>();
  }
  c.reduce_bucket_size = r.get_size("reduce_bucket_size", c.reduce_bucket_size);
  c.prefetch_bucket_size =
      r.get_size("stage3_prefetch_bucket_size", c.prefetch_bucket_size, {"prefetch_bucket_size"});
  c.param_persistence_threshold = r.get_size("stage3_param_persistence_threshold",
                                             c.param_persistence_threshold,
                                             {"param_persistence_threshold"});
  c.max_live_parameters =
      r.get_size("stage3_max_live_parameters", c.max_live_parameters, {"max_live_parameters"});
  c.max_reuse_distance =
      r.get_size("stage3_max_reuse_distance", c.max_reuse_distance, {"max_reuse_distance"});
  c.hpz_partition_size = r.get_int("zero_hpz_partition_size", c.hpz_partition_size, 1, 1 << 20);
  // Inert here, so read (and type-checked) but not kept: reduce_scatter and
  // allgather_partitions only pick DeepSpeed's collective (the result is the
  // same), the others tune what zero-cpp does its own way or not at all.
  r.get_bool("reduce_scatter", true);
  r.get_bool("allgather_partitions", true);
  r.get_size("allgather_bucket_size", 500'000'000);
  r.get_size("stage3_model_persistence_threshold", std::numeric_limits<int64_t>::max(),
             {"model_persistence_threshold"});
  r.get_size("sub_group_size", 1'000'000'000);
  r.get_bool("stage3_gather_16bit_weights_on_model_save", false,
             {"stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save"});
  r.get_bool("ignore_unused_parameters", true);
  r.get_bool("round_robin_gradients", false);
  r.get_bool("save_muon_momentum_buffer_in_memory", false);
  // How DeepSpeed runs its own collectives (a bucketed all-reduce across
  // ranks; stage 3's fetches one by one or as all-reduces): the same values.
  r.get_bool("use_multi_rank_bucket_allreduce", true);
  r.get_bool("use_all_reduce_for_fetch_params", false, {"stage3_use_all_reduce_for_fetch_params"});
  r.get_bool("allgather_sequential", false, {"stage3_allgather_sequential"});
  c.compute_grad_norm = r.get_bool("compute_grad_norm", c.compute_grad_norm);
  c.offload_optimizer = read_offload(r, "offload_optimizer", false);
  c.offload_param = read_offload(r, "offload_param", true);
  if (c.offload_param.device != OffloadDevice::None && c.stage != 3)
    r.fail("offload_param", "requires stage 3 (DeepSpeed offloads params only in stage 3)");
  // Deprecated spellings, mapped as DeepSpeed maps them.
  if (const json* v = r.find("cpu_offload")) {
    if (r.find("offload_optimizer"))
      r.fail("cpu_offload", "(deprecated) and offload_optimizer cannot be given together");
    if (!v->is_boolean())
      r.bad_value("cpu_offload", *v, "true or false");
    else if (v->get<bool>())
      c.offload_optimizer.device = OffloadDevice::CPU;
  }
  if (const json* v = r.find("cpu_offload_param")) {
    if (r.find("offload_param"))
      r.fail("cpu_offload_param", "(deprecated) and offload_param cannot be given together");
    if (!v->is_boolean())
      r.bad_value("cpu_offload_param", *v, "true or false");
    else if (v->get<bool>())
      c.offload_param.device = OffloadDevice::CPU;
  }
  r.accept_any("cpu_offload_use_pin_memory");  // DeepSpeed only warns about it
  // Accepted because they cannot change results here: checkpoint-format and
  // loading knobs handled by zero-cpp's own checkpoint code.
  r.accept_any("load_from_fp32_weights");
  r.accept_any("elastic_checkpoint");
  r.accept_any("memory_efficient_linear");
  r.accept_any("stage3_module_granularity_threshold", {"module_granularity_threshold"});
  r.accept_any("log_trace_cache_warnings");
  r.unsupported_unless("legacy_stage1", false);
  r.unsupported_unless("zero_quantized_weights", false);
  r.unsupported_unless("zero_quantized_nontrainable_weights", false);
  r.unsupported_unless("zero_quantized_gradients", false);
  r.unsupported_unless("zeropp_loco_param", nullptr);
  r.unsupported_unless("mics_shard_size", -1);
  r.unsupported_unless("mics_hierarchical_params_gather", false);
  r.unsupported_unless("pipeline_loading_checkpoint", false);
  r.unsupported_unless("override_module_apply", true);
  r.unsupported_unless("enable_sanity_checks", false);
  r.unsupported_unless("parameter_alignment", false);  // params are packed; alignment is the group's
  r.unsupported_unless("zenflow", nullptr);
  // Python class names cannot match C++ modules: declare zero::Unit<> instead.
  r.unsupported_unless("leaf_module", nullptr);
  r.finish();
  // DeepSpeed's rules for skipping the norm (stage_1_and_2.py, zero/config.py).
  if (!c.compute_grad_norm) {
    if (c.stage != 1 && c.stage != 2)
      throw ConfigError("ds_config: zero_optimization.compute_grad_norm = false is supported only "
                        "with ZeRO stage 1 or 2 (stage is " + std::to_string(c.stage) + ")");
    if (c.offload_optimizer.device != OffloadDevice::None)
      throw ConfigError("ds_config: zero_optimization.compute_grad_norm = false does not support "
                        "optimizer offload");
  }
  return c;
}

}  // namespace

const char* to_string(DType d) {
  switch (d) {
    case DType::fp16: return "fp16";
    case DType::bf16: return "bf16";
    default: return "fp32";
  }
}

const char* to_string(OptimizerType t) {
  switch (t) {
    case OptimizerType::Adam: return "Adam";
    case OptimizerType::SGD: return "SGD";
    case OptimizerType::Lion: return "Lion";
    case OptimizerType::Adagrad: return "Adagrad";
    case OptimizerType::Lamb: return "Lamb";
    case OptimizerType::Muon: return "Muon";
    default: return "AdamW";
  }
}

const char* to_string(SchedulerType t) {
  switch (t) {
    case SchedulerType::WarmupLR: return "WarmupLR";
    case SchedulerType::WarmupDecayLR: return "WarmupDecayLR";
    case SchedulerType::WarmupCosineLR: return "WarmupCosineLR";
    case SchedulerType::LRRangeTest: return "LRRangeTest";
    case SchedulerType::OneCycle: return "OneCycle";
    default: return "none";
  }
}

const char* to_string(CpuAllocator a) { return a == CpuAllocator::Torch ? "torch" : "caching"; }

const char* to_string(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::CPU: return "cpu";
    case OffloadDevice::NVMe: return "nvme";
    default: return "none";
  }
}

Config Config::from_json(const json& j) {
  Config c;
  // Every bad key and value of the file in one error (json_reader.h).
  ObjectReader top(&j, "", std::make_shared<std::vector<std::string>>());
  c.train_batch_size = top.get_opt_int("train_batch_size", 1, kMaxInt);
  c.train_micro_batch_size_per_gpu = top.get_opt_int("train_micro_batch_size_per_gpu", 1, kMaxInt);
  c.gradient_accumulation_steps = top.get_opt_int("gradient_accumulation_steps", 1, kMaxInt);
  // DeepSpeed >= 0.19.3 clips at 1.0 by default; 0 disables.
  c.gradient_clipping = top.get_double("gradient_clipping", c.gradient_clipping, 0.0, 1e30);
  c.steps_per_print = top.get_int("steps_per_print", c.steps_per_print, 1, kMaxInt);
  c.fp16 = read_fp16(top);
  c.bf16 = read_bf16(top);
  if (c.fp16.enabled && c.bf16.enabled)
    top.fail("bf16", "and fp16 are both enabled; enable at most one");
  c.optimizer = read_optimizer(top);
  c.scheduler = read_scheduler(top);
  if (c.scheduler.type == SchedulerType::WarmupLR && c.scheduler.warmup_max_lr < 0) {
    c.scheduler.warmup_max_lr = c.optimizer.lr;
    c.scheduler.warmup_max_lr_follows_optimizer = true;
  }
  c.communication_data_type = read_dtype(top, "communication_data_type");
  {
    ObjectReader dt = top.child("data_types");
    c.grad_accum_dtype = read_dtype(dt, "grad_accum_dtype");
    c.buffer_dtype = read_dtype(dt, "buffer_dtype");
    dt.finish();
  }
  c.zero = read_zero(top);
  {
    // zero-cpp's own settings (DeepSpeed has no such block).
    ObjectReader own = top.child("zero_cpp");
    c.comm_fast_path = own.get_bool("comm_fast_path", c.comm_fast_path);
    c.broadcast_buffers = own.get_bool("broadcast_buffers", c.broadcast_buffers);
    c.keep_buffer_dtype = own.get_bool("keep_buffer_dtype", c.keep_buffer_dtype);
    // glibc caps its threshold at 32 MiB on 64-bit (HEAP_MAX / 2).
    c.malloc_mmap_threshold = own.get_int("malloc_mmap_threshold", c.malloc_mmap_threshold, 0, int64_t{32} << 20);
    c.cpu_allocator = own.get_choice("cpu_allocator", "caching", {"caching", "torch"}) == "torch"
                          ? CpuAllocator::Torch
                          : CpuAllocator::Caching;
    const std::string compute = own.get_choice("compute_dtype", "auto", {"auto", "fp32", "bf16", "fp16"});
    if (compute != "auto") c.compute_dtype = parse_dtype(compute);
    c.stage3_gather_fp32_master = own.get_bool("stage3_gather_fp32_master", c.stage3_gather_fp32_master);
    own.finish();
    if (c.compute_dtype && *c.compute_dtype != DType::fp32 && *c.compute_dtype != c.param_dtype())
      own.fail("compute_dtype", std::string("is \"") + compute + "\" but the params are stored in " +
                                    to_string(c.param_dtype()) + "; compute in fp32 or in the storage dtype");
  }

  for (const auto& [key, off] : {std::pair{"offload_optimizer", &c.zero.offload_optimizer},
                                 std::pair{"offload_param", &c.zero.offload_param}}) {
    // LAMB's two passes would page every group's state in twice; Muon's
    // owners need whole matrices' momentum inputs from every group at once.
    if (off->device == OffloadDevice::NVMe &&
        (c.optimizer.type == OptimizerType::Lamb || c.optimizer.type == OptimizerType::Muon))
      throw ConfigError(std::string("ds_config: optimizer ") + to_string(c.optimizer.type) +
                        " with zero_optimization." + key + ".device = \"nvme\" is not supported yet");
  }
  if (c.zero.offload_optimizer.device == OffloadDevice::NVMe) {
    if (c.stage3_gather_fp32_master)
      throw ConfigError("ds_config: zero_cpp.stage3_gather_fp32_master gathers the fp32 masters, which "
                        "zero_optimization.offload_optimizer.device = \"nvme\" keeps on disk; use one of them");
  }

  // DeepSpeed keys whose default is the only behaviour zero-cpp has.
  top.unsupported_unless("prescale_gradients", false);
  top.unsupported_unless("gradient_predivide_factor", 1.0);
  top.unsupported_unless("sparse_gradients", false);
  top.unsupported_unless("dump_state", false);
  top.unsupported_unless("seq_parallel_communication_data_type", "fp32");
  // DeepSpeed refuses a client optimizer with offload_optimizer unless this is
  // false; here every optimizer runs as zero-cpp's own update wherever its
  // state lives, so either value means the same.
  top.get_bool("zero_force_ds_cpu_optimizer", true);
  top.unsupported_unless("sequence_parallel_size", 1);
  top.unsupported_unless("gradient_allreduce_op", "mean");
  top.unsupported_unless("disable_allgather", false);
  top.unsupported_unless("managed_gradient_accumulation", true);
  top.accept_any("dataloader_drop_last");  // the data loader is the caller's
  top.accept_any("vocabulary_size");
  // Python's garbage collector and DeepSpeed's logger level and throughput
  // timers: nothing of these exists in a C++ program.
  top.get_bool("disable_python_gc", false);
  if (const json* v = top.find("log_level"); v && !v->is_null() && !v->is_string())
    top.bad_value("log_level", *v, "a logging level name or null");
  top.accept_any("timers");
  // Parallelism zero-cpp does not have: accepted only switched off.
  top.unsupported_unless("use_data_before_expert_parallelism", false);
  top.unsupported_unless("datastates_ckpt", false);
  top.unsupported_unless("graph_harvesting", false);
  {
    ObjectReader tp = top.child("tensor_parallel");
    tp.unsupported_unless("autotp_size", 0);
    tp.accept_all_remaining();  // the rest configures tensor parallelism, which is off
  }
  // Memory printouts zero-cpp does not produce: asking for them would be
  // silently unanswered, so only DeepSpeed's default (off) passes.
  c.wall_clock_breakdown = top.get_bool("wall_clock_breakdown", c.wall_clock_breakdown);
  {
    ObjectReader csv = top.child("csv_monitor");
    c.csv_monitor.enabled = read_enabled(csv);
    c.csv_monitor.output_path = csv.get_string("output_path", c.csv_monitor.output_path);
    c.csv_monitor.job_name = csv.get_string("job_name", c.csv_monitor.job_name);
    csv.finish();
  }
  top.unsupported_unless("memory_breakdown", false);
  top.accept_any("zero_allow_untested_optimizer");  // any optimizer zero-cpp has is its own
  read_checkpoint_block(top);
  c.aio = read_aio(top);
  for (const char* block : {"amp", "tensorboard", "wandb", "comet", "flops_profiler",
                            "comms_logger", "autotuning", "elasticity", "curriculum_learning",
                            "data_efficiency", "compression_training",
                            "sparse_attention", "pipeline", "eigenvalue", "progressive_layer_drop",
                            "quantize_training", "nebula", "weight_quantization", "hybrid_engine",
                            "torch_autocast", "expert_parallel"})
    disabled_feature_block(top, block);
  {
    // No "enabled" key: DeepCompile is what it switches on (engine.compile() in Python).
    ObjectReader compile = top.child("compile");
    compile.unsupported_unless("deepcompile", false);
    compile.accept_all_remaining();
  }
  read_activation_checkpointing(top);
  top.finish();
  top.throw_recorded();  // the checks below assume each key read as given

  if (c.zero.offload_optimizer.device != OffloadDevice::None && c.zero.stage == 0)
    throw ConfigError("ds_config: zero_optimization.offload_optimizer requires stage 1, 2 or 3");
  check_optimizer_with_scheduler(c);
  if (!c.zero.compute_grad_norm && c.gradient_clipping > 0)
    throw ConfigError("ds_config: zero_optimization.compute_grad_norm = false requires "
                      "gradient_clipping = 0 (it is " + json(c.gradient_clipping).dump() + ")");
  if (c.fp16.enabled && c.communication_data_type == DType::bf16)
    throw ConfigError("ds_config: communication_data_type = \"bf16\" with fp16 enabled is not supported");
  return c;
}

Config Config::from_string(const std::string& text) {
  json j;
  try {
    j = json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    throw ConfigError(std::string("ds_config: not valid JSON: ") + e.what());
  }
  return from_json(j);
}

Config Config::from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("ds_config: cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return from_string(ss.str());
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

namespace {

// The product of the batch factors, or a ConfigError naming them: a
// wrapped product would pass as a (small or zero) batch size, or divide by 0.
int64_t batch_product(std::initializer_list<std::pair<const char*, int64_t>> factors) {
  int64_t product = 1;
  bool overflow = false;
  std::string named;
  for (const auto& [name, value] : factors) {
    overflow |= __builtin_mul_overflow(product, value, &product);
    named += (named.empty() ? "" : " * ") + std::string(name) + " (" + std::to_string(value) + ")";
  }
  if (overflow) throw ConfigError("ds_config: " + named + " overflows a 64-bit integer");
  return product;
}

}  // namespace

namespace {
// An optimizer chosen in code: its type and the settings every type has.
OptimizerConfig given_optimizer(OptimizerType type, double lr, double weight_decay) {
  OptimizerConfig o;
  o.type = type;
  o.given = true;
  o.lr = lr;
  o.weight_decay = weight_decay;
  return o;
}
}  // namespace

OptimizerConfig OptimizerConfig::adamw(double lr, double weight_decay, std::array<double, 2> betas, double eps) {
  OptimizerConfig o = given_optimizer(OptimizerType::AdamW, lr, weight_decay);
  o.betas = betas;
  o.eps = eps;
  return o;
}

OptimizerConfig OptimizerConfig::adam(double lr, double weight_decay, std::array<double, 2> betas, double eps) {
  OptimizerConfig o = adamw(lr, weight_decay, betas, eps);
  o.type = OptimizerType::Adam;
  o.adam_w_mode = false;
  return o;
}

OptimizerConfig OptimizerConfig::sgd(double lr, double momentum, double weight_decay, bool nesterov) {
  OptimizerConfig o = given_optimizer(OptimizerType::SGD, lr, weight_decay);
  o.momentum = momentum;
  o.nesterov = nesterov;
  return o;
}

OptimizerConfig OptimizerConfig::lion(double lr, double weight_decay, std::array<double, 2> betas) {
  OptimizerConfig o = given_optimizer(OptimizerType::Lion, lr, weight_decay);
  o.betas = betas;
  return o;
}

OptimizerConfig OptimizerConfig::adagrad(double lr, double weight_decay, double eps) {
  OptimizerConfig o = given_optimizer(OptimizerType::Adagrad, lr, weight_decay);
  o.eps = eps;
  return o;
}

OptimizerConfig OptimizerConfig::lamb(double lr, double weight_decay, std::array<double, 2> betas, double eps) {
  OptimizerConfig o = adamw(lr, weight_decay, betas, eps);
  o.type = OptimizerType::Lamb;
  return o;
}

OptimizerConfig OptimizerConfig::muon(double lr, double weight_decay, double momentum, double adam_lr,
                                      std::array<double, 2> betas, double eps) {
  OptimizerConfig o = adamw(lr, weight_decay, betas, eps);
  o.type = OptimizerType::Muon;
  o.momentum = momentum;
  o.adam_lr = adam_lr;
  return o;
}

Config with_optimizer(Config config, OptimizerConfig optimizer) {
  if (config.optimizer.given)
    throw ConfigError("ds_config: has an \"optimizer\" block and an optimizer was passed from code; keep one");
  if (!(optimizer.lr >= 0) || !(optimizer.weight_decay >= 0))
    throw ConfigError("with_optimizer: lr and weight_decay must be >= 0");
  optimizer.given = true;
  config.optimizer = optimizer;
  if (config.scheduler.warmup_max_lr_follows_optimizer) config.scheduler.warmup_max_lr = optimizer.lr;
  check_optimizer_with_scheduler(config);
  return config;
}

BatchConfig Config::resolve_batch(int64_t dp) const {
  if (dp < 1) throw ConfigError("ds_config: data-parallel size must be >= 1, got " + std::to_string(dp));
  const auto& tb = train_batch_size;
  const auto& mb = train_micro_batch_size_per_gpu;
  const auto& ga = gradient_accumulation_steps;
  auto str = [](int64_t v) { return std::to_string(v); };
  constexpr const char* kMicro = "train_micro_batch_size_per_gpu";
  constexpr const char* kAccum = "gradient_accumulation_steps";
  constexpr const char* kDp = "data-parallel size";
  BatchConfig b;
  if (tb && mb && ga) {
    b = {*tb, *mb, *ga};
  } else if (tb && mb) {
    const int64_t per_step = batch_product({{kMicro, *mb}, {kDp, dp}});
    if (*tb % per_step)
      throw ConfigError("ds_config: train_batch_size " + str(*tb) + " is not divisible by "
                        "train_micro_batch_size_per_gpu " + str(*mb) + " * data-parallel size " + str(dp));
    b = {*tb, *mb, *tb / per_step};
  } else if (tb && ga) {
    const int64_t per_micro = batch_product({{kAccum, *ga}, {kDp, dp}});
    if (*tb % per_micro)
      throw ConfigError("ds_config: train_batch_size " + str(*tb) + " is not divisible by "
                        "gradient_accumulation_steps " + str(*ga) + " * data-parallel size " + str(dp));
    b = {*tb, *tb / per_micro, *ga};
  } else if (mb && ga) {
    b = {batch_product({{kMicro, *mb}, {kAccum, *ga}, {kDp, dp}}), *mb, *ga};
  } else if (tb) {
    if (*tb % dp)
      throw ConfigError("ds_config: train_batch_size " + str(*tb) +
                        " is not divisible by the data-parallel size " + str(dp));
    b = {*tb, *tb / dp, 1};
  } else if (mb) {
    b = {batch_product({{kMicro, *mb}, {kDp, dp}}), *mb, 1};
  } else {
    throw ConfigError("ds_config: either train_batch_size or train_micro_batch_size_per_gpu "
                      "must be given");
  }
  const int64_t product =
      batch_product({{kMicro, b.micro_batch_per_gpu}, {kAccum, b.gradient_accumulation_steps}, {kDp, dp}});
  if (b.train_batch_size != product)
    throw ConfigError("ds_config: train_batch_size (" + str(b.train_batch_size) +
                      ") must equal train_micro_batch_size_per_gpu (" + str(b.micro_batch_per_gpu) +
                      ") * gradient_accumulation_steps (" + str(b.gradient_accumulation_steps) +
                      ") * data-parallel size (" + str(dp) + ") = " + str(product));
  return b;
}

DType Config::param_dtype() const {
  if (bf16.enabled) return DType::bf16;
  if (fp16.enabled) return DType::fp16;
  return DType::fp32;
}

json Config::to_json() const {
  json j;
  if (train_batch_size) j["train_batch_size"] = *train_batch_size;
  if (train_micro_batch_size_per_gpu) j["train_micro_batch_size_per_gpu"] = *train_micro_batch_size_per_gpu;
  if (gradient_accumulation_steps) j["gradient_accumulation_steps"] = *gradient_accumulation_steps;
  j["gradient_clipping"] = gradient_clipping;
  j["steps_per_print"] = steps_per_print > 0 ? json(steps_per_print) : json(nullptr);  // 0: DeepSpeed's null
  j["wall_clock_breakdown"] = wall_clock_breakdown;
  j["csv_monitor"] = {{"enabled", csv_monitor.enabled},
                      {"output_path", csv_monitor.output_path},
                      {"job_name", csv_monitor.job_name}};
  j["fp16"] = {{"enabled", fp16.enabled},
               {"loss_scale", fp16.loss_scale},
               {"initial_scale_power", fp16.initial_scale_power},
               {"loss_scale_window", fp16.loss_scale_window},
               {"hysteresis", fp16.hysteresis},
               {"consecutive_hysteresis", fp16.consecutive_hysteresis},
               {"min_loss_scale", fp16.min_loss_scale}};
  j["bf16"] = {{"enabled", bf16.enabled}};
  j["zero_cpp"] = {{"comm_fast_path", comm_fast_path},
                   {"broadcast_buffers", broadcast_buffers},
                   {"keep_buffer_dtype", keep_buffer_dtype},
                   {"malloc_mmap_threshold", malloc_mmap_threshold},
                   {"cpu_allocator", to_string(cpu_allocator)},
                   {"compute_dtype", compute_dtype ? to_string(*compute_dtype) : "auto"},
                   {"stage3_gather_fp32_master", stage3_gather_fp32_master}};
  if (optimizer.given) {
    json p = {{"lr", optimizer.lr}, {"weight_decay", optimizer.weight_decay}};
    if (optimizer.type == OptimizerType::SGD) {
      p["momentum"] = optimizer.momentum;
      p["dampening"] = optimizer.dampening;
      p["nesterov"] = optimizer.nesterov;
    } else if (optimizer.type == OptimizerType::Lion) {
      p["betas"] = optimizer.betas;
    } else if (optimizer.type == OptimizerType::Lamb) {
      p["betas"] = optimizer.betas;
      p["eps"] = optimizer.eps;
      p["bias_correction"] = optimizer.bias_correction;
      p["max_coeff"] = optimizer.max_coeff;
      p["min_coeff"] = optimizer.min_coeff;
    } else if (optimizer.type == OptimizerType::Muon) {
      p["momentum"] = optimizer.momentum;
      p["adam_lr"] = optimizer.adam_lr;
      p["ns_method"] = optimizer.ns_method;
      p["betas"] = optimizer.betas;
      p["eps"] = optimizer.eps;
    } else if (optimizer.type == OptimizerType::Adagrad) {
      p["eps"] = optimizer.eps;
      p["initial_accumulator_value"] = optimizer.initial_accumulator_value;
    } else {
      p["betas"] = optimizer.betas;
      p["eps"] = optimizer.eps;
      p["adam_w_mode"] = optimizer.adam_w_mode;
    }
    j["optimizer"] = {{"type", to_string(optimizer.type)}, {"params", p}};
  }
  if (scheduler.type == SchedulerType::LRRangeTest) {
    j["scheduler"] = {{"type", "LRRangeTest"},
                      {"params", {{"lr_range_test_min_lr", scheduler.lr_range_test_min_lr},
                                  {"lr_range_test_step_size", scheduler.lr_range_test_step_size},
                                  {"lr_range_test_step_rate", scheduler.lr_range_test_step_rate},
                                  {"lr_range_test_staircase", scheduler.lr_range_test_staircase}}}};
  } else if (scheduler.type == SchedulerType::OneCycle) {
    const auto& o = scheduler;
    j["scheduler"] = {{"type", "OneCycle"},
                      {"params", {{"cycle_min_lr", o.cycle_min_lr},
                                  {"cycle_max_lr", o.cycle_max_lr},
                                  {"decay_lr_rate", o.decay_lr_rate},
                                  {"cycle_first_step_size", o.cycle_first_step_size},
                                  {"cycle_second_step_size", o.cycle_second_step_size},
                                  {"cycle_first_stair_count", o.cycle_first_stair_count},
                                  {"cycle_second_stair_count", o.cycle_second_stair_count},
                                  {"decay_step_size", o.decay_step_size},
                                  {"cycle_momentum", o.cycle_momentum},
                                  {"cycle_min_mom", o.cycle_min_mom},
                                  {"cycle_max_mom", o.cycle_max_mom},
                                  {"decay_mom_rate", o.decay_mom_rate}}}};
  } else if (scheduler.type != SchedulerType::None) {
    json p = {{"warmup_num_steps", scheduler.warmup_num_steps},
              {"warmup_type", scheduler.warmup_type == WarmupType::Log ? "log" : "linear"}};
    if (scheduler.type == SchedulerType::WarmupCosineLR) {
      p["warmup_min_ratio"] = scheduler.warmup_min_ratio;
      p["cos_min_ratio"] = scheduler.cos_min_ratio;
    } else {
      p["warmup_min_lr"] = scheduler.warmup_min_lr;
      p["warmup_max_lr"] = scheduler.warmup_max_lr;
    }
    if (scheduler.type != SchedulerType::WarmupLR) p["total_num_steps"] = scheduler.total_num_steps;
    j["scheduler"] = {{"type", to_string(scheduler.type)}, {"params", p}};
  }
  if (communication_data_type) j["communication_data_type"] = to_string(*communication_data_type);
  if (grad_accum_dtype) j["data_types"]["grad_accum_dtype"] = to_string(*grad_accum_dtype);
  if (buffer_dtype) j["data_types"]["buffer_dtype"] = to_string(*buffer_dtype);
  const auto& z = zero;
  json zj = {{"stage", z.stage},
             {"contiguous_gradients", z.contiguous_gradients},
             {"overlap_comm", z.overlap_comm()},
             {"reduce_bucket_size", z.reduce_bucket_size},
             {"stage3_prefetch_bucket_size", z.prefetch_bucket_size},
             {"stage3_param_persistence_threshold", z.param_persistence_threshold},
             {"stage3_max_live_parameters", z.max_live_parameters},
             {"stage3_max_reuse_distance", z.max_reuse_distance},
             {"zero_hpz_partition_size", z.hpz_partition_size},
             {"compute_grad_norm", z.compute_grad_norm},
             {"offload_optimizer", {{"device", to_string(z.offload_optimizer.device)},
                                    {"pin_memory", z.offload_optimizer.pin_memory},
                                    {"buffer_count", z.offload_optimizer.buffer_count},
                                    {"pipeline_read", z.offload_optimizer.pipeline_read},
                                    {"pipeline_write", z.offload_optimizer.pipeline_write}}},
             {"offload_param", {{"device", to_string(z.offload_param.device)},
                                {"pin_memory", z.offload_param.pin_memory},
                                {"buffer_count", z.offload_param.buffer_count},
                                {"buffer_size", z.offload_param.buffer_size},
                                {"max_in_cpu", z.offload_param.max_in_cpu}}}};
  for (const auto& [key, o] : {std::pair{"offload_optimizer", &z.offload_optimizer}, {"offload_param", &z.offload_param}})
    zj[key]["nvme_path"] = o->nvme_path.empty() ? json(nullptr) : json(o->nvme_path);
  j["zero_optimization"] = zj;
  j["aio"] = {{"block_size", aio.block_size},
              {"queue_depth", aio.queue_depth},
              {"intra_op_parallelism", aio.thread_count},
              {"single_submit", aio.single_submit},
              {"overlap_events", aio.overlap_events}};
  return j;
}

}  // namespace zero
