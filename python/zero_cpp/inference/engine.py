"""DeepSpeed's inference engine (`deepspeed.init_inference` returns one):
the model in the config's dtype on this rank's device, called as the model
is, its `generate` kept.

    engine = deepspeed.init_inference(model, dtype=torch.bfloat16)
    logits = engine(ids)                 # model(ids)
    text = engine.generate(ids, ...)     # model.generate(...), where it has one

zero_cpp is data parallel: every rank runs the whole model. DeepSpeed's
tensor parallelism and kernel injection change how a forward is computed,
not what it computes, so under them the outputs here are the model's own
(within the dtype's rounding of DeepSpeed's fused kernels); each is named in
a log line once. What this engine cannot do is an error naming the key
(docs/from-deepspeed.md, "Inference").
"""
import logging
import time

import torch

from ..accelerator import get_accelerator
from ..utils.logging import log_dist_once
from .config import _error


def _log(message):
    log_dist_once(f"zero_cpp init_inference: {message}", ranks=[0], level=logging.WARNING)


def _refuse_what_cannot_run(config):
    if config.dtype == torch.int8:
        raise _error("dtype int8 runs DeepSpeed's quantized inference kernels, which zero_cpp does not have: "
                     "use fp16, bf16 or fp32")
    if config.dtype not in get_accelerator().supported_dtypes():
        raise _error(f"dtype {config.dtype} is not supported by the {get_accelerator().device_name()} accelerator")
    if config.use_triton:
        raise _error("use_triton: DeepSpeed's Triton kernels are not part of zero_cpp; leave it false")
    for key, value in (("checkpoint", config.checkpoint), ("save_mp_checkpoint_path", config.save_mp_checkpoint_path),
                       ("checkpoint_config.checkpoint_dir", config.checkpoint_config.checkpoint_dir),
                       ("checkpoint_config.save_mp_checkpoint_path",
                        config.checkpoint_config.save_mp_checkpoint_path)):
        if value:
            raise _error(f"{key}: DeepSpeed's inference checkpoints (its JSON description of sharded weights) are not "
                         "read or written by zero_cpp; load the weights into the model first "
                         "(model.load_state_dict(torch.load(path)), or the model's from_pretrained)")
    if config.injection_policy:
        assert not config.replace_with_kernel_inject, \
            "zero_cpp init_inference: injection_policy and replace_with_kernel_inject cannot both be set"


class InferenceEngine(torch.nn.Module):
    """`deepspeed.InferenceEngine`: `.module` is the model given, in
    `config.dtype` and (unless `keep_module_on_host`) on this rank's device."""

    def __init__(self, model, config):
        super().__init__()
        _refuse_what_cannot_run(config)
        self.module = model
        self._config = config
        self.config = getattr(model, "config", None) if config.config is None else config.config
        if hasattr(model, "generate"):
            self.generate = self._generate
        self.injection_dict = config.injection_policy
        self.mp_group = config.tensor_parallel.tp_group
        self.mpu = config.tensor_parallel.mpu
        self.model_profile_enabled = False
        self.use_cuda_events = False
        self._model_times = []
        self._started = None
        self._is_compiled = False
        self._check_injection_policy()
        self._say_what_runs_as_the_model()
        {torch.float16: model.half, torch.bfloat16: model.bfloat16, torch.float32: model.float}[config.dtype]()
        if any(p.is_meta for p in model.parameters()):
            raise _error("the model's params are on the meta device (deepspeed.OnDevice(device='meta')?) and zero_cpp "
                         "reads no inference checkpoint to fill them: build the model on a real device, or "
                         "model.to_empty(device=...) and load its weights, before init_inference")
        if not config.keep_module_on_host:
            model.to(get_accelerator().current_device_name())

    def _check_injection_policy(self):
        """DeepSpeed's checks of a user's injection policy, kept (a policy
        naming no layer is a mistake either way); the policy itself would
        shard those layers for tensor parallelism, which zero_cpp does not."""
        names = [name for name, _ in self.module.named_modules()]
        for client, policy in (self.injection_dict or {}).items():
            if not (isinstance(client, type) and issubclass(client, torch.nn.Module)):
                raise _error(f"injection_policy: {client} is not a subclass of torch.nn.Module")
            for layer in (policy,) if isinstance(policy, str) else policy:
                if not any(name.endswith(layer) for name in names):
                    raise _error(f"injection_policy: no layer of the model is named '{layer}'")

    def _say_what_runs_as_the_model(self):
        c = self._config
        tp = c.tensor_parallel.tp_size if c.tensor_parallel.mpu is None else "the mpu's"
        if c.tensor_parallel.mpu is not None or c.tensor_parallel.tp_size > 1 or self.injection_dict:
            _log(f"tensor_parallel (tp_size {tp}): zero_cpp has no tensor parallelism; every rank runs the whole "
                 "model (the same outputs, each rank holding all the weights)")
        if c.replace_with_kernel_inject:
            _log("replace_with_kernel_inject: the model's own layers run (DeepSpeed's fused inference kernels are "
                 "not part of zero_cpp); outputs differ from DeepSpeed's by the dtype's rounding")
        if c.enable_cuda_graph:
            _log("enable_cuda_graph: the forward runs eagerly, not replayed from a CUDA graph")

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def _generate(self, *inputs, **kwargs):
        """The model's `generate`, its KV cache reset first where it has
        `reset_cache`; prompts longer than `max_out_tokens` refused, as
        DeepSpeed refuses them."""
        if hasattr(self.module, "reset_cache"):
            self.module.reset_cache()
        ids = kwargs.get("input_ids")
        if ids is not None and ids.dim() == 2 and ids.shape[-1] > self._config.max_out_tokens:
            raise RuntimeError(f"zero_cpp init_inference: a prompt of {ids.shape[-1]} tokens is longer than "
                               f"max_out_tokens ({self._config.max_out_tokens}): raise max_out_tokens in the config")
        return self.module.generate(*inputs, **kwargs)

    # ---- DeepSpeed's timing of the model's forwards ----
    def profile_model_time(self, use_cuda_events=True):
        """Time each forward of the model from now on; `model_times()`
        returns them (ms) and starts a new list."""
        if not self.model_profile_enabled:
            self.module.register_forward_pre_hook(self._before_forward)
            self.module.register_forward_hook(self._after_forward)
        self.model_profile_enabled = True
        self.use_cuda_events = use_cuda_events

    def _before_forward(self, module, inputs):
        get_accelerator().synchronize()
        self._started = time.perf_counter()

    def _after_forward(self, module, inputs, outputs):
        get_accelerator().synchronize()
        self._model_times.append((time.perf_counter() - self._started) * 1e3)

    def model_times(self):
        assert self.model_profile_enabled, "zero_cpp: model_times() needs profile_model_time() first"
        times, self._model_times = self._model_times, []
        return times

    # ---- torch.compile ----
    def compile(self, backend=None, compile_kwargs=None):
        if not self._is_compiled:
            kwargs = dict(compile_kwargs or {})
            if backend is not None:
                kwargs["backend"] = backend
            self.module.compile(**kwargs)
            self._is_compiled = True

    @property
    def is_compiled(self):
        return self._is_compiled

    def destroy(self):
        """DeepSpeed frees its kernels' workspace; there is none here."""
