// ds_config parsing: DeepSpeed's documented examples parse, defaults and
// aliases are DeepSpeed's, and every class of bad input names its key.
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "zero/config.h"

namespace {

using zero::Config;
using zero::ConfigError;

namespace fs = std::filesystem;

const fs::path kData = fs::path(ZERO_TEST_DATA_DIR) / "ds_configs";

// Expects parsing `text` to fail with a message containing every `parts`.
void expect_error(const std::string& text, std::initializer_list<std::string> parts) {
  try {
    Config::from_string(text);
    ADD_FAILURE() << "no error for " << text;
  } catch (const ConfigError& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
  }
}

TEST(ConfigDocExamples, EverySupportedExampleParses) {
  int n = 0;
  for (const auto& f : fs::directory_iterator(kData / "ok")) {
    SCOPED_TRACE(f.path().filename().string());
    Config c = Config::from_file(f.path().string());
    EXPECT_NO_THROW(c.resolve_batch(2));
    // The resolved config reads back to itself.
    EXPECT_EQ(Config::from_json(c.to_json()).to_json(), c.to_json());
    ++n;
  }
  EXPECT_GE(n, 14);
}

TEST(ConfigDocExamples, ValuesAsDocumented) {
  auto load = [](const char* name) { return Config::from_file((kData / "ok" / name).string()); };
  Config s2 = load("zero_tutorial_stage2.json");
  EXPECT_EQ(s2.zero.stage, 2);
  EXPECT_TRUE(s2.zero.overlap_comm());
  EXPECT_EQ(s2.zero.reduce_bucket_size, 500000000);

  Config inf = load("zero_tutorial_infinity_cpu.json");
  EXPECT_EQ(inf.zero.prefetch_bucket_size, 10000000);
  EXPECT_EQ(inf.zero.offload_param.device, zero::OffloadDevice::CPU);
  EXPECT_TRUE(inf.zero.overlap_comm());  // stage 3 default

  Config legacy = load("getting_started_legacy_bool.json");
  EXPECT_EQ(legacy.zero.stage, 1);
  EXPECT_TRUE(legacy.fp16.enabled);
  EXPECT_EQ(legacy.optimizer.type, zero::OptimizerType::Adam);
  EXPECT_TRUE(legacy.optimizer.adam_w_mode);  // DeepSpeed's Adam is decoupled by default

  Config moe = load("moe_deprecated_cpu_offload.json");
  EXPECT_EQ(moe.zero.offload_optimizer.device, zero::OffloadDevice::CPU);

  Config hf = load("hf_auto_values.json");
  EXPECT_FALSE(hf.train_batch_size.has_value());
  EXPECT_FALSE(hf.zero.overlap_comm());  // "auto" -> DeepSpeed's default for stage 2
  EXPECT_EQ(hf.zero.reduce_bucket_size, 500000000);
  auto b = hf.resolve_batch(2);
  EXPECT_EQ(b.train_batch_size, 8);
  EXPECT_EQ(b.gradient_accumulation_steps, 1);
  EXPECT_EQ(hf.param_dtype(), zero::DType::bf16);
}

TEST(ConfigDocExamples, UnsupportedFeaturesAreNamed) {
  const std::map<std::string, std::string> expected{
      {"zero2_param_nvme.json", "offload_param requires stage 3"},
      {"zero3_mics.json", "zero_optimization.mics_shard_size = 8 is not supported"},
      // hpZ is built (its size is checked against the hosts by the engine); qwZ is not.
      {"zeropp.json", "zero_optimization.zero_quantized_weights = true is not supported"},
      {"bert_pretraining_max_grad_norm.json", "optimizer.params.max_grad_norm"},
  };
  for (const auto& [file, message] : expected) {
    SCOPED_TRACE(file);
    try {
      Config::from_file((kData / "rejected" / file).string());
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << "names the file";
    }
  }
}

TEST(ConfigDefaults, AreDeepSpeeds) {
  Config c = Config::from_string(R"({"train_batch_size": 8})");
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_FALSE(c.zero.overlap_comm());
  EXPECT_TRUE(c.zero.contiguous_gradients);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero.prefetch_bucket_size, 50000000);
  EXPECT_EQ(c.zero.param_persistence_threshold, 100000);
  EXPECT_EQ(c.zero.max_live_parameters, 1000000000);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_FALSE(c.optimizer.given);
  EXPECT_EQ(c.param_dtype(), zero::DType::fp32);
  EXPECT_EQ(c.comm_dtype(), zero::DType::fp32);
  // DeepSpeed 0.19's STEPS_PER_PRINT_DEFAULT is None (runtime/constants.py):
  // no progress lines unless asked for; null is the same, and writes back as null.
  EXPECT_EQ(c.steps_per_print, 0);
  EXPECT_TRUE(c.to_json().at("steps_per_print").is_null());
  EXPECT_EQ(Config::from_string(R"({"steps_per_print": null})").steps_per_print, 0);
  EXPECT_EQ(Config::from_json(Config::from_string(R"({"steps_per_print": 7})").to_json()).steps_per_print, 7);

  EXPECT_TRUE(Config::from_string(R"({"zero_optimization": {"stage": 3}})").zero.overlap_comm());
  EXPECT_FALSE(Config::from_string(R"({"zero_optimization": {"stage": 3, "overlap_comm": false}})")
                   .zero.overlap_comm());
}

