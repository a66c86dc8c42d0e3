"""DeepSpeed's engine methods that only report its config -- batch, optimizer,
scheduler, ZeRO's knobs, the parallel ranks -- with DeepSpeed 0.19.8's values
and defaults (python_parity "accessors" holds each to DeepSpeed's). The
engine (zero_cpp.engine.ZeroEngine) mixes them in; they read its config as
given (`_config`), as the C++ parser resolved it (`_resolved`), and its
world."""
import sys

from torch.utils.data import IterableDataset

from .. import config as configs

# ZeRO's keys the C++ engine does not resolve (they tune DeepSpeed's own
# buckets and kernels), at DeepSpeed 0.19.8's defaults where the config is silent.
_ZERO_DEFAULTS = {"allgather_bucket_size": 500_000_000, "reduce_scatter": True, "allgather_partitions": True,
                  "round_robin_gradients": False, "sub_group_size": 1_000_000_000, "elastic_checkpoint": False,
                  "load_from_fp32_weights": True, "ignore_unused_parameters": True,
                  "use_multi_rank_bucket_allreduce": True, "allgather_sequential": False, "parameter_alignment": False,
                  "legacy_stage1": False, "log_trace_cache_warnings": False,
                  "model_persistence_threshold": sys.maxsize, "module_granularity_threshold": 0,
                  "zero_quantized_weights": False, "zero_quantized_nontrainable_weights": False,
                  "zero_quantized_gradients": False, "save_muon_momentum_buffer_in_memory": False}


