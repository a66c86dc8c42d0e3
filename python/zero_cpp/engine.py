"""DeepSpeed's engine API over zero-cpp's C++ engine.

`initialize()` returns `(engine, optimizer, training_dataloader,
lr_scheduler)` as `deepspeed.initialize` does. The engine wraps the model
(`engine.module`), and its forward, backward and step run the C++ engine:
flattening, sharding, gathers, reductions, the optimizer and checkpoints
stay in C++. What is Python here is the API: arguments, the model's mirror
and stage 3's hooks (mirror.py), the optimizer and scheduler objects
(optimizer.py), the data loader and the client state of checkpoints.
"""
import base64
import collections
import contextlib
import copy
import functools
import hashlib
import json
import os
import pickle
import warnings
import weakref

import torch
from torch.utils.data import DataLoader, DistributedSampler

from . import _C
from . import comm
from . import config as configs
from . import deepspeed_alias
from . import distributed
from . import optimizer as optimizers
from .mirror import EXTERNAL_PREFIX, Mirror, UnitHooks, mark_partitioned, tensors_in
from .monitor import MonitorMaster
from .profiling.flops_profiler import FlopsProfiler
from .utils.timer import (BACKWARD_INNER_GLOBAL_TIMER, BACKWARD_REDUCE_GLOBAL_TIMER, EngineTimers,
                          SynchronizedWallClockTimer, ThroughputTimer)
from .runtime.config import monitor_config
from .runtime.config_accessors import ConfigAccessors
from .runtime.utils import see_memory_usage
from .runtime.torch_autocast import AutocastSettings, autocast_if_enabled
from .utils.z3_leaf_module import apply_zero_leaf_module_config
from .zero import released_params, state_dict_at_rest

_ENGINES = []  # weak references to the live engines (zero.GatheredParameters finds a param's engine)


class ZeroDataLoader:
    """DeepSpeed's DeepSpeedDataLoader: the training data cut by a
    DistributedSampler (this rank's share of each epoch, shuffled with seed
    0 as torch's sampler does; in order for evaluation) into micro-batches
    of train_micro_batch_size_per_gpu. Iterating starts an epoch;
    `data_sampler.set_epoch(e)` reshuffles, as with DeepSpeed. Loading runs
    in the training process unless num_local_io_workers says otherwise
    (DeepSpeed's default is 2 worker processes; the batches are the same)."""

    def __init__(self, dataset, batch_size, rank, world_size, collate_fn=None, drop_last=False, pin_memory=False,
                 shuffle=True, num_workers=0):
        self.dataset = dataset
        self.batch_size = batch_size
        self.data_sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle)
        self.collate_fn = collate_fn
        self.dataloader_drop_last = drop_last
        self.pin_memory = pin_memory
        self.num_local_io_workers = num_workers
        n = len(self.data_sampler)
        self.len = n // batch_size if drop_last else -(-n // batch_size)
        self.data = None

    def __len__(self):
        return self.len

    def __iter__(self):
        kwargs = {} if self.collate_fn is None else {"collate_fn": self.collate_fn}
        self.dataloader = DataLoader(self.dataset, batch_size=self.batch_size, sampler=self.data_sampler,
                                     drop_last=self.dataloader_drop_last, pin_memory=self.pin_memory,
                                     num_workers=self.num_local_io_workers, **kwargs)
        self.data = iter(self.dataloader)
        return self

    def __next__(self):
        return next(self.data)


