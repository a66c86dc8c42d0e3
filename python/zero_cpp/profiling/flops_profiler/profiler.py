"""DeepSpeed's flops profiler API (`deepspeed.profiling.flops_profiler`):
FlopsProfiler around a model's forward, and get_model_profile for one
forward of a model.

While profiling, every module carries `__flops__` and `__macs__`, the work
of its forwards less that of its profiled submodules (what is counted:
counter.py; a recurrent module's, recurrent.py), `__duration__`, the
seconds in its forwards, and `__params__`, the elements of its parameters,
its submodules' and frozen ones included. A module of an ignored type
keeps zeros: its work counts to the profiled module around it, as in
DeepSpeed.
"""
import itertools
import os
import sys
import time

import torch
import torch.nn as nn

from .counter import ForwardCounter
from .recurrent import RECURRENT_MODULES, recurrent_flops
from .report import write_aggregated_profile, write_profile
from .sums import get_module_duration, get_module_flops, get_module_macs
from .units import duration_to_string, macs_to_string, number_to_string, params_to_string

_ATTRIBUTES = ("__flops__", "__macs__", "__params__", "__duration__")


class FlopsProfiler:
    """Profiles the forwards of `model` between start_profile() and
    stop_profile(): latency, flops and MACs by module, and parameters.

        prof = FlopsProfiler(model)
        prof.start_profile()
        loss = model(batch)
        prof.stop_profile()
        flops, params = prof.get_total_flops(), prof.get_total_params()
        prof.print_model_profile(profile_step=step)
        prof.end_profile()

    `ds_engine`, optional, only adds lines to print_model_profile, from
    whichever of these it has: `world_size`, `dp_world_size`,
    `mp_world_size` (the params and flops "of model" are the per-GPU ones
    times it; 1 when absent), `train_micro_batch_size_per_gpu()`, and, when
    `wall_clock_breakdown()` is true and it has `timers`, the backward and
    step latencies from `timers(name).elapsed(False)` (milliseconds, for
    "fwd", "bwd" and "step"). `recompute_fwd_factor` is the share of the
    forward that the backward recomputes (activation checkpointing), used
    in the backward FLOPS printed then.
    """

    def __init__(self, model, ds_engine=None, recompute_fwd_factor=0.0):
        self.model = model
        self.ds_engine = ds_engine
        self.recompute_fwd_factor = recompute_fwd_factor
        self.started = False
        self._hooks = []
        self._calls = []  # the profiled forwards under way, innermost last

    def start_profile(self, ignore_list=None):
        """Zeroes the counts and hooks every module whose type is not in
        `ignore_list`."""
        self.reset_profile()
        self._remove_hooks()
        self._ignored = tuple(ignore_list or ())
        self._counter = ForwardCounter()
        self._synchronize = _synchronizer(self.model)
        for module in self.model.modules():
            # The exact type, as DeepSpeed matches it. An ignored recurrent module is hooked
            # still, so that its kernels, which DeepSpeed does not see, count nowhere.
            if type(module) not in self._ignored or type(module) in RECURRENT_MODULES:
                self._hooks += [module.register_forward_pre_hook(self._enter),
                                module.register_forward_hook(self._leave, always_call=True)]
        self.started = True

    def stop_profile(self):
        """Stops counting; the counts stay readable until end_profile()."""
        self._remove_hooks()

    def reset_profile(self):
        """Zeroes every module's counts and recounts its parameters."""
        for module in self.model.modules():
            module.__flops__ = module.__macs__ = 0
            module.__duration__ = 0.0
            # A stage-3 param released to its shard keeps its full size in ds_numel.
            module.__params__ = sum(getattr(p, "ds_numel", p.numel()) for p in module.parameters())

    def end_profile(self):
        """Stops counting and removes the counts from the modules."""
        if not self.started:
            return
        self.stop_profile()
        self.started = False
        for module in self.model.modules():
            for name in _ATTRIBUTES:
                module.__dict__.pop(name, None)

    def get_total_flops(self, as_string=False):
        flops = get_module_flops(self.model)
        return number_to_string(flops) if as_string else flops

    def get_total_macs(self, as_string=False):
        macs = get_module_macs(self.model)
        return macs_to_string(macs) if as_string else macs

    def get_total_duration(self, as_string=False):
        """Seconds in the model's forwards."""
        duration = get_module_duration(self.model)
        return duration_to_string(duration) if as_string else duration

    def get_total_params(self, as_string=False):
        params = self.model.__params__
        return params_to_string(params) if as_string else params

    def print_model_profile(self, profile_step=1, module_depth=-1, top_modules=1, detailed=True, output_file=None):
        """Writes the totals, the `top_modules` module types by params, MACs
        and latency at each depth down to `module_depth` (-1: all), and, if
        `detailed`, the module tree with each module's profile; to stdout, or
        to `output_file` (replaced). Only while profiling (after
        start_profile(), before end_profile())."""
        if not self.started:
            return
        if not output_file:
            write_profile(sys.stdout, self, profile_step, module_depth, top_modules, detailed)
            return
        os.makedirs(os.path.dirname(os.path.abspath(output_file)), exist_ok=True)
        with open(output_file, "w") as out:
            write_profile(out, self, profile_step, module_depth, top_modules, detailed)

    def print_model_aggregated_profile(self, module_depth=-1, top_modules=1):
        """The `top_modules` module types by params, MACs and latency at each
        depth down to `module_depth` (-1: all), to stdout."""
        write_aggregated_profile(sys.stdout, self.model, module_depth, top_modules)

    def _enter(self, module, inputs):
        if not self._calls:
            self._counter.__enter__()  # only inside forwards: a backward or a step runs uncounted
        flops, macs = self._counter.totals()
        self._synchronize()
        self._calls.append(_Call(flops, macs, time.perf_counter()))

    def _leave(self, module, inputs, output):
        self._synchronize()
        end = time.perf_counter()
        call = self._calls.pop()
        flops, macs = self._counter.totals()
        flops, macs = flops - call.flops, macs - call.macs  # with its callees'
        if type(module) not in self._ignored:
            module.__duration__ += end - call.start
            if type(module) in RECURRENT_MODULES:
                module.__flops__ += recurrent_flops(module, inputs)  # in place of its kernels'
            else:
                module.__flops__ += flops - call.callee_flops
                module.__macs__ += macs - call.callee_macs
        if self._calls:
            self._calls[-1].callee_flops += flops
            self._calls[-1].callee_macs += macs
        else:
            self._counter.__exit__(None, None, None)

    def _remove_hooks(self):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