class ConfigAccessors:

    def get_batch_info(self):
        """(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps)."""
        return self.train_batch_size(), self.train_micro_batch_size_per_gpu(), self.gradient_accumulation_steps()

    def get_data_parallel_rank(self):
        return self.global_rank  # every rank is a data-parallel rank

    def get_model_parallel_rank(self):
        return 0  # no model parallelism

    def get_tensor_parallel_rank(self):
        return 0

    def dataloader_drop_last(self):
        return bool(self._config.get("dataloader_drop_last", False))

    def optimizer_name(self):
        """The client optimizer's class name, else the config's optimizer type."""
        if self._client_optimizer is not None:
            return type(self._client_optimizer).__name__
        optimizer = self._config.get("optimizer") or {}
        return optimizer.get("type") and optimizer["type"].lower()

    def optimizer_params(self):
        return (self._config.get("optimizer") or {}).get("params")

    def scheduler_name(self):
        return (self._config.get("scheduler") or {}).get("type")

    def scheduler_params(self):
        return (self._config.get("scheduler") or {}).get("params")

    @property
    def communication_data_type(self):
        """The config's communication_data_type, else the training dtype."""
        given = self._config.get("communication_data_type")
        if given is not None:
            return configs.TORCH_DTYPES[given]
        return self.get_data_types()[0]

    def postscale_gradients(self):
        return not self._config.get("prescale_gradients", False)

    def gradient_predivide_factor(self):
        return float(self._config.get("gradient_predivide_factor", 1.0))

    def dump_state(self):
        return bool(self._config.get("dump_state", False))

    def memory_breakdown(self):
        return bool(self._config.get("memory_breakdown", False))

    # ---- fp16's loss scaler ----
    def fp16_auto_cast(self):
        return bool((self._config.get("fp16") or {}).get("auto_cast", False))

    def initial_dynamic_scale(self):
        return 2 ** self._resolved["fp16"]["initial_scale_power"]

    def dynamic_loss_scale_args(self):
        """The dynamic loss scaler's settings under DeepSpeed's names."""
        f = self._resolved["fp16"]
        return {"init_scale": self.initial_dynamic_scale(), "scale_window": f["loss_scale_window"],
                "delayed_shift": f["hysteresis"], "consecutive_hysteresis": f["consecutive_hysteresis"],
                "min_scale": f["min_loss_scale"]}

    # ---- master weights, the flops profiler, features zero_cpp does not run (their defaults) ----
    def bf16_master_weights_and_gradients(self):
        return bool((self._config.get("bf16") or {}).get("bf16_master_weights_and_grads", False))

    def bf16_optimizer_states(self):
        return bool((self._config.get("bf16") or {}).get("bf16_optimizer_states", False))

    def fp16_master_weights_and_gradients(self):
        return bool((self._config.get("fp16") or {}).get("fp16_master_weights_and_grads", False))

    def autotuning_enabled(self):
        return bool((self._config.get("autotuning") or {}).get("enabled", False))

    def flops_profiler_enabled(self):
        return bool(self._flops["enabled"]) or self.autotuning_enabled()

    def flops_profiler_recompute_fwd_factor(self):
        return self._flops["recompute_fwd_factor"]

    def flops_profiler_profile_step(self):
        return self._flops["profile_step"]

    def flops_profiler_module_depth(self):
        return self._flops["module_depth"]

    def flops_profiler_top_modules(self):
        return self._flops["top_modules"]

    def flops_profiler_detailed(self):
        return self._flops["detailed"]

    def flops_profiler_output_file(self):
        return self._flops["output_file"]

    def data_efficiency_enabled(self):
        return False  # DeepSpeed's data efficiency library (curriculum, data routing) is not run here

    def curriculum_learning_enabled(self):
        return False

    def data_sampling_enabled(self):
        return False

    def random_ltd_enabled(self):
        return False

    def autotp_size(self):
        return 0  # no tensor parallelism (DeepSpeed's default: 0, off)

    # ---- checkpoints ----
    def checkpoint_tag_validation_enabled(self):
        return self._tag_validation() != "IGNORE"

    def checkpoint_tag_validation_fail(self):
        return self._tag_validation() == "FAIL"

    def load_universal_checkpoint(self):
        return bool((self._config.get("checkpoint") or {}).get("load_universal", False))  # only false is taken

    def use_node_local_storage(self):
        return bool((self._config.get("checkpoint") or {}).get("use_node_local_storage", False))  # likewise

    def _tag_validation(self):
        return str((self._config.get("checkpoint") or {}).get("tag_validation", "Warn")).upper()

    # ---- datasets ----
    @staticmethod
    def is_map_style_dataset(obj):
        return hasattr(obj, "__getitem__") and hasattr(obj, "__len__")

    @staticmethod
    def is_iterable_style_dataset(obj):
        return isinstance(obj, IterableDataset)

    # ---- ZeRO's settings ----
    def zero_optimization_partition_gradients(self):
        return self._stage >= 2

    def zero_optimization_partition_weights(self):
        return self._stage >= 3

    def zero_cpu_offload(self):
        return self._zero_resolved("offload_optimizer")["device"] == "cpu"

    def zero_use_cpu_optimizer(self):
        return self._zero_resolved("offload_optimizer")["device"] in ("cpu", "nvme")

    def zero_reduce_bucket_size(self):
        return self._zero_resolved("reduce_bucket_size")

    def zero_contiguous_gradients(self):
        return self._zero_resolved("contiguous_gradients")

    def zero_param_persistence_threshold(self):
        return self._zero_resolved("stage3_param_persistence_threshold")

    def zero_max_live_parameters(self):
        return self._zero_resolved("stage3_max_live_parameters")

    def zero_max_reuse_distance(self):
        return self._zero_resolved("stage3_max_reuse_distance")

    def zero_prefetch_bucket_size(self):
        return self._zero_resolved("stage3_prefetch_bucket_size")

    def zero_hpz_partition_size(self):
        return self._zero_resolved("zero_hpz_partition_size")

    def zero_allgather_bucket_size(self):
        return self._zero_given("allgather_bucket_size")

    def zero_reduce_scatter(self):
        return self._zero_given("reduce_scatter")

    def zero_allgather_partitions(self):
        return self._zero_given("allgather_partitions")

    def zero_round_robin_gradients(self):
        return self._zero_given("round_robin_gradients")

    def zero_sub_group_size(self):
        return self._zero_given("sub_group_size")

    def zero_elastic_checkpoint(self):
        return self._zero_given("elastic_checkpoint")

    def zero_load_from_fp32_weights(self):
        return self._zero_given("load_from_fp32_weights")

    def zero_ignore_unused_parameters(self):
        return self._zero_given("ignore_unused_parameters")

    def zero_overlap_comm(self):
        return self._zero_resolved("overlap_comm")

    def zero_compute_grad_norm(self):
        return self._zero_resolved("compute_grad_norm")

    def zero_nvme_offload_optimizer(self):
        return self._zero_resolved("offload_optimizer")["device"] == "nvme"

    def zero_partial_offload(self):
        return float((self._zero_given_block("offload_optimizer") or {}).get("ratio", 1.0))

    def zero_multi_rank_bucket_allreduce(self):
        return self._zero_given("use_multi_rank_bucket_allreduce")

    def zero_allgather_sequential(self):
        return self._zero_given("allgather_sequential")

    def zero_parameter_alignment(self):
        return self._zero_given("parameter_alignment")

    def zero_legacy_stage1(self):
        return self._zero_given("legacy_stage1")

    def zero_log_trace_cache_warnings(self):
        return self._zero_given("log_trace_cache_warnings")

    def zero_model_persistence_threshold(self):
        return self._zero_given("model_persistence_threshold")

    def zero_module_granularity_threshold(self):
        return self._zero_given("module_granularity_threshold")

    def zero_quantized_weights(self):
        return self._zero_given("zero_quantized_weights")  # only false is taken

    def zero_quantized_nontrainable_weights(self):
        return self._zero_given("zero_quantized_nontrainable_weights")

    def zero_quantized_gradients(self):
        return self._zero_given("zero_quantized_gradients")

    def zero_save_muon_momentum_buffer_in_memory(self):
        return self._zero_given("save_muon_momentum_buffer_in_memory")

    def zero_allow_untested_optimizer(self):
        return bool(self._config.get("zero_allow_untested_optimizer", False))

    def zero_force_ds_cpu_optimizer(self):
        return bool(self._config.get("zero_force_ds_cpu_optimizer", True))

    def _zero_given_block(self, key):
        return (self._config.get("zero_optimization") or {}).get(key)

    def _zero_resolved(self, key):
        return self._resolved["zero_optimization"][key]

    def _zero_given(self, key):
        value = (self._config.get("zero_optimization") or {}).get(key, _ZERO_DEFAULTS[key])
        return int(value) if isinstance(value, float) and value.is_integer() else value