class ZeroEngine(ConfigAccessors, torch.nn.Module):
    """DeepSpeed's DeepSpeedEngine, on the C++ engine. Build it with
    zero_cpp.initialize()."""

    def __init__(self, args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
                 lr_scheduler=None, collate_fn=None, config=None, dist_init_required=None, config_params=None):
        super().__init__()
        if model is None:
            raise configs.DeepSpeedConfigError("zero_cpp.initialize requires a model")
        if not isinstance(model, torch.nn.Module):
            raise configs.DeepSpeedConfigError(f"zero_cpp.initialize: model is a {type(model).__name__}, not a "
                                               f"torch.nn.Module")
        distributed.init_distributed(dist_init_required=dist_init_required)
        self._world = distributed.world()
        if args is not None and hasattr(args, "local_rank"):
            # As DeepSpeed's: a tutorial's --local_rank (default -1; torchrun and
            # zero-run pass none) becomes this process's local rank.
            args.local_rank = self._world.local_rank
        cfg = configs.load(args, config, config_params)
        self.module = model
        self.device = torch.device(self._world.device)
        if self.device.type == "cuda":
            model.to(self.device)
        _widen_16bit_params(model)
        self._client_optimizer = optimizer  # DeepSpeed's optimizer_name() names its class
        basic, cxx_groups = optimizers.plan(model, optimizer, model_parameters, cfg)
        self.lr_scheduler = optimizers.scheduler(lr_scheduler, basic, cfg)
        self._config = configs.for_engine(cfg)
        self._stage = configs.stage(self._config)
        self._precision = configs.precision(self._config)
        self._optimizer_type = self._config["optimizer"]["type"]
        _warn_of_fp32_norm_statistics(model, self._config, self._precision, self.device)
        self._autocast = AutocastSettings(configs.python_block(self._config, "torch_autocast"), self.device.type)
        configs.resolve_batch(self._config, self._world.size)  # sizes that do not add up: named before any work
        # Every key as the C++ engine resolved it (its defaults filled in): what the config accessors report.
        self._resolved = json.loads(_C.parse_config(configs.for_cxx(self._config)))
        apply_zero_leaf_module_config(model, configs.leaf_module(self._config))  # before the units are chosen
        self._mirror = Mirror(model, stage3=self._stage == 3, world=self._world)
        self._engine = _C.Engine(self._world, self._mirror.root, configs.for_cxx(self._config), cxx_groups)
        self._hooks = UnitHooks(self._mirror.units) if self._stage == 3 else None
        # Rank 0's TensorBoard and CSV writers, for the engine's events and the script's.
        self.monitor = MonitorMaster(monitor_config(self._config))
        # Samples per second for scripts that read it; the engine's own
        # progress line (steps_per_print) already reports the rate.
        self.tput_timer = ThroughputTimer(None, batch_size=self.train_batch_size(),
                                          steps_per_output=self.steps_per_print())
        # As DeepSpeed's initialize: the process's comms logger takes the config's settings.
        comm.comms_logger.configure(**configs.python_block(self._config, "comms_logger"))
        self._flops = configs.python_block(self._config, "flops_profiler")
        self.flops_profiler = FlopsProfiler(model, self, self._flops["recompute_fwd_factor"]) \
            if self._flops["enabled"] else None
        # DeepSpeed's engine.timers: each phase under DeepSpeed's names, per
        # micro-step with wall_clock_breakdown, per step also for the flops
        # profile's latency lines; get_wall_clock_timers() reads them.
        self.timers = SynchronizedWallClockTimer()
        self.engine_timers = EngineTimers(enable_micro_timers=self.wall_clock_breakdown(),
                                          enable_global_timers=self.wall_clock_breakdown() or self._flops["enabled"])
        self.engine_timers_cache = {}
        if self._stage == 3:
            mark_partitioned(model.parameters())
            released_params.name(model.named_parameters())
            _attach_local_parts(model, self._engine)
            state_dict_at_rest.guard(model.modules())
        self._in_forward = 0  # engine forwards running now (the model's forward inside them)
        _clear_engine_grads_with_module(model, self)
        if self._stage == 3:
            _route_direct_calls_through_engine(model, self)
        self._aliases = _aliases(model)
        self._samples_before, self._steps_before = 0, 0  # global_samples across batch-size changes
        # Each param's name, by identity (the accessors look params up per call).
        self._param_names = {id(p): (p, n) for n, p in model.named_parameters()}
        self.optimizer = optimizers.ZeroOptimizer(self, basic)
        self._fixed_settings = [{k: g[k] for k in ("betas", "eps", "momentum") if k in g} for g in basic.param_groups]
        self._step_applied = False
        self.collate_fn = collate_fn
        self.training_dataloader = None
        if training_data is not None:
            self.training_dataloader = self.deepspeed_io(training_data)
        import weakref
        _ENGINES.append(weakref.ref(self))
        self.train(model.training)

    def __getattr__(self, name):
        """As DeepSpeed's engine: an attribute the engine does not have is
        the model's (engine.config of a Hugging Face model, a method of it)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self.__dict__.get("_modules", {}).get("module")
            if module is not None and hasattr(module, name):
                return getattr(module, name)
            raise

    # ---- the job ----
    @property
    def global_rank(self):
        return self._world.rank

    @property
    def world_size(self):
        return self._world.size

    @property
    def dp_world_size(self):
        return self._world.size

    @property
    def local_rank(self):
        return self._world.local_rank

    mp_world_size = 1

    # ---- the config ----
    def train_batch_size(self):
        return self._engine.batch[0]

    def train_micro_batch_size_per_gpu(self):
        return self._engine.batch[1]

    def gradient_accumulation_steps(self):
        return self._engine.batch[2]

    def set_train_batch_size(self, train_batch_size):
        """DeepSpeed's: another global batch from now on, by another number
        of micro-batches per step (the micro-batch stays). As DeepSpeed's,
        the micro-steps counted so far stay: the next step ends at the next
        micro-step count the new accumulation count divides."""
        per_micro = self.train_micro_batch_size_per_gpu() * self.world_size
        if train_batch_size % per_micro != 0:
            raise ValueError(f"Train batch size must be divisible by micro-batch data parallelism "
                             f"({train_batch_size} by {per_micro})")
        self._set_batch(self.train_micro_batch_size_per_gpu(), train_batch_size // per_micro)

    def set_train_micro_batch_size(self, micro_batch_size):
        """DeepSpeed's: another micro-batch size from now on, the number of
        micro-batches per step kept (the global batch follows)."""
        self._set_batch(int(micro_batch_size), self.gradient_accumulation_steps())

    def _set_batch(self, micro, gas):
        self._samples_before = self.global_samples  # the samples trained so far keep their count
        self._steps_before = self.global_steps
        self._engine.set_batch(micro, gas)
        self.tput_timer.batch_size = self.train_batch_size()

    def offload_states(self, include=None, device=None, pin_memory=True, non_blocking=False):
        """DeepSpeed's: the engine's states on the device moved into host
        memory, their device memory given back, until reload_states() --
        `include` DeepSpeed's OffloadStateTypeEnum members (or their names),
        None for all. Buffers already in host memory stay where they are (on
        a CPU engine nothing moves). The copies are synchronous
        (`non_blocking` changes nothing). Training, saving and reading the
        states raise until reload_states()."""
        from .runtime.zero.offload_config import OffloadDeviceEnum
        # By value: DeepSpeed's own enums (a script importing them from an
        # installed DeepSpeed) are taken as these.
        device = OffloadDeviceEnum(getattr(device, "value", device) if device is not None else "cpu")
        names = None if include is None else [getattr(k, "value", k) for k in include]  # the engine names a wrong one
        assert not self.zero_offload_param(), "Moving states across devices is not supported for offloaded parameters."
        assert self.optimizer is not None, "Moving states across devices is not supported without an optimizer."
        if device == OffloadDeviceEnum.none:
            warnings.warn("offload_states: no device given (OffloadDeviceEnum.none): nothing moved")
            return
        if device == OffloadDeviceEnum.nvme:
            raise ValueError("NVMe offload is not supported for offloading states.")
        if names == []:
            return
        self._engine.offload_states(names or [], bool(pin_memory))

    def reload_states(self, non_blocking=False):
        """DeepSpeed's: every state offload_states moved back on the device, as it was."""
        assert self.optimizer is not None, "Moving states across devices is not supported without an optimizer."
        self._engine.reload_states()

    def zero_optimization_stage(self):
        return self._stage

    def zero_optimization(self):
        return self._stage > 0

    def bfloat16_enabled(self):
        return self._precision == "bf16"

    def fp16_enabled(self):
        return self._precision == "fp16"

    def torch_autocast_enabled(self):
        return self._autocast.enabled

    def torch_autocast_dtype(self):
        """The config's torch_autocast.dtype (None where it leaves it to torch)."""
        return self._autocast.dtype

    def torch_autocast_lower_precision_safe_modules(self):
        return self._autocast.safe_modules()

    def gradient_clipping(self):
        # What the C++ engine clips at: its parser's value (1.0 when the key is
        # absent, DeepSpeed 0.19.8's default too), not the dict's key.
        return float(self._resolved["gradient_clipping"])

    def steps_per_print(self):
        return self._config.get("steps_per_print", 10)

    @property
    def config(self):
        return self._config

    # ---- counters ----
    @property
    def global_steps(self):
        # DeepSpeed counts a step skipped for fp16 overflow too.
        return self._engine.global_steps + self._engine.skipped_steps

    @property
    def skipped_steps(self):
        return self._engine.skipped_steps

    @property
    def micro_steps(self):
        return self._engine.micro_steps

    @property
    def global_samples(self):
        # Steps since the batch size last changed (set_train_batch_size) at today's size.
        return self._samples_before + (self.global_steps - self._steps_before) * self.train_batch_size()

    def loss_scale(self):
        """DeepSpeed's: the config's static fp16 loss scale, 0.0 when dynamic
        (the scale now is optimizer.cur_scale)."""
        return float(self._resolved["fp16"]["loss_scale"])

    def dynamic_loss_scale(self):
        return self.loss_scale() == 0

    def get_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def get_mom(self):
        """Each group's betas (Adam-like) or momentum (SGD), as DeepSpeed's."""
        return [g["betas"] if "betas" in g else g.get("momentum") for g in self.optimizer.param_groups]

    def zero_offload_optimizer(self):
        return self._resolved["zero_optimization"]["offload_optimizer"]["device"] != "none"

    def zero_offload_param(self):
        return self._resolved["zero_optimization"]["offload_param"]["device"] != "none"

    def wall_clock_breakdown(self):
        return bool(self._resolved["wall_clock_breakdown"])

    def get_data_types(self):
        """(the model's training dtype, the dtype grads accumulate in), as DeepSpeed's."""
        model_dtype = configs.TORCH_DTYPES[self._precision]
        accum = self._resolved.get("data_types", {}).get("grad_accum_dtype")
        return model_dtype, configs.TORCH_DTYPES[accum] if accum is not None else model_dtype

    def get_global_grad_norm(self):
        """The last step's grad norm over all ranks (before clipping), as
        DeepSpeed's: a 0-dim fp32 tensor on the engine's device at stages 1-3
        (where DeepSpeed's ZeRO optimizer computes it), a float at stage 0;
        inf after an fp16 overflow skipped the step; None where none was
        computed."""
        norm = float("inf") if self.optimizer.overflow else self._engine.last_grad_norm
        if norm != norm:  # NaN: not computed
            return None
        return torch.tensor(norm, dtype=torch.float32, device=self.device) if self._stage > 0 else norm

    def empty_partition_cache(self):
        """DeepSpeed's (stage 3): releases the params a stage-3 engine keeps
        gathered between uses. Nothing is kept gathered here outside a
        forward or backward, so there is nothing to release."""

    def compile(self, backend=None, compile_kwargs=None, schedule=None, compiled_autograd_enabled=False):
        """DeepSpeed's: torch.compile of the model's forward (the engine's
        hooks and collectives stay outside it)."""
        if schedule is not None or compiled_autograd_enabled:
            raise NotImplementedError("zero_cpp: engine.compile(schedule=...) and compiled_autograd_enabled (DeepSpeed's "
                                      "compile-time ZeRO passes) are not supported; compile(backend, compile_kwargs) is")
        kwargs = dict(compile_kwargs or {})
        if backend is not None:
            kwargs["backend"] = backend
        self.module.compile(**kwargs)

    @property
    def is_compiled(self):
        """Whether engine.compile() (torch.compile of the model) has run."""
        return bool(getattr(self.module, "_compiled_call_impl", None))

    def was_step_applied(self):
        return self._step_applied

    # ---- training ----
    def forward(self, *inputs, **kwargs):
        with self._memory_lines("forward"):
            return self._forward(*inputs, **kwargs)

    def _forward(self, *inputs, **kwargs):
        if self.fp16_auto_cast():
            inputs = _half(inputs)  # the ds_config's fp16.auto_cast: positional inputs only, as DeepSpeed's
        profiling = self._profiling_flops()
        if profiling:
            self.flops_profiler.start_profile()
        if self.module.training:
            self.tput_timer.start()
        self._start_timers(self.engine_timers.forward_timers)
        try:
            return self._forward_through_engine(lambda: self._module_under_autocast(*inputs, **kwargs))
        finally:
            self._stop_timers(self.engine_timers.forward_timers)
            if profiling:
                self.flops_profiler.stop_profile()

    @contextlib.contextmanager
    def _memory_lines(self, phase):
        """The ds_config's memory_breakdown: the memory in use before and
        after each forward, backward and step (rank 0), as DeepSpeed logs it."""
        see_memory_usage(f"Engine before {phase}", force=self.memory_breakdown())
        yield
        see_memory_usage(f"Engine after {phase}", force=self.memory_breakdown())

    def _module_under_autocast(self, *inputs, **kwargs):
        # The engine's own forward only, as DeepSpeed's: a direct call of the
        # module keeps the caller's autocast state.
        with autocast_if_enabled(self):
            return self.module(*inputs, **kwargs)

    def _start_timers(self, names):
        for name in names:
            self.timers(name).start()

    def _stop_timers(self, names):
        # In reverse: each step timer (started first) encloses its micro-step
        # timer, so a step's time is never below the micro-steps' it sums.
        for name in reversed(names):
            self.timers(name).stop()

    def param_name(self, param):
        """The name this engine's model registers `param` under (its first,
        for a tied one), or None for a tensor that is not one of its params."""
        held = self._param_names.get(id(param))
        return held[1] if held is not None and held[0] is param else None

    def get_wall_clock_timers(self):
        """DeepSpeed's: {timer name: milliseconds} as the last engine.step()
        left them (with wall_clock_breakdown; {} otherwise)."""
        return self.engine_timers_cache

    def _after_step_timers(self, boundary):
        """The step's backward split into its inner part and its reductions
        (the C++ engine's own split, known at the boundary; not measured per
        micro-step, so bwd_inner_microstep and bwd_allreduce_microstep read
        0), then the cache get_wall_clock_timers() returns."""
        ms = self._engine.last_step_times() if boundary else {}
        if ms and self.engine_timers.global_timers:
            self.timers(BACKWARD_INNER_GLOBAL_TIMER).add(ms["backward"] - ms["backward_allreduce"])
            self.timers(BACKWARD_REDUCE_GLOBAL_TIMER).add(ms["backward_allreduce"])
        if self.wall_clock_breakdown():
            self.engine_timers_cache = {name: self.timers(name).elapsed(reset=False)
                                        for name in self.engine_timers.active_timers()}

    def _reset_timers(self, boundary):
        """As DeepSpeed's timers.log after each step: the micro-step timers
        start over every step, the step ones at each boundary."""
        for name in self.engine_timers.micro_timers + (self.engine_timers.global_timers if boundary else []):
            self.timers(name).reset()

    def _profiling_flops(self):
        """Whether this forward is the one the flops profiler measures: rank
        0's at the config's profile_step, as DeepSpeed's."""
        return (self.flops_profiler is not None and self.global_rank == 0
                and self.global_steps == self._flops["profile_step"])

    def _forward_through_engine(self, call):
        """`call()` (the model's forward) inside the C++ engine's forward: the
        root's params gathered around it at stage 3, the units' order
        recorded, the outputs hooked for backward."""
        result = None
        scope = self._hooks.scope if self._hooks is not None else None

        def run():
            nonlocal result
            if scope is not None:
                scope.begin()
            self._in_forward += 1
            try:
                result = call()
            except BaseException:
                if scope is not None:
                    scope.end([])
                    self._hooks.abort()
                raise
            finally:
                self._in_forward -= 1
            outputs = tensors_in(result)
            if scope is not None:
                scope.end(outputs)  # units read from outside their forward: hooked on these outputs
            return outputs

        self._engine.forward(run)
        return result

    def scale(self, loss):
        """DeepSpeed's, for a backward the script runs itself
        (`engine.scale(loss).backward()`): the loss times the fp16 loss
        scale, the loss itself otherwise. With fp16 a plain loss.backward()
        must run from it; the grads arrive divided by the accumulation
        steps, as under engine.backward()."""
        assert self.optimizer is not None, "must provide optimizer during init in order to use scale"
        assert isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.grad_fn is not None, \
            "loss must be a scalar tensor with grad_fn. For non-scalar tensors, use tensor.backward(grad)"
        return self._engine.scale(loss)

    def backward(self, loss, retain_graph=False, scale_wrt_gas=True):
        """Backpropagates loss / gradient_accumulation_steps (times the fp16
        loss scale) and reduces grads as the stage requires; returns the
        scaled loss (detached)."""
        with self._memory_lines("backward"):
            return self._backward(loss, retain_graph, scale_wrt_gas)

    def _backward(self, loss, retain_graph=False, scale_wrt_gas=True):
        if retain_graph:
            raise NotImplementedError("zero_cpp: engine.backward(retain_graph=True) is not supported; run a new "
                                      "forward for each backward")
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError("zero_cpp: engine.backward expects a scalar loss tensor")
        self._start_timers(self.engine_timers.backward_timers)
        try:
            if not scale_wrt_gas:
                # The engine always divides by gradient_accumulation_steps.
                self._engine.backward(loss * self.gradient_accumulation_steps())
                return loss.detach()
            return self._engine.backward(loss)
        finally:
            self._stop_timers(self.engine_timers.backward_timers)

    def is_gradient_accumulation_boundary(self):
        return self._engine.is_gradient_accumulation_boundary()

    def set_gradient_accumulation_boundary(self, is_boundary):
        self._engine.set_gradient_accumulation_boundary(bool(is_boundary))

    def zero_grad(self):
        self._engine.zero_grad()

    def step(self, lr_kwargs=None):
        """At the accumulation boundary: the optimizer step (through
        `optimizer.step()`, so a torch LR scheduler sees it), then the LR
        scheduler's step unless the step was skipped (fp16 overflow).
        Elsewhere it counts the micro-step."""
        with self._memory_lines("step"):
            return self._step(lr_kwargs)

    def _step(self, lr_kwargs=None):
        self._step_applied = False
        if not self._engine.is_gradient_accumulation_boundary():
            self._start_timers(self.engine_timers.step_timers)
            try:
                self._engine.step()
            finally:
                self._stop_timers(self.engine_timers.step_timers)
            self._after_step_timers(boundary=False)
            self._reset_timers(boundary=False)
            self.tput_timer.stop(global_step=False, report_speed=False)
            return
        profiled = self._profiling_flops()
        self._start_timers(self.engine_timers.step_timers)
        try:
            self._optimizer_and_scheduler_step(lr_kwargs)
        finally:
            self._stop_timers(self.engine_timers.step_timers)
        self._after_step_timers(boundary=True)
        self.tput_timer.stop(global_step=True, report_speed=False)
        if comm.comms_logger.enabled:
            comm.comms_logger.collect_engine_records()  # verbose prints each as it is collected
        self._write_monitor_events()
        if profiled:
            f = self._flops
            self.flops_profiler.print_model_profile(profile_step=self.global_steps, module_depth=f["module_depth"],
                                                    top_modules=f["top_modules"], detailed=f["detailed"],
                                                    output_file=f["output_file"])
            self.flops_profiler.end_profile()
        self._reset_timers(boundary=True)

    def _optimizer_and_scheduler_step(self, lr_kwargs):
        self._push_group_settings()
        self.optimizer._stepping = True
        try:
            self._step_applied = bool(self.optimizer.step())
        finally:
            self.optimizer._stepping = False
        self.optimizer.overflow = not self._step_applied  # DeepSpeed's: this boundary's step was skipped
        # A torch LR scheduler checks its optimizer stepped before it does.
        self.optimizer.basic_optimizer._opt_called = True
        if self._step_applied and self.lr_scheduler is not None:
            try:
                self.lr_scheduler.step(**(lr_kwargs or {}))
            except TypeError:
                if lr_kwargs:
                    raise
                self.lr_scheduler.step()

    def _write_monitor_events(self):
        """The events DeepSpeed's engine writes at each boundary, at the
        samples trained so far: the lr the next step takes (the scheduler has
        stepped), the fp16 loss scale, and with wall_clock_breakdown each
        phase under DeepSpeed's name (backward_inner: the backward without
        the wait for its reductions)."""
        if not self.monitor.enabled:
            return
        samples = self.global_samples
        events = [("Train/Samples/lr", self.get_lr()[0], samples)]
        if self.fp16_enabled():
            events.append(("Train/Samples/loss_scale", self._engine.loss_scale, samples))
        ms = self._engine.last_step_times()
        if ms:
            phases = {"forward": ms["forward"], "backward": ms["backward"],
                      "backward_inner": ms["backward"] - ms["backward_allreduce"],
                      "backward_allreduce": ms["backward_allreduce"], "step": ms["step"]}
            events += [(f"Train/Samples/elapsed_time_ms_{phase}", t, samples) for phase, t in phases.items()]
        self.monitor.write_events(events)

    def _update(self):
        return self._engine.step()

    def _push_group_settings(self):
        """Each group's lr and weight decay as param_groups holds them now
        (a scheduler, a weight-decay schedule or the loop may have written
        them); the settings the fused update takes once (betas, eps,
        momentum) must not have moved."""
        groups = self.optimizer.param_groups
        moving = {"betas"} if getattr(self.lr_scheduler, "moves_betas", False) else set()  # the config's OneCycle
        for k, (g, fixed) in enumerate(zip(groups, self._fixed_settings)):
            for key, value in fixed.items():
                if key in moving:
                    continue
                if optimizers._differs(g.get(key, value), value):
                    raise RuntimeError(f"zero_cpp: param group {k}'s {key} changed to {g[key]!r} (from {value!r}); "
                                       f"the fused update takes it once for all groups and steps -- a scheduler that "
                                       f"moves it (torch's OneCycleLR/CyclicLR with cycle_momentum) needs "
                                       f"cycle_momentum=False, or the ds_config's OneCycle scheduler, which moves "
                                       f"Adam's beta1 itself")
        self._engine.set_param_group_lrs([groups[0]["lr"]] + [g["lr"] for g in groups])
        self._engine.set_param_group_weight_decays([groups[0].get("weight_decay", 0.0)] +
                                                   [g.get("weight_decay", 0.0) for g in groups])

    @contextlib.contextmanager
    def no_sync(self):
        """Backward accumulates grads with no communication (stages 0 and 1)."""
        try:
            self._engine.begin_no_sync()
        except RuntimeError as e:
            raise _AssertedRuntimeError(str(e)) from None
        try:
            yield
        finally:
            self._engine.end_no_sync()

    @contextlib.contextmanager
    def coalesce_grad_reduction(self):
        """Several backward calls per step, reduced once when the block ends
        (stages 1-3): one reduce-scatter per group instead of one per
        backward."""
        self._engine.begin_coalesce()
        ok = False
        try:
            yield
            ok = True
        finally:
            self._engine.end_coalesce(ok)

    def train(self, mode=True):
        self.training = mode
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def deepspeed_io(self, dataset, batch_size=None, route="train", pin_memory=True, data_sampler=None,
                     collate_fn=None, num_local_io_workers=None):
        """DeepSpeed's: a loader of this rank's micro-batches of `dataset` (a
        torch Dataset, or anything with __getitem__ and __len__: a Hugging
        Face dataset); shuffled for training, in order for route "eval" or
        "predict"."""
        if not isinstance(dataset, torch.utils.data.Dataset) and not (
                hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise ValueError("Training data must be a torch Dataset (or a map-style dataset: __getitem__ and __len__)")
        if data_sampler is not None:
            raise NotImplementedError("zero_cpp: deepspeed_io(data_sampler=...) is not supported; iterate a "
                                      "torch DataLoader of your own")
        return ZeroDataLoader(dataset, batch_size or self.train_micro_batch_size_per_gpu(), self.global_rank,
                              self.world_size, collate_fn=collate_fn or self.collate_fn,
                              drop_last=bool(self._config.get("dataloader_drop_last", False)),
                              pin_memory=pin_memory and self.device.type == "cuda",
                              shuffle=route not in ("eval", "predict"), num_workers=num_local_io_workers or 0)

    # ---- what the engine holds ----
    def state_bytes(self):
        """Bytes of model state this rank holds: params, grads, master, optimizer."""
        return self._engine.state_bytes()

    def describe(self):
        return self._engine.describe()

    def hook_times(self):
        """With ZERO_CPP_HOOK_TIMES=1: {"calls", "total_s", "engine_s"} of the
        stage-3 module hooks so far (engine_s: inside the C++ engine; the rest
        is the front end's Python); None otherwise."""
        t = self._hooks.times if self._hooks is not None else None
        return None if t is None else {"calls": t.calls, "total_s": t.total_s, "engine_s": t.engine_s}

    def comm_counts(self):
        """Collectives this rank's engine has issued: {op: {"calls", "bytes", ...}}."""
        return self._engine.comm_counts_of_group()

    def consolidated_fp32_state_dict(self, rank0_only=False):
        """The whole model by name, fp32 trainable params and the frozen
        params and buffers as they are (every rank calls it; zero_to_fp32's
        job without a checkpoint)."""
        return _in_module_order(self.module, _drop_external(self._engine.state_dict(rank0_only)))

    def save_fp32_model(self, path):
        """consolidated_fp32_state_dict() as one safetensors file (rank 0
        writes; every rank calls)."""
        self._engine.save_weights(os.fspath(path))

    def module_state_dict(self, destination=None, prefix="", keep_vars=False, exclude_frozen_parameters=False):
        """DeepSpeed's: the module's state_dict (at stage 3, outside
        GatheredParameters, a released param's value is empty, as
        DeepSpeed's), without the frozen params when asked."""
        sd = self.module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)
        if exclude_frozen_parameters:
            for name, p in self.module.named_parameters():
                if not p.requires_grad:
                    sd.pop(prefix + name, None)
        return sd

    def load_module_state_dict(self, checkpoint, strict=True, custom_load_fn=None, fetch_z3_params=False,
                               z3_params_to_fetch=None, allowed_missing_keys=None):
        """DeepSpeed's: checkpoint["module"] loaded into the module -- at stage
        3 into the params `fetch_z3_params` (all) or `z3_params_to_fetch`
        gathers, rank 0's values written back --; `allowed_missing_keys` may
        be missing from a strict load, nothing else."""
        from .zero import GatheredParameters
        if z3_params_to_fetch is not None:
            fetch = list(z3_params_to_fetch)
        else:
            fetch = list(self.module.parameters()) if fetch_z3_params else []
        with GatheredParameters(fetch if self._stage == 3 else [], modifier_rank=0):
            sd = checkpoint["module"]
            if custom_load_fn is not None:
                custom_load_fn(src=sd, dst=self.module)
                return
            result = self.module.load_state_dict(sd, strict=strict and allowed_missing_keys is None)
            if strict and allowed_missing_keys is not None:
                missing = set(result.missing_keys) - set(allowed_missing_keys)
                if missing or result.unexpected_keys:
                    raise RuntimeError(f"load_module_state_dict: the checkpoint's module does not match the model: "
                                       f"missing={sorted(missing)}, unexpected={sorted(result.unexpected_keys)}")

    def save_fp16_model(self, save_dir, save_filename="pytorch_model.bin"):
        """DeepSpeed's older name of save_16bit_model."""
        return self.save_16bit_model(save_dir, save_filename)

    def save_16bit_model(self, save_dir, save_filename="pytorch_model.bin", exclude_frozen_parameters=False):
        """DeepSpeed's: the whole model in its training dtype, torch.save'd by
        rank 0 (every rank calls it). Unlike DeepSpeed's, at stage 3 it saves
        whether or not stage3_gather_16bit_weights_on_model_save is set."""
        sd = self._training_dtype_state_dict(exclude_frozen_parameters)
        if sd is not None:
            os.makedirs(save_dir, exist_ok=True)
            torch.save(sd, os.path.join(save_dir, save_filename))
        return True

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters=False):
        """DeepSpeed's (what Hugging Face's Trainer and accelerate save at
        stage 3): the whole model in its training dtype on rank 0, None on
        the other ranks; every rank calls it."""
        if self._stage != 3:
            raise ValueError("this function requires ZeRO-3 mode")
        return self._training_dtype_state_dict(exclude_frozen_parameters)

    def zero_gather_16bit_weights_on_model_save(self):
        zero = self._config.get("zero_optimization", {})
        return bool(next((zero[k] for k in ("stage3_gather_16bit_weights_on_model_save",
                                             "stage3_gather_fp16_weights_on_model_save",
                                             "gather_16bit_weights_on_model_save") if k in zero), False))

    def _training_dtype_state_dict(self, exclude_frozen_parameters):
        """consolidated_fp32_state_dict() on rank 0 with the trainable and
        frozen params in the training dtype (None elsewhere). Buffers keep
        the dtype they train in, as DeepSpeed's (it casts params only)."""
        sd = self.consolidated_fp32_state_dict(rank0_only=True)
        if self.global_rank != 0:
            return None
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self._precision)
        named = list(self.module.named_parameters(remove_duplicate=False))  # tied params under each name
        params = {n for n, _ in named}
        frozen = {n for n, p in named if not p.requires_grad}
        return collections.OrderedDict(
            (n, t.to(dtype) if dtype is not None and n in params and t.is_floating_point() else t)
            for n, t in sd.items() if not (exclude_frozen_parameters and n in frozen))

    # ---- checkpoints ----
    def save_checkpoint(self, save_dir, tag=None, client_state={}, save_latest=True, exclude_frozen_parameters=False):
        """Every rank's shards and rank 0's manifest into save_dir/tag (tag:
        global_step{N} by default), published atomically; `client_state`
        (anything picklable) comes back from load_checkpoint.
        exclude_frozen_parameters leaves the frozen params out (an adapter's
        checkpoint without its frozen base), as DeepSpeed's: load it with
        load_module_strict=False."""
        tag = self._agreed_tag(str(tag) if tag is not None else f"global_step{self.global_steps}")
        previous = _read_latest(save_dir) if not save_latest else None
        self._engine.save_checkpoint(os.fspath(save_dir), tag, _pack_client_state(client_state, {
            "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups],
            "aliases": self._aliases}), exclude_frozen_parameters)
        if not save_latest and self.global_rank == 0:
            _write_latest(save_dir, previous)
        if self.global_rank == 0:
            _write_zero_to_fp32_script(save_dir)
        return True

    def _agreed_tag(self, tag):
        """The tag every rank saves under: rank 0's. DeepSpeed's tutorial names
        a checkpoint by the rank's own loss (`ckpt_id = loss.item()`), which
        differs by rank; as DeepSpeed, the config's checkpoint.tag_validation
        says what then happens: "Warn" (the default) warns, "Fail" raises on
        every rank, "Ignore" does neither -- and the ranks save one checkpoint
        under rank 0's tag (DeepSpeed's would each write their own)."""
        if self.world_size == 1:
            return tag
        # First through the engine's collectives, which name a save that
        # only some ranks make (rank 0 alone, as DeepSpeed's docs warn
        # against) within seconds; the tags themselves only where they differ.
        mine = int.from_bytes(hashlib.sha256(tag.encode()).digest()[:8], "little", signed=True)
        if len(set(self._engine.all_gather_ints([mine], "save_checkpoint (its tag)"))) == 1:
            return tag
        tags = [None] * self.world_size
        torch.distributed.all_gather_object(tags, tag)
        said = (f"zero_cpp: save_checkpoint's tag differs between ranks ({', '.join(repr(t) for t in tags[:4])}"
                f"{', ...' if len(tags) > 4 else ''})")
        if self.checkpoint_tag_validation_fail():
            raise ValueError(said + "; checkpoint.tag_validation is Fail")
        if self.checkpoint_tag_validation_enabled():
            warnings.warn(said + f"; every rank saves under rank 0's, {tags[0]!r}")
        return tags[0]

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False, custom_load_fn=None):
        """Loads load_dir/tag (tag None: the one `latest` names), whatever
        world size and stage saved it, and returns (path, client_state);
        (None, None) when load_dir holds no checkpoint, as DeepSpeed. As
        DeepSpeed's: load_optimizer_states=False restores the weights, the
        step counters and (load_lr_scheduler_states) the LR scheduler, not
        the optimizer's state; load_module_only=True the weights alone;
        load_module_strict=False keeps the model's frozen params where the
        checkpoint has none (saved with exclude_frozen_parameters)."""
        if custom_load_fn is not None:
            raise NotImplementedError("zero_cpp: load_checkpoint(custom_load_fn=...) is not supported")
        load_dir = os.fspath(load_dir)
        if tag is None and not os.path.isfile(os.path.join(load_dir, "latest")):
            warnings.warn(f"zero_cpp: no checkpoint in {load_dir} (no 'latest' file); nothing loaded")
            return None, None
        from .deepspeed_checkpoint import is_deepspeed_checkpoint  # here: that package imports this module
        shown = None  # the path returned, where the one loaded is a conversion of it
        # Rank 0's reading decides for all (a rank seeing another directory
        # must not take the other branch); through the engine's collectives,
        # which name a load that only some ranks make within seconds.
        deepspeeds = int(self.global_rank == 0 and is_deepspeed_checkpoint(load_dir, tag))
        if self.world_size > 1:
            deepspeeds = self._engine.all_gather_ints([deepspeeds], "load_checkpoint (which format)")[0]
        if deepspeeds:
            tag = str(tag) if tag is not None else _read_latest(load_dir).strip()
            shown = os.path.join(load_dir, tag)
            load_dir = self._convert_deepspeed_checkpoint(load_dir, tag)
        tag = "" if tag is None else str(tag)
        optimizer_state = load_optimizer_states and not load_module_only
        self._samples_before, self._steps_before = 0, 0  # the loaded run's steps, at today's batch size
        client, own = _unpack_client_state(self._engine.load_checkpoint(
            load_dir, tag, optimizer_state, not load_module_only, bool(load_module_strict)))
        if own is not None and not load_module_only:  # saved from Python (the C++ API stores its client state alone)
            if optimizer_state:
                for g, saved in zip(self.optimizer.param_groups, own["param_groups"]):
                    g.update(saved)
            if load_lr_scheduler_states and self.lr_scheduler is not None and own["lr_scheduler"] is not None:
                self.lr_scheduler.load_state_dict(own["lr_scheduler"])
                if optimizer_state and hasattr(self.lr_scheduler, "restore_lrs"):
                    # The groups' lrs are the optimizer's state: DeepSpeed's load
                    # restores the ones the schedule wrote before the save (a
                    # converted DeepSpeed checkpoint may not carry them).
                    self.lr_scheduler.restore_lrs()
        return shown or os.path.join(load_dir, tag or _C.resolve_tag(load_dir, "")), client

    def _convert_deepspeed_checkpoint(self, load_dir, tag):
        """DeepSpeed's load_dir/tag, converted by rank 0 into
        load_dir/zero_cpp_converted/tag (every rank sees it, as it sees
        load_dir), given this model and its param groups (a stage-0
        checkpoint numbers its optimizer state by their positions) -- or
        that conversion reused, while the checkpoint's files, the model's
        params and the groups are those it was made from; every rank learns
        of a failure, so none waits on a conversion that died."""
        from .deepspeed_checkpoint import convert_deepspeed_checkpoint
        out = os.path.join(load_dir, "zero_cpp_converted")
        failure = None
        if self.global_rank == 0:
            try:
                # What the conversion was made from: reused while it is the same.
                stamp_path = os.path.join(out, f"{tag}.source.json")
                stamp = self._conversion_source(os.path.join(load_dir, tag))
                if not (_read_text(stamp_path) == stamp and os.path.isfile(os.path.join(out, tag, "manifest.json"))):
                    convert_deepspeed_checkpoint(load_dir, tag, out, tag, model=self.module,
                                                 param_groups=self.optimizer.param_groups)
                    _write_text_atomically(stamp_path, stamp)
            except PermissionError as e:
                failure = PermissionError(f"{e}: the conversion of DeepSpeed's checkpoint goes beside it, into "
                                          f"{out}; where that is not writable, convert it once with `python -m "
                                          f"zero_cpp.deepspeed_checkpoint {load_dir} OUT` and load OUT")
            except Exception as e:  # noqa: BLE001 -- raised below, once every rank knows
                failure = e
        said = [None if failure is None else f"{type(failure).__name__}: {failure}"]
        torch.distributed.broadcast_object_list(said, src=0)
        if failure is not None:
            raise failure
        if said[0] is not None:
            raise RuntimeError(f"zero_cpp: converting DeepSpeed's checkpoint {os.path.join(load_dir, tag)} failed "
                               f"on rank 0: {said[0]}")
        return out

    def _conversion_source(self, ds_tag_dir):
        """What a conversion of ds_tag_dir for this engine depends on: the
        checkpoint's files (name, size, modification time), the model's
        params (names, shapes) and its optimizer's param groups."""
        files = sorted((f, st.st_size, st.st_mtime_ns) for f in os.listdir(ds_tag_dir)
                       for st in [os.stat(os.path.join(ds_tag_dir, f))])
        params = [(n, list(getattr(p, "ds_shape", p.shape))) for n, p in self.module.named_parameters()]
        groups = [[self.param_name(p) for p in g["params"]] for g in self.optimizer.param_groups]
        return json.dumps({"files": files, "params": params, "groups": groups})

    def destroy(self):
        if self._hooks is not None:
            self._hooks.remove()
            self._hooks = None