TEST(ConfigAliases, BothSpellingsWork) {
  for (const char* key : {"stage3_prefetch_bucket_size", "prefetch_bucket_size"}) {
    Config c = Config::from_json({{"zero_optimization", {{"stage", 3}, {key, 1234}}}});
    EXPECT_EQ(c.zero.prefetch_bucket_size, 1234) << key;
  }
  for (const char* key : {"stage3_max_live_parameters", "max_live_parameters"})
    EXPECT_EQ(Config::from_json({{"zero_optimization", {{key, 77}}}}).zero.max_live_parameters, 77);
  // Accepted under every spelling (and type-checked), though inert here.
  for (const char* key : {"stage3_gather_16bit_weights_on_model_save",
                          "stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save"}) {
    EXPECT_NO_THROW(Config::from_json({{"zero_optimization", {{key, true}}}})) << key;
    expect_error(std::string(R"({"zero_optimization": {")") + key + R"(": 3}})",
                 {"stage3_gather_16bit_weights_on_model_save", "true or false"});
  }
  EXPECT_TRUE(Config::from_string(R"({"bfloat16": {"enabled": true}})").bf16.enabled);
  expect_error(R"({"zero_optimization": {"prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}})",
               {"stage3_prefetch_bucket_size", "prefetch_bucket_size", "same setting"});
  expect_error(R"({"zero_optimization": {"cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})",
               {"cpu_offload", "offload_optimizer"});
}

TEST(ConfigBatch, DerivesLikeDeepSpeed) {
  auto resolve = [](const char* text, int dp) { return Config::from_string(text).resolve_batch(dp); };
  auto b = resolve(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", 2);
  EXPECT_EQ(b.gradient_accumulation_steps, 4);
  b = resolve(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})", 4);
  EXPECT_EQ(b.micro_batch_per_gpu, 4);
  b = resolve(R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2})", 2);
  EXPECT_EQ(b.train_batch_size, 12);
  b = resolve(R"({"train_batch_size": 16})", 4);
  EXPECT_EQ(b.micro_batch_per_gpu, 4);
  EXPECT_EQ(b.gradient_accumulation_steps, 1);
  b = resolve(R"({"train_micro_batch_size_per_gpu": 5})", 3);
  EXPECT_EQ(b.train_batch_size, 15);
  b = resolve(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4})", 2);
  EXPECT_EQ(b.train_batch_size, 16);

  auto fails = [](const char* text, int dp, const char* part) {
    try {
      Config::from_string(text).resolve_batch(dp);
      ADD_FAILURE() << text;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  fails(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4})",
        4, "data-parallel size (4)");
  fails(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3})", 1, "not divisible");
  fails(R"({"gradient_accumulation_steps": 2})", 1, "either train_batch_size or train_micro_batch_size_per_gpu");
  fails(R"({"train_batch_size": 6})", 4, "not divisible by the data-parallel size 4");
}

