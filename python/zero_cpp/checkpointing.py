"""DeepSpeed's `deepspeed.checkpointing` (activation checkpointing): torch's
own reentrant checkpoint, DeepSpeed's semantics (outputs need grad only if an
input does, so a checkpointed layer fed by no input that needs grad gets no
grads, as under DeepSpeed), which the engine's stage-3 hooks follow as any
recompute (a unit's forward runs again in backward and is gathered again).
`non_reentrant_checkpoint` is torch's non-reentrant one.

Its settings (`configure()`, or the ds_config's activation_checkpointing
block) act as DeepSpeed's do without model parallelism, the only kind
zero_cpp has:
- partition_activations splits the saved inputs across the model-parallel
  group; with a group of one rank there is nothing to split, so it changes
  nothing here, as in DeepSpeed with no mpu. contiguous_memory_optimization
  and number_checkpoints lay those partitions out in one buffer: likewise.
- cpu_checkpointing keeps the saved inputs in host memory until the
  recompute (torch's save_on_cpu; on a CPU model they are there already).
- synchronize_checkpoint_boundary synchronizes the device before and after
  each checkpointed call.
- profile (DeepSpeed's timing of each checkpoint) is refused.
"""
import contextlib

import torch
import torch.utils.checkpoint as _torch_checkpoint

from . import config as configs
from .accelerator import get_accelerator

_DEFAULTS = configs.PYTHON_BLOCKS["activation_checkpointing"]
_settings = None  # None until configure(): DeepSpeed's is_configured()


def checkpoint(function, *args, **kwargs):
    """`function(*args, **kwargs)`, its activations recomputed in backward
    rather than kept (reentrant, as DeepSpeed's)."""
    if kwargs:  # the reentrant checkpoint takes positional arguments only
        keys, positional = tuple(kwargs), len(args)
        call = function

        def function(*all_args):
            return call(*all_args[:positional], **dict(zip(keys, all_args[positional:])))
        args = args + tuple(kwargs.values())
    return _run(function, args, reentrant=True)


def non_reentrant_checkpoint(function, *args, **kwargs):
    """As checkpoint(), torch's non-reentrant recomputation."""
    return _run(lambda *a: function(*a, **kwargs), args, reentrant=False, kwargs=kwargs)


def _run(function, args, reentrant, kwargs=None):
    settings = _settings or _DEFAULTS
    keep_on_host = settings["cpu_checkpointing"] and any(
        isinstance(a, torch.Tensor) and not a.is_cpu for a in args + tuple((kwargs or {}).values()))
    saving = torch.autograd.graph.save_on_cpu(pin_memory=True) if keep_on_host else contextlib.nullcontext()
    sync = settings["synchronize_checkpoint_boundary"]
    if sync:
        get_accelerator().synchronize()
    with saving:
        out = _torch_checkpoint.checkpoint(function, *args, use_reentrant=reentrant)
    if sync:
        get_accelerator().synchronize()
    return out


def configure(mpu_, deepspeed_config=None, partition_activations=None, contiguous_checkpointing=None,
              num_checkpoints=None, checkpoint_in_cpu=None, synchronize=None, profile=None):
    """DeepSpeed's: the settings from `deepspeed_config` (a path or a dict:
    its activation_checkpointing block), each argument given overriding it."""
    global _settings
    if mpu_ is not None:
        raise NotImplementedError("zero_cpp.checkpointing.configure: an mpu (model parallelism) is not supported")
    block = dict(_DEFAULTS)
    if deepspeed_config is not None:
        block = configs.python_block(configs.load(config=deepspeed_config), "activation_checkpointing")
    for key, value in (("partition_activations", partition_activations),
                       ("contiguous_memory_optimization", contiguous_checkpointing),
                       ("number_checkpoints", num_checkpoints), ("cpu_checkpointing", checkpoint_in_cpu),
                       ("synchronize_checkpoint_boundary", synchronize), ("profile", profile)):
        if value is not None:
            block[key] = value
    check(block)
    _settings = block


def check(block):
    """DeepSpeedConfigError for settings DeepSpeed refuses, or zero_cpp does."""
    if block["profile"]:
        raise configs.DeepSpeedConfigError("activation_checkpointing.profile = true is not supported by zero_cpp "
                                           "(time the checkpointed calls with wall_clock_breakdown instead)")
    if block["contiguous_memory_optimization"] and not block["partition_activations"]:
        raise configs.DeepSpeedConfigError("activation_checkpointing.contiguous_memory_optimization needs "
                                           "partition_activations = true (as DeepSpeed)")
    if block["contiguous_memory_optimization"] and block["number_checkpoints"] is None:
        raise configs.DeepSpeedConfigError("activation_checkpointing.contiguous_memory_optimization needs "
                                           "number_checkpoints (as DeepSpeed)")


def is_configured():
    return _settings is not None


def reset():
    """DeepSpeed clears its contiguous buffers between iterations; there are none."""