def _warn_of_fp32_norm_statistics(model, config, precision, device):
    """Under bf16/fp16 buffers keep their dtype (DeepSpeed 0.19.8's way), so a
    BatchNorm's fp32 running statistics meet its 16-bit weight, which torch's
    CPU batch_norm refuses at the first forward with a bare dtype error (as
    under DeepSpeed): said here, with the key that casts them."""
    if precision == "fp32" or device.type != "cpu" or "buffer_dtype" in (config.get("data_types") or {}):
        return
    if not config.get("zero_cpp", {}).get("keep_buffer_dtype", False):
        return
    norms = [name for name, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._NormBase)
             and m.affine and m.running_mean is not None and m.running_mean.dtype == torch.float32]
    if norms:
        warnings.warn(f"zero_cpp: {len(norms)} BatchNorm module(s) ({', '.join(norms[:3])}) keep fp32 running "
                      f"statistics under {precision}, as DeepSpeed 0.19.8 leaves buffers; torch's CPU batch_norm "
                      f"refuses them beside {precision} weights: set \"data_types\": {{\"buffer_dtype\": "
                      f"\"{precision}\"}} to cast them")


def _half(value):
    """`value` with every floating-point tensor in it (inside lists, tuples
    and dicts) cast to fp16."""
    if isinstance(value, (list, tuple)):
        return value.__class__([_half(v) for v in value])
    if isinstance(value, dict):
        return {k: _half(v) for k, v in value.items()}
    return value.half() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _widen_16bit_params(model):
    """A model loaded in bf16/fp16 (a checkpoint's torch_dtype): its trainable
    params widened to fp32 in place -- exactly, so the fp32 master starts
    from the same values; the engine then keeps them in the config's
    precision, as DeepSpeed builds its fp32 master from a 16-bit model."""
    widened = 0
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16):
                p.data = p.data.float()
                widened += 1
    if widened and distributed.world().rank == 0:
        warnings.warn(f"zero_cpp: {widened} trainable params were 16-bit; their fp32 master starts from their "
                      f"values (the config's bf16/fp16 block decides what the model computes in)")