// Every product resolve_batch forms is checked: a wrapped one read as a
// batch of 0 (accepted) or as a divisor of 0 (SIGFPE).
TEST(ConfigBatch, OverflowIsAnError) {
  auto fails = [](const std::string& text, int64_t dp, std::initializer_list<std::string> parts) {
    try {
      Config::from_string(text).resolve_batch(dp);
      ADD_FAILURE() << "no error for " << text << " at data-parallel size " << dp;
    } catch (const ConfigError& e) {
      for (const auto& p : parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << e.what() << "' lacks '" << p << "'";
    }
  };
  const std::string big = std::to_string(int64_t{1} << 62);
  fails(R"({"train_micro_batch_size_per_gpu": )" + big + R"(, "gradient_accumulation_steps": 4})", 1,
        {"train_micro_batch_size_per_gpu (" + big + ") * gradient_accumulation_steps (4) * data-parallel size (1)",
         "overflows"});
  fails(R"({"train_micro_batch_size_per_gpu": )" + big + "}", 4,
        {"train_micro_batch_size_per_gpu (" + big + ") * data-parallel size (4) overflows"});
  fails(R"({"train_batch_size": 8, "gradient_accumulation_steps": )" + big + "}", 4,
        {"gradient_accumulation_steps (" + big + ") * data-parallel size (4) overflows"});
  fails(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": )" + big + "}", 4,
        {"train_micro_batch_size_per_gpu (" + big + ") * data-parallel size (4) overflows"});
  fails(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": )" + big + R"(, "gradient_accumulation_steps": 4})",
        1, {"gradient_accumulation_steps (4) * data-parallel size (1) overflows"});
  // The largest products that fit are still fine.
  auto b = Config::from_string(R"({"train_micro_batch_size_per_gpu": )" + big + R"(, "gradient_accumulation_steps": 1})")
               .resolve_batch(1);
  EXPECT_EQ(b.train_batch_size, int64_t{1} << 62);
}

TEST(ConfigOwnKeys, CommFastPath) {
  EXPECT_TRUE(zero::Config::from_string("{}").comm_fast_path);
  auto c = zero::Config::from_string(R"({"zero_cpp": {"comm_fast_path": false}})");
  EXPECT_FALSE(c.comm_fast_path);
  EXPECT_FALSE(zero::Config::from_json(c.to_json()).comm_fast_path);  // round trip
  expect_error(R"({"zero_cpp": {"comm_fastpath": false}})", {"zero_cpp.comm_fastpath", "comm_fast_path"});
}

TEST(ConfigErrors, NameTheKeyAndWhatIsAllowed) {
  expect_error(R"({"zero_optimization": {"stag": 2}})",
               {"zero_optimization.stag", "did you mean zero_optimization.stage?"});
  expect_error(R"({"train_batch_sise": 8})", {"train_batch_sise", "train_batch_size"});
  expect_error(R"({"zero_optimization": {"stage": 4}})", {"zero_optimization.stage", "= 4", "[0, 3]"});
  expect_error(R"({"zero_optimization": {"stage": "two"}})", {"zero_optimization.stage", "\"two\"", "integer"});
  expect_error(R"({"zero_optimization": {"overlap_comm": 1}})", {"overlap_comm", "true or false"});
  expect_error(R"({"zero_optimization": {"reduce_bucket_size": 5.5}})", {"reduce_bucket_size", "integer"});
  expect_error(R"({"zero_optimization": {"reduce_bucket_size": -1}})", {"reduce_bucket_size", "-1"});
  expect_error(R"({"optimizer": {"type": "Adamax"}})", {"optimizer.type", "Adamax", "Adam, AdamW, SGD"});
  expect_error(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})", {"optimizer.params.betas"});
  expect_error(R"({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})", {"optimizer.params.lr", "auto"});
  expect_error(R"({"zero_optimization": {"zero_quantized_weights": true}})",
               {"zero_optimization.zero_quantized_weights = true is not supported", "only false"});
  expect_error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})", {"fp16 are both enabled"});
  expect_error(R"({"fp16": {"enabled": "auto"}})", {"fp16.enabled", "auto"});
  expect_error(R"({"fp16": {"loss_scale_window": 0}})", {"fp16.loss_scale_window"});
  expect_error(R"({"fp16": {"enabled": true, "auto_cast": true}})", {"fp16.auto_cast", "not supported"});
  expect_error(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})",
               {"scheduler.params.total_num_steps", "required"});
  expect_error(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": 0.1}}})",
               {"scheduler.params.cycle_min_lr", "required"});
  expect_error(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 0.1,
      "cycle_first_step_size": 0}}})", {"scheduler.params.cycle_first_step_size"});
  expect_error(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 0.1,
      "cycle_momentum": true, "cycle_max_mom": 1.5}}})", {"scheduler.params.cycle_max_mom"});
  expect_error(R"({"scheduler": {"type": "TwoCycle"}})", {"scheduler.type", "OneCycle"});
  Config oc = Config::from_string(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4,
      "cycle_max_lr": 1e-3, "cycle_first_step_size": 30, "cycle_first_stair_count": 3, "decay_step_size": 5,
      "decay_lr_rate": 0.1, "cycle_momentum": false}}})");
  EXPECT_EQ(oc.scheduler.type, zero::SchedulerType::OneCycle);
  EXPECT_EQ(oc.scheduler.cycle_second_step_size, 30) << "unset: the first's, as DeepSpeed";
  EXPECT_EQ(oc.scheduler.cycle_second_stair_count, 3);
  EXPECT_FALSE(oc.scheduler.cycle_momentum);
  const Config oc2 = Config::from_json(oc.to_json());
  EXPECT_EQ(oc2.scheduler.decay_step_size, 5);
  EXPECT_DOUBLE_EQ(oc2.scheduler.cycle_max_lr, 1e-3);
  EXPECT_FALSE(oc2.scheduler.cycle_momentum);
  Config r = Config::from_string(R"({"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 1e-5,
      "lr_range_test_step_size": 50, "lr_range_test_step_rate": 3, "lr_range_test_staircase": true}}})");
  EXPECT_EQ(r.scheduler.type, zero::SchedulerType::LRRangeTest);
  EXPECT_EQ(r.scheduler.lr_range_test_step_size, 50);
  EXPECT_TRUE(Config::from_json(r.to_json()).scheduler.lr_range_test_staircase);
  expect_error(R"({"tensorboard": {"enabled": true, "output_path": "x"}})", {"tensorboard.enabled", "not supported"});
  expect_error(R"({"communication_data_type": "fp8"})", {"communication_data_type", "fp8"});
  expect_error(R"({"zero_optimization": [1, 2]})", {"zero_optimization must be a JSON object"});
  expect_error(R"({"zero_optimization": {"stage": 1, "offload_param": {"device": "cpu"}}})",
               {"offload_param", "requires stage 3"});
  expect_error(R"({"train_batch_size": 8,})", {"not valid JSON"});
  expect_error(R"({"train_batch_size": 0})", {"train_batch_size", "[1, inf)"});
}

// A file with several mistakes takes one run to fix, not one per mistake:
// every unknown key and bad value is named in one error, in file order.
TEST(ConfigErrors, EveryBadKeyOfAFileInOneError) {
  const char* text = R"({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": "one",
      "zero_optimization": {"stgae": 2, "overlap_comm": 1},
      "optimizer": {"type": "AdamW", "params": {"lr": "fast"}}, "steps_per_prnt": 10})";
  try {
    Config::from_string(text);
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("ds_config has 5 errors:"), std::string::npos) << what;
    for (const char* part : {"gradient_clipping = \"one\"", "zero_optimization.stgae is not a key",
                             "zero_optimization.overlap_comm = 1: expected true or false", "optimizer.params.lr",
                             "steps_per_prnt is not a key zero-cpp knows (did you mean steps_per_print?)"})
      EXPECT_NE(what.find(part), std::string::npos) << part << "\n" << what;
  }
  // One mistake reads as before: no count, no list.
  try {
    Config::from_string(R"({"zero_optimization": {"stgae": 2}})");
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find("errors:"), std::string::npos) << e.what();
  }
}