class _Call:
    """A profiled module's forward under way: the counts when it began, and
    those of the profiled forwards it called."""
    __slots__ = ("flops", "macs", "start", "callee_flops", "callee_macs")

    def __init__(self, flops, macs, start):
        self.flops, self.macs, self.start = flops, macs, start
        self.callee_flops = self.callee_macs = 0


def _synchronizer(model):
    """A module's wall time covers its kernels only if the GPU is waited for."""
    devices = {t.device for t in itertools.chain(model.parameters(), model.buffers()) if t.is_cuda}

    def synchronize():
        for device in devices:
            torch.cuda.synchronize(device)
    return synchronize


# args and kwargs: DeepSpeed's signature; neither is modified.
def get_model_profile(model, input_shape=None, args=[], kwargs={}, print_profile=True, detailed=True, module_depth=-1,
                      top_modules=1, warm_up=1, as_string=True, output_file=None, ignore_modules=None,
                      mode="forward"):
    """Profiles one forward of `model` (in eval mode, where it is left)
    after `warm_up` unprofiled ones, and returns (flops, MACs, params):
    strings with units if `as_string`, else numbers.

    The model is called with `args` and `kwargs`, or, given `input_shape`
    (a tuple), with one tensor of that shape, of the dtype and on the device
    of the model's first parameter, in place of `args`. `mode="generate"`
    profiles `model.generate(...)` instead. The printing arguments are
    print_model_profile's; `ignore_modules`, module types not profiled.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"get_model_profile: model must be a torch.nn.Module, not {type(model).__name__}")
    if mode not in ("forward", "generate"):
        raise ValueError(f"get_model_profile: mode must be 'forward' or 'generate', not {mode!r}")
    args, kwargs = list(args or ()), dict(kwargs or {})  # DeepSpeed's docs pass None for either
    if input_shape is not None:
        if not isinstance(input_shape, tuple) or not input_shape:
            raise ValueError(f"get_model_profile: input_shape must be a non-empty tuple, not {input_shape!r}")
        first = next(model.parameters(), None)
        like = {} if first is None else {"dtype": first.dtype, "device": first.device}
        args = [torch.zeros(input_shape, **like)]
    if not args and not kwargs:
        raise ValueError("get_model_profile: give input_shape, args or kwargs for the model's forward")

    run = model.generate if mode == "generate" else model
    model.eval()
    for _ in range(warm_up):
        run(*args, **kwargs)
    prof = FlopsProfiler(model)
    prof.start_profile(ignore_list=ignore_modules)
    try:
        run(*args, **kwargs)
        prof.stop_profile()
        flops, macs, params = prof.get_total_flops(), prof.get_total_macs(), prof.get_total_params()
        if print_profile:
            prof.print_model_profile(profile_step=warm_up, module_depth=module_depth, top_modules=top_modules,
                                     detailed=detailed, output_file=output_file)
    finally:
        prof.end_profile()
    if as_string:
        return number_to_string(flops), macs_to_string(macs), params_to_string(params)
    return flops, macs, params