class _EngineMethod:
    """Stands in, as an instance attribute, for one of the model's methods
    while an engine trains it: `body(engine, method, *args)` runs in its
    place, `method` being what the model had (its class's, or a wrapper a
    library set on the instance before, which is kept). A copy of the model
    (copy.deepcopy, pickle: a reference model copied from the one trained)
    gets that method back, its own, so a copy never reaches this engine;
    the model gets it back once the engine is gone."""

    def __init__(self, model, name, engine, body):
        self._model = weakref.ref(model)
        self._name = name
        self._own = name in model.__dict__  # an instance-level wrapper was there first
        self._method = getattr(model, name)
        functools.update_wrapper(self, self._method)  # the signature inspect and Hugging Face read
        self._engine = weakref.ref(engine)
        self._body = body

    def __call__(self, *args, **kwargs):
        engine = self._engine()
        return self._method(*args, **kwargs) if engine is None else self._body(engine, self._method, *args, **kwargs)

    def __deepcopy__(self, memo):
        if self._own:
            return copy.deepcopy(self._method, memo)
        return _class_method(memo.get(id(self._model()), self._model()), self._name)

    def __reduce__(self):
        return (_identity, (self._method,)) if self._own else (_class_method, (self._model(), self._name))


def _identity(x):
    return x