TEST(ConfigUnsupported, AcceptedAtTheirDefault) {
  // A DeepSpeed key this project does not implement is fine when it asks
  // for exactly DeepSpeed's default (the behaviour zero-cpp has).
  Config c = Config::from_string(R"({"prescale_gradients": false, "tensorboard": {"enabled": false,
      "output_path": "x"}, "zero_optimization": {"zero_quantized_weights": false, "mics_shard_size": -1,
      "zero_hpz_partition_size": 1.0}})");
  EXPECT_EQ(c.zero.stage, 0);
}

// DeepSpeed's knobs that only choose how its own collectives run (bucketed
// all-reduce across ranks, sequential or all-reduce fetches): the same
// results, so zero-cpp takes either value and keeps nothing; a value of the
// wrong type is still named.
TEST(ConfigZero, CollectiveVariantKnobsAreInert) {
  Config c = Config::from_string(R"({"zero_optimization": {"stage": 3, "use_multi_rank_bucket_allreduce": false,
      "allgather_sequential": true, "use_all_reduce_for_fetch_params": true}})");
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_NO_THROW(Config::from_string(R"({"zero_optimization": {"stage3_use_all_reduce_for_fetch_params": true,
      "stage3_allgather_sequential": true}})"));
  expect_error(R"({"zero_optimization": {"use_multi_rank_bucket_allreduce": 1}})",
               {"zero_optimization.use_multi_rank_bucket_allreduce = 1: expected true or false"});
}

TEST(ConfigZero, HpzPartitionSizeIsRead) {
  EXPECT_EQ(Config::from_string(R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}})")
                .zero.hpz_partition_size,
            8);
  EXPECT_EQ(Config::from_string("{}").zero.hpz_partition_size, 1);
  EXPECT_THROW(Config::from_string(R"({"zero_optimization": {"zero_hpz_partition_size": 0}})"), ConfigError);
}

// Features zero-cpp does not implement pass only at DeepSpeed's default,
// blocks without an "enabled" key included.
TEST(ConfigUnsupported, LoggingAndActivationCheckpointingOnlyAtTheirDefault) {
  EXPECT_NO_THROW(Config::from_string(R"({"wall_clock_breakdown": false, "memory_breakdown": false,
      "activation_checkpointing": {"partition_activations": false, "contiguous_memory_optimization": false,
      "cpu_checkpointing": false, "number_checkpoints": null, "synchronize_checkpoint_boundary": false,
      "profile": false}})"));
  EXPECT_NO_THROW(Config::from_string(R"({"activation_checkpointing": {}})"));
  expect_error(R"({"memory_breakdown": true})", {"memory_breakdown = true is not supported", "only false"});
  for (const char* key : {"partition_activations", "contiguous_memory_optimization", "cpu_checkpointing",
                          "synchronize_checkpoint_boundary", "profile"})
    expect_error(std::string(R"({"activation_checkpointing": {")") + key + R"(": true}})",
                 {std::string("activation_checkpointing.") + key + " = true is not supported", "only false"});
  expect_error(R"({"activation_checkpointing": {"number_checkpoints": 4}})",
               {"activation_checkpointing.number_checkpoints = 4 is not supported", "only null"});
  expect_error(R"({"activation_checkpointing": {"enabled": false}})",
               {"activation_checkpointing.enabled is not a key zero-cpp knows"});
}

// The checkpoint block: tag_validation's modes (any case) and the writer's
// settings (how DeepSpeed writes its files, not what) are taken; a universal
// checkpoint or node-local storage, which zero-cpp does not read or write,
// is refused by name, as is a key the block does not have.
TEST(ConfigUnsupported, CheckpointBlockNamesWhatItCannotDo) {
  EXPECT_NO_THROW(Config::from_string(R"({"checkpoint": {"tag_validation": "fail", "load_universal": false,
      "use_node_local_storage": false, "parallel_write": {"pipeline_stage": true},
      "writer": {"type": "fast", "decoupled": true}, "checkpoint_serialization": true}})"));
  EXPECT_NO_THROW(Config::from_string(R"({"checkpoint": {"writer": null}})"));
  expect_error(R"({"checkpoint": {"load_universal": true}})",
               {"checkpoint.load_universal = true is not supported", "only false"});
  expect_error(R"({"checkpoint": {"use_node_local_storage": true}})",
               {"checkpoint.use_node_local_storage = true is not supported", "only false"});
  expect_error(R"({"checkpoint": {"tag_validation": "Strict"}})", {"checkpoint.tag_validation", "Strict"});
  expect_error(R"({"checkpoint": {"tag_validaton": "Warn"}})", {"checkpoint.tag_validaton is not a key"});
}