def _class_method(model, name):
    return getattr(type(model), name).__get__(model)


def _clear_engine_grads_with_module(model, engine):
    """`model.zero_grad()` clears the grads the engine holds too. The grads
    live in the engine's flat buffers, not in `param.grad`, and a loop that
    clears them through the module (DeepSpeedExamples' GAN: netD.zero_grad(),
    after G's backward ran through D) would otherwise carry them into the
    next step -- unlike DDP and DeepSpeed's stage 0, which keep param.grad."""
    def zero_grad(live, module_zero_grad, *args, **kwargs):
        module_zero_grad(*args, **kwargs)
        live._engine.zero_grad()

    model.zero_grad = _EngineMethod(model, "zero_grad", engine, zero_grad)


class _AssertedRuntimeError(AssertionError, RuntimeError):
    """The C++ engine's refusal where DeepSpeed's check is an `assert`
    (no_sync at stages 2-3, nested): a script catching either catches it."""


def _route_direct_calls_through_engine(model, engine):
    """Stage 3: `engine.module(x)` called directly -- generation and
    evaluation helpers do, Hugging Face's generate among them -- runs inside
    the engine's forward as `engine(x)` does, so the root's own params and
    tied weights, which only the engine's forward gathers, are whole there
    (DeepSpeed hooks the root module itself)."""
    def forward(live, module_forward, *args, **kwargs):
        if live._in_forward:  # the engine's own call of the model
            return module_forward(*args, **kwargs)
        return live._forward_through_engine(lambda: module_forward(*args, **kwargs))

    model.forward = _EngineMethod(model, "forward", engine, forward)


def _aliases(model):
    """Names of params registered more than once (tied weights): alias ->
    the name the engine keeps, for readers of checkpoints."""
    first, aliases = {}, {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def _drop_external(sd):
    return {n: t for n, t in sd.items() if EXTERNAL_PREFIX not in n}


def _in_module_order(model, sd):
    """`sd` in the order model.state_dict() gives its names (each module's
    params, its persistent buffers, then its children's), as DeepSpeed's
    saves are ordered; found from the names alone, no tensor read (a
    stage-3 param is released here)."""
    order = {}

    def visit(module, prefix):
        for name, p in dict.items(module._parameters):
            if p is not None:
                order.setdefault(prefix + name, len(order))
        for name, b in module._buffers.items():
            if b is not None and name not in module._non_persistent_buffers_set:
                order.setdefault(prefix + name, len(order))
        for name, child in module._modules.items():
            if child is not None:
                visit(child, prefix + name + ".")

    visit(model, "")
    return dict(sorted(sd.items(), key=lambda item: order.get(item[0], len(order))))


_OWN_KEY = "zero_cpp_python"  # the Python engine's own state in a checkpoint's client state


def _pack_client_state(client_state, own):
    """The checkpoint's client state, as JSON: the user's client_state itself
    where it is a JSON object (so the C++ API and zero-ckpt read it), beside
    the Python engine's own state (scheduler, param groups' settings, tied
    names) pickled under one key; a client_state JSON cannot hold (tensors,
    objects) is pickled with it."""
    import json
    try:
        plain = json.loads(json.dumps(client_state)) if isinstance(client_state, dict) else None
    except (TypeError, ValueError):
        plain = None
    if plain is None or plain != client_state or _OWN_KEY in plain:
        plain, own = {}, dict(own, client_state=client_state)
    plain[_OWN_KEY] = base64.b64encode(pickle.dumps(own)).decode("ascii")
    return json.dumps(plain)


def _unpack_client_state(text):
    """(client_state, the Python engine's own state or None) from a checkpoint's client state."""
    import json
    client = json.loads(text)
    packed = client.pop(_OWN_KEY, None) if isinstance(client, dict) else None
    if packed is None:
        return client, None
    own = pickle.loads(base64.b64decode(packed))
    return own.pop("client_state", client), own


def _read_latest(save_dir):
    try:
        with open(os.path.join(save_dir, "latest")) as f:
            return f.read()
    except OSError:
        return None


_ZERO_TO_FP32_SCRIPT = '''#!/usr/bin/env python
"""Written by zero_cpp's save_checkpoint beside its checkpoints, as DeepSpeed
writes its own: their fp32 weights, consolidated into one state dict.

    python zero_to_fp32.py . OUTPUT_DIR [-t TAG] [--safe_serialization]
"""
from zero_cpp.utils.zero_to_fp32 import main

if __name__ == "__main__":
    main()
'''


def _write_zero_to_fp32_script(save_dir):
    """DeepSpeed's docs tell users to run the zero_to_fp32.py its saves leave
    in the checkpoint directory: this one runs zero_cpp's (published whole,
    by a rename)."""
    path = os.path.join(save_dir, "zero_to_fp32.py")
    with contextlib.suppress(OSError):
        with open(path) as f:
            if f.read() == _ZERO_TO_FP32_SCRIPT:
                return
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(_ZERO_TO_FP32_SCRIPT)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)