// Keys DeepSpeed 0.19.8 reads that earlier releases did not (every one of its
// keys at its default is tests/data/ds_configs/ok/deepspeed_0.19.8_defaults.json).
TEST(ConfigDeepSpeed0198, NewKeysOnlyAtTheirDefaultOrHonoured) {
  EXPECT_NO_THROW(Config::from_string(R"({"log_level": "info", "disable_python_gc": true,
      "timers": {"throughput": {"enabled": false}}, "tensor_parallel": {"autotp_size": 0, "tp_overlap_comm": true},
      "expert_parallel": {"enabled": false, "autoep_size": 4}, "compile": {"deepcompile": false, "debug_log": true}})"));
  expect_error(R"({"log_level": 20})", {"log_level", "logging level name"});
  expect_error(R"({"tensor_parallel": {"autotp_size": 2}})", {"tensor_parallel.autotp_size = 2 is not supported"});
  expect_error(R"({"expert_parallel": {"enabled": true}})", {"expert_parallel", "not supported"});
  expect_error(R"({"compile": {"deepcompile": true}})", {"compile.deepcompile = true is not supported"});
  expect_error(R"({"datastates_ckpt": {"host_cache_size": 16}})", {"datastates_ckpt", "not supported"});
  expect_error(R"({"use_data_before_expert_parallelism": true})", {"use_data_before_expert_parallelism"});
  expect_error(R"({"zero_optimization": {"parameter_alignment": true}})",
               {"zero_optimization.parameter_alignment = true is not supported"});

  // compute_grad_norm = false is honoured, under DeepSpeed's conditions.
  Config c = Config::from_string(
      R"({"gradient_clipping": 0, "zero_optimization": {"stage": 2, "compute_grad_norm": false}})");
  EXPECT_FALSE(c.zero.compute_grad_norm);
  EXPECT_FALSE(Config::from_json(c.to_json()).zero.compute_grad_norm);
  expect_error(R"({"zero_optimization": {"stage": 2, "compute_grad_norm": false}})",
               {"compute_grad_norm = false requires gradient_clipping = 0", "1.0"});
  expect_error(R"({"gradient_clipping": 0, "zero_optimization": {"stage": 3, "compute_grad_norm": false}})",
               {"compute_grad_norm = false is supported only with ZeRO stage 1 or 2"});
  expect_error(R"({"gradient_clipping": 0, "zero_optimization": {"stage": 1, "compute_grad_norm": false,
      "offload_optimizer": {"device": "cpu"}}})", {"compute_grad_norm = false does not support optimizer offload"});

  // null is DeepSpeed's default (None) for the dtype keys and overlap_comm.
  Config n = Config::from_string(R"({"communication_data_type": null, "data_types": {"grad_accum_dtype": null},
      "zero_optimization": {"stage": 3, "overlap_comm": null}})");
  EXPECT_FALSE(n.communication_data_type.has_value());
  EXPECT_TRUE(n.zero.overlap_comm());
}

TEST(ConfigOwnKeys, MallocMmapThresholdAndCpuAllocator) {
  EXPECT_EQ(Config::from_string("{}").malloc_mmap_threshold, 1 << 20);
  Config c = Config::from_string(R"({"zero_cpp": {"malloc_mmap_threshold": 0}})");
  EXPECT_EQ(c.malloc_mmap_threshold, 0);
  EXPECT_EQ(Config::from_json(c.to_json()).malloc_mmap_threshold, 0);
  expect_error(R"({"zero_cpp": {"malloc_mmap_threshold": 67108864}})", {"zero_cpp.malloc_mmap_threshold"});
  EXPECT_EQ(Config::from_string("{}").cpu_allocator, zero::CpuAllocator::Caching);
  Config t = Config::from_string(R"({"zero_cpp": {"cpu_allocator": "torch"}})");
  EXPECT_EQ(t.cpu_allocator, zero::CpuAllocator::Torch);
  EXPECT_EQ(Config::from_json(t.to_json()).cpu_allocator, zero::CpuAllocator::Torch);
  expect_error(R"({"zero_cpp": {"cpu_allocator": "jemalloc"}})", {"zero_cpp.cpu_allocator", "jemalloc"});
}

TEST(ConfigOwnKeys, ComputeDtype) {
  EXPECT_FALSE(Config::from_string("{}").compute_dtype.has_value());  // auto: measured by the engine
  Config c = Config::from_string(R"({"bf16": {"enabled": true}, "zero_cpp": {"compute_dtype": "fp32"}})");
  EXPECT_EQ(c.compute_dtype, zero::DType::fp32);
  EXPECT_EQ(Config::from_json(c.to_json()).compute_dtype, zero::DType::fp32);
  EXPECT_EQ(Config::from_string(R"({"bf16": {"enabled": true}, "zero_cpp": {"compute_dtype": "bf16"}})").compute_dtype,
            zero::DType::bf16);
  // 16-bit compute must be the storage dtype.
  expect_error(R"({"bf16": {"enabled": true}, "zero_cpp": {"compute_dtype": "fp16"}})",
               {"zero_cpp.compute_dtype", "stored in bf16"});
  expect_error(R"({"zero_cpp": {"compute_dtype": "bf16"}})", {"zero_cpp.compute_dtype", "stored in fp32"});
  expect_error(R"({"zero_cpp": {"compute_dtype": "float64"}})", {"zero_cpp.compute_dtype"});
}

TEST(ConfigClientOptimizer, WithOptimizerFromCode) {
  Config c = Config::from_string(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}}})");
  EXPECT_FALSE(c.optimizer.given);
  Config w = zero::with_optimizer(c, zero::OptimizerConfig::adamw(3e-4, 0.1));
  EXPECT_TRUE(w.optimizer.given);
  EXPECT_EQ(w.optimizer.type, zero::OptimizerType::AdamW);
  EXPECT_DOUBLE_EQ(w.optimizer.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(w.scheduler.warmup_max_lr, 3e-4);  // WarmupLR follows the optimizer's lr
  EXPECT_FALSE(zero::OptimizerConfig::adam(1e-3).adam_w_mode);
  EXPECT_DOUBLE_EQ(zero::OptimizerConfig::sgd(0.1, 0.9).momentum, 0.9);
  Config both = Config::from_string(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1}}})");
  EXPECT_THROW(zero::with_optimizer(both, zero::OptimizerConfig::adamw(1e-3)), zero::ConfigError);
}

// DeepSpeed's Lion (FusedLion / DeepSpeedCPULion) and Adagrad
// (torch.optim.Adagrad / DeepSpeedCPUAdagrad): their constructors' defaults.
TEST(ConfigOptimizerScheduler, LionAndAdagrad) {
  Config l = Config::from_string(R"({"optimizer": {"type": "lion", "params": {"weight_decay": 0.1}}})");
  EXPECT_EQ(l.optimizer.type, zero::OptimizerType::Lion);
  EXPECT_DOUBLE_EQ(l.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(l.optimizer.betas[0], 0.9);
  EXPECT_DOUBLE_EQ(l.optimizer.betas[1], 0.999);
  EXPECT_DOUBLE_EQ(l.optimizer.weight_decay, 0.1);
  Config a = Config::from_string(R"({"optimizer": {"type": "Adagrad", "params": {"initial_accumulator_value": 0.1}}})");
  EXPECT_EQ(a.optimizer.type, zero::OptimizerType::Adagrad);
  EXPECT_DOUBLE_EQ(a.optimizer.lr, 1e-2);
  EXPECT_DOUBLE_EQ(a.optimizer.eps, 1e-10);
  EXPECT_DOUBLE_EQ(a.optimizer.initial_accumulator_value, 0.1);
  for (const Config& c : {l, a}) {
    const Config back = Config::from_json(c.to_json());
    EXPECT_EQ(back.optimizer.type, c.optimizer.type);
    EXPECT_DOUBLE_EQ(back.optimizer.lr, c.optimizer.lr);
    EXPECT_DOUBLE_EQ(back.optimizer.eps, c.optimizer.eps);
    EXPECT_EQ(back.optimizer.betas, c.optimizer.betas);
  }
  EXPECT_EQ(zero::OptimizerConfig::lion().betas[1], 0.999);
  EXPECT_DOUBLE_EQ(zero::OptimizerConfig::adagrad(0.1, 0.0, 1e-8).eps, 1e-8);
  expect_error(R"({"optimizer": {"type": "Lion", "params": {"eps": 1e-8}}})", {"optimizer.params.eps"});
  expect_error(R"({"optimizer": {"type": "Lion", "params": {"betas": [0.9, 1.5]}}})", {"optimizer.params.betas"});
  expect_error(R"({"optimizer": {"type": "Adagrad", "params": {"betas": [0.9, 0.99]}}})",
               {"optimizer.params.betas"});
  expect_error(R"({"optimizer": {"type": "Adagrad", "params": {"lr_decay": 0.1}}})", {"optimizer.params.lr_decay"});
}

// DeepSpeed's Lamb (FusedLamb): its constructor's defaults and keys.
TEST(ConfigOptimizerScheduler, Lamb) {
  Config c = Config::from_string(R"({"optimizer": {"type": "LAMB", "params": {"max_coeff": 0.3, "min_coeff": 0.01}}})");
  EXPECT_EQ(c.optimizer.type, zero::OptimizerType::Lamb);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.optimizer.max_coeff, 0.3);
  EXPECT_TRUE(c.optimizer.bias_correction);
  const Config back = Config::from_json(c.to_json());
  EXPECT_EQ(back.optimizer.type, zero::OptimizerType::Lamb);
  EXPECT_DOUBLE_EQ(back.optimizer.max_coeff, 0.3);
  EXPECT_DOUBLE_EQ(back.optimizer.min_coeff, 0.01);
  EXPECT_EQ(zero::OptimizerConfig::lamb(1e-3).type, zero::OptimizerType::Lamb);
  expect_error(R"({"optimizer": {"type": "Lamb", "params": {"min_coeff": 2, "max_coeff": 1}}})",
               {"optimizer.params.min_coeff"});
  expect_error(R"({"optimizer": {"type": "Lamb", "params": {"eps_inside_sqrt": true}}})",
               {"optimizer.params.eps_inside_sqrt"});
}

// DeepSpeed's Muon (MuonWithAuxAdam as its engine builds it): lr 0.02 and
// momentum 0.95 for the Muon params, the AdamW ones at 3e-4 with betas
// (0.9, 0.95), eps 1e-10; "lr" sets both, muon_lr / adam_lr one each.
TEST(ConfigOptimizerScheduler, Muon) {
  Config d = Config::from_string(R"({"optimizer": {"type": "muon"}})");
  EXPECT_EQ(d.optimizer.type, zero::OptimizerType::Muon);
  EXPECT_DOUBLE_EQ(d.optimizer.lr, 0.02);
  EXPECT_DOUBLE_EQ(d.optimizer.adam_lr, 3e-4);
  EXPECT_DOUBLE_EQ(d.optimizer.momentum, 0.95);
  EXPECT_DOUBLE_EQ(d.optimizer.betas[0], 0.9);
  EXPECT_DOUBLE_EQ(d.optimizer.betas[1], 0.95);
  EXPECT_DOUBLE_EQ(d.optimizer.eps, 1e-10);
  EXPECT_DOUBLE_EQ(d.optimizer.weight_decay, 0.0);
  EXPECT_EQ(d.optimizer.ns_method, "gram");
  Config both = Config::from_string(R"({"optimizer": {"type": "Muon", "params": {"lr": 0.01, "weight_decay": 0.1}}})");
  EXPECT_DOUBLE_EQ(both.optimizer.lr, 0.01);
  EXPECT_DOUBLE_EQ(both.optimizer.adam_lr, 0.01);
  Config c = Config::from_string(R"({"optimizer": {"type": "Muon", "params": {"lr": 0.01, "muon_lr": 0.05,
      "adam_lr": 1e-3, "momentum": 0.9, "ns_method": "standard", "betas": [0.8, 0.9], "eps": 1e-8}},
      "zero_optimization": {"stage": 3, "save_muon_momentum_buffer_in_memory": true}})");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.05);
  EXPECT_DOUBLE_EQ(c.optimizer.adam_lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.momentum, 0.9);
  EXPECT_EQ(c.optimizer.ns_method, "standard");
  const Config back = Config::from_json(c.to_json());
  EXPECT_EQ(back.optimizer.type, zero::OptimizerType::Muon);
  EXPECT_DOUBLE_EQ(back.optimizer.lr, 0.05);
  EXPECT_DOUBLE_EQ(back.optimizer.adam_lr, 1e-3);
  EXPECT_DOUBLE_EQ(back.optimizer.momentum, 0.9);
  EXPECT_DOUBLE_EQ(back.optimizer.betas[0], 0.8);
  EXPECT_EQ(back.optimizer.ns_method, "standard");
  const auto code = zero::OptimizerConfig::muon();
  EXPECT_EQ(code.type, zero::OptimizerType::Muon);
  EXPECT_DOUBLE_EQ(code.lr, 0.02);
  EXPECT_DOUBLE_EQ(code.adam_lr, 3e-4);
  expect_error(R"({"optimizer": {"type": "Muon", "params": {"ns_method": "svd"}}})", {"optimizer.params.ns_method"});
  expect_error(R"({"optimizer": {"type": "Muon", "params": {"momentum": 1.0}}})", {"optimizer.params.momentum"});
  expect_error(R"({"optimizer": {"type": "Muon", "params": {"nesterov": false}}})", {"optimizer.params.nesterov"});
  expect_error(R"({"optimizer": {"type": "Muon"}, "scheduler": {"type": "OneCycle",
      "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01}}})", {"cycle_momentum", "Muon"});
  EXPECT_NO_THROW(Config::from_string(R"({"optimizer": {"type": "Muon"}, "scheduler": {"type": "OneCycle",
      "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01, "cycle_momentum": false}}})"));
}

TEST(ConfigLogging, WallClockBreakdownAndCsvMonitor) {
  Config d = Config::from_string("{}");
  EXPECT_FALSE(d.wall_clock_breakdown);
  EXPECT_FALSE(d.csv_monitor.enabled);
  EXPECT_EQ(d.csv_monitor.job_name, "DeepSpeedJobName");
  Config c = Config::from_string(R"({"wall_clock_breakdown": true,
      "csv_monitor": {"enabled": true, "output_path": "/tmp/logs", "job_name": "run1"}})");
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_TRUE(c.csv_monitor.enabled);
  EXPECT_EQ(c.csv_monitor.output_path, "/tmp/logs");
  EXPECT_EQ(Config::from_json(c.to_json()).csv_monitor.job_name, "run1");
  expect_error(R"({"csv_monitor": {"enabled": true, "job_name": 3}})", {"csv_monitor.job_name"});
  expect_error(R"({"csv_monitor": {"enabled": true, "outptu_path": "x"}})", {"outptu_path"});
}

TEST(ConfigOptimizerScheduler, Values) {
  Config c = Config::from_string(R"({"optimizer": {"type": "adamw", "params": {"lr": 3e-4, "betas": [0.8, 0.95],
      "eps": 1e-6, "weight_decay": 0.1}}, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5,
      "warmup_type": "linear"}}, "communication_data_type": "bf16", "data_types": {"grad_accum_dtype": "fp32"}})");
  EXPECT_EQ(c.optimizer.type, zero::OptimizerType::AdamW);
  EXPECT_DOUBLE_EQ(c.optimizer.betas[1], 0.95);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 3e-4);  // WarmupLR defaults to the optimizer's lr
  EXPECT_EQ(c.scheduler.warmup_type, zero::WarmupType::Linear);
  EXPECT_EQ(c.comm_dtype(), zero::DType::bf16);
  EXPECT_EQ(c.grad_accum_dtype, zero::DType::fp32);

  Config d = Config::from_string(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}},
      "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10}}})");
  EXPECT_FALSE(d.optimizer.adam_w_mode);
  EXPECT_EQ(d.scheduler.total_num_steps, 100);
  EXPECT_DOUBLE_EQ(d.scheduler.cos_min_ratio, 1e-4);

  Config s = Config::from_string(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}})");
  EXPECT_EQ(s.optimizer.type, zero::OptimizerType::SGD);
  EXPECT_DOUBLE_EQ(s.optimizer.momentum, 0.9);
}

// "torch_adam": DeepSpeed builds torch.optim.AdamW from the params as given,
// so an unset weight_decay is torch's 0.01 there (FusedAdam's is 0); Adam
// without adam_w_mode is torch.optim.Adam, whose default is 0.
TEST(Config, TorchAdamTakesTorchsWeightDecayDefault) {
  auto wd = [](const char* text) { return Config::from_string(text).optimizer.weight_decay; };
  EXPECT_DOUBLE_EQ(wd(R"({"optimizer": {"type": "AdamW", "params": {"torch_adam": true}}})"), 0.01);
  EXPECT_DOUBLE_EQ(wd(R"({"optimizer": {"type": "Adam", "params": {"torch_adam": true}}})"), 0.01);
  EXPECT_DOUBLE_EQ(wd(R"({"optimizer": {"type": "AdamW", "params": {"torch_adam": true, "weight_decay": 0}}})"), 0.0);
  EXPECT_DOUBLE_EQ(wd(R"({"optimizer": {"type": "Adam", "params": {"torch_adam": true, "adam_w_mode": false}}})"),
                   0.0);
  EXPECT_DOUBLE_EQ(wd(R"({"optimizer": {"type": "AdamW", "params": {}}})"), 0.0);
}

}  // namespace

// ZeRO-Infinity's keys with DeepSpeed's defaults and meanings; what cannot
// be honoured is named.
TEST(ConfigNvme, OffloadAndAioKeysAreDeepSpeeds) {
  Config d = Config::from_string(R"({"train_batch_size": 8})");
  EXPECT_EQ(d.zero.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(d.zero.offload_param.buffer_count, 5);
  EXPECT_EQ(d.zero.offload_param.buffer_size, 100000000);
  EXPECT_EQ(d.zero.offload_param.max_in_cpu, 1000000000);
  EXPECT_FALSE(d.zero.offload_optimizer.pipeline_read);
  EXPECT_EQ(d.aio.block_size, 1048576);
  EXPECT_EQ(d.aio.queue_depth, 8);
  EXPECT_EQ(d.aio.thread_count, 1);
  EXPECT_FALSE(d.aio.single_submit);
  EXPECT_TRUE(d.aio.overlap_events);

  Config c = Config::from_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pipeline_read": true,
                            "pipeline_write": true, "buffer_count": 8, "fast_init": false}},
      "aio": {"block_size": 262144, "queue_depth": 32, "thread_count": 2, "single_submit": true,
              "overlap_events": false}})");
  EXPECT_EQ(c.zero.offload_optimizer.device, zero::OffloadDevice::NVMe);
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path, "/local_nvme");
  EXPECT_TRUE(c.zero.offload_optimizer.pipeline_read);
  EXPECT_TRUE(c.zero.offload_optimizer.pipeline_write);
  EXPECT_EQ(c.aio.block_size, 262144);
  EXPECT_EQ(c.aio.queue_depth, 32);
  EXPECT_EQ(c.aio.thread_count, 2);  // thread_count: intra_op_parallelism's older name
  EXPECT_TRUE(c.aio.single_submit);
  EXPECT_FALSE(c.aio.overlap_events);
  // What a config says survives to_json.
  Config again = Config::from_json(c.to_json());
  EXPECT_EQ(again.zero.offload_optimizer.nvme_path, "/local_nvme");
  EXPECT_TRUE(again.zero.offload_optimizer.pipeline_write);
  EXPECT_EQ(again.aio.queue_depth, 32);

  const std::pair<const char*, const char*> bad[] = {
      {R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})",
       "offload_optimizer.nvme_path is required"},
      {R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": 3}}})",
       "offload_optimizer.nvme_path"},
      {R"({"aio": {"block_size": 1000}})", "aio.block_size = 1000 must be a positive multiple of 4096"},
      {R"({"aio": {"queue_depth": 0}})", "aio.queue_depth"},
      {R"({"aio": {"use_gds": true}})", "aio.use_gds"},
      {R"({"optimizer": {"type": "Lamb"}, "zero_optimization": {"stage": 2,
           "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}})", "optimizer Lamb with"},
      {R"({"optimizer": {"type": "Muon"}, "zero_optimization": {"stage": 2,
           "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}})", "optimizer Muon with"},
      {R"({"optimizer": {"type": "Lamb"}, "zero_optimization": {"stage": 3,
           "offload_param": {"device": "nvme", "nvme_path": "/x"}}})",
       "optimizer Lamb with zero_optimization.offload_param.device = \"nvme\" is not supported yet"},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})",
       "offload_param.nvme_path is required"},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x",
           "max_in_cpu": -1}}})", "offload_param.max_in_cpu"},
  };
  for (const auto& [json, message] : bad) {
    SCOPED_TRACE(json);
    try {
      Config::from_string(json);
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}