def _write_latest(save_dir, previous):
    path = os.path.join(save_dir, "latest")
    if previous is None:
        with contextlib.suppress(OSError):
            os.remove(path)
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(previous)
    os.replace(tmp, path)


def _attach_local_parts(model, cxx_engine):
    """DeepSpeed's `param.ds_tensor` at stage 3: this rank's part of the
    param as it rests between uses, a view of the engine's shard (a frozen
    param, which every rank holds whole here, is its own part). Where the
    shards are paged to NVMe it is a tensor on the meta device of that
    part's size: shape and dtype, no values."""
    for name, p in model.named_parameters():
        if not p.requires_grad:
            p.ds_tensor = p.data.reshape(-1)
            continue
        part = cxx_engine.local_param(name)
        p.ds_tensor = part if part is not None else torch.empty(cxx_engine.local_range(name)[1], dtype=p.dtype,
                                                                device="meta")


def _read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _write_text_atomically(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def engine_of(param):
    """The live engine whose model holds `param`, or None."""
    for ref in list(_ENGINES):
        e = ref()
        if e is None:
            _ENGINES.remove(ref)
            continue
        if e.param_name(param) is not None:
            return e
    return None


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None, lr_scheduler=None,
               distributed_port=29500, mpu=None, dist_init_required=None, collate_fn=None, config=None,
               mesh_param=None, config_params=None):
    """DeepSpeed's `initialize`: returns (engine, optimizer,
    training_dataloader, lr_scheduler). `config` is a dict or a path
    (or `args.deepspeed_config`); `optimizer` an optimizer object or a
    callable taking the param groups; `lr_scheduler` a scheduler object or a
    callable taking the optimizer. Model, tensor and pipeline parallelism
    (`mpu`, `mesh_param`) are not zero_cpp's: an error names them."""
    if mpu is not None:
        raise NotImplementedError("zero_cpp.initialize: mpu (model parallelism) is not supported; zero_cpp is "
                                  "data parallel (ZeRO) only")
    if mesh_param is not None:
        raise NotImplementedError("zero_cpp.initialize: mesh_param (sequence/data parallel meshes) is not supported")
    if deepspeed_alias.deepspeed_itself_imported():
        warnings.warn("zero_cpp.initialize: DeepSpeed's own package is imported in this process, so what a script "
                      "imports from `deepspeed.*` (an optimizer class, safe_get_full_fp32_param, zero_to_fp32) is "
                      "DeepSpeed's, which zero_cpp's engine does not know: import it from `zero_cpp.*` "
                      "(docs/from-deepspeed.md)", stacklevel=2)
    from . import zero
    with zero.paused():
        engine = ZeroEngine(args=args, model=model, optimizer=optimizer, model_parameters=model_parameters,
                            training_data=training_data, lr_scheduler=lr_scheduler, collate_fn=collate_fn,
                            config=config, dist_init_required=dist_init_required, config_params=config_params)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler
