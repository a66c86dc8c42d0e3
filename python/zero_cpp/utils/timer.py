"""DeepSpeed's `deepspeed.utils.timer`: named wall-clock timers
(SynchronizedWallClockTimer, the engine's `timers`), a stand-in that times
nothing (NoopTimer), and the samples/sec meter the engine keeps as
`tput_timer` (ThroughputTimer).

Times are host wall-clock intervals. Where CUDA is in use, the GPU is
synchronized at both ends so an interval covers the kernels queued in it;
on the CPU there is nothing to wait for.
"""
import math
import statistics
import time

import torch
import torch.distributed as dist

from ..accelerator import get_accelerator
from .logging import logger

# The names DeepSpeed's engine gives its phase timers (wall_clock_breakdown):
# each micro-step's, and each step's (the micro-steps up to its boundary).
FORWARD_MICRO_TIMER = "fwd_microstep"
FORWARD_GLOBAL_TIMER = "fwd"
BACKWARD_MICRO_TIMER = "bwd_microstep"
BACKWARD_GLOBAL_TIMER = "bwd"
BACKWARD_INNER_MICRO_TIMER = "bwd_inner_microstep"
BACKWARD_INNER_GLOBAL_TIMER = "bwd_inner"
BACKWARD_REDUCE_MICRO_TIMER = "bwd_allreduce_microstep"
BACKWARD_REDUCE_GLOBAL_TIMER = "bwd_allreduce"
STEP_MICRO_TIMER = "step_microstep"
STEP_GLOBAL_TIMER = "step"
TIME_EPSILON = 1e-6  # seconds: keeps a rate over a zero-length interval finite

_GiB = 2**30


def _synchronize():
    # Only where CUDA was initialized: nothing can be queued otherwise, and
    # initializing it here would cost seconds (and a context) on a CPU run.
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _print_on(ranks, message):
    """Print `message` prefixed by this rank on the ranks listed (all when
    the list starts with -1; every process before torch.distributed is up)."""
    if not dist.is_initialized():
        print(f"[Rank -1] {message}", flush=True)
        return
    rank = dist.get_rank()
    if ranks and (ranks[0] == -1 or rank in ranks):
        print(f"[Rank {rank}] {message}", flush=True)


def trim_mean(data, trim_percent):
    """The mean of `data` without its lowest and highest `trim_percent`
    (0 to 1) each; at least the middle value(s) are kept. 0 for no data."""
    if not 0.0 <= trim_percent <= 1.0:
        raise ValueError(f"trim_mean: trim_percent {trim_percent} is not in [0, 1]")
    if not data:
        return 0
    n = len(data)
    k = min(int(round(n * trim_percent)), (n - 1) // 2)
    return statistics.fmean(sorted(data)[k:n - k])


class SynchronizedWallClockTimer:
    """Timers by name, made on first use: `timers("fwd").start()`, then
    `.stop()`, and `.elapsed()` in milliseconds."""

    class Timer:
        """Sums the intervals between its start() and stop() calls."""

        def __init__(self, name):
            self.name_ = name
            self.started_ = False
            self._started_at = 0.0
            self._intervals_ms = []

        def start(self):
            if self.started_:
                raise RuntimeError(f"timer {self.name_!r} has already been started")
            _synchronize()
            self._started_at = time.perf_counter()
            self.started_ = True

        def stop(self, reset=False, record=False):
            """End the running interval. `reset` and `record` are accepted as
            DeepSpeed's are, and like DeepSpeed's change nothing."""
            if not self.started_:
                raise RuntimeError(f"timer {self.name_!r} is not started")
            _synchronize()
            self._intervals_ms.append((time.perf_counter() - self._started_at) * 1e3)
            self.started_ = False

        def add(self, ms):
            """An interval measured elsewhere (the C++ engine's), in milliseconds."""
            self._intervals_ms.append(float(ms))

        def reset(self):
            """Forget the intervals timed, and stop timing."""
            self.started_ = False
            self._intervals_ms.clear()

        def elapsed(self, reset=True):
            """Milliseconds timed so far, a running interval's included (it
            goes on running); with `reset`, the timer starts over."""
            running = self.started_
            if running:
                self.stop()
            total = sum(self._intervals_ms)
            if reset:
                self.reset()
            if running:
                self.start()
            return total

        def mean(self):
            """Milliseconds per interval: the mean with the 10% shortest and
            10% longest left out."""
            self.elapsed(reset=False)  # a running interval counts up to now
            return trim_mean(self._intervals_ms, 0.1)

    def __init__(self):
        self.timers = {}

    def __call__(self, name):
        if name not in self.timers:
            self.timers[name] = self.Timer(name)
        return self.timers[name]

    def get_timers(self):
        return self.timers

    @staticmethod
    def memory_usage():
        """The accelerator's memory counters, as log() appends them."""
        acc = get_accelerator()
        counters = (("mem_allocated", acc.memory_allocated()), ("max_mem_allocated", acc.max_memory_allocated()),
                    ("cache_allocated", acc.memory_cached()), ("max_cache_allocated", acc.max_memory_cached()))
        return "".join(f" | {name}: {value / _GiB:.4f} GB" for name, value in counters)

    def log(self, names, normalizer=1.0, reset=True, memory_breakdown=False, ranks=None):
        """Print the named timers' elapsed milliseconds, each divided by
        `normalizer` (e.g. the steps they span), on `ranks` (rank 0 unless
        given); names never timed are left out."""
        if normalizer <= 0.0:
            raise ValueError(f"timers.log: normalizer must be positive, not {normalizer}")
        line = "time (ms)" + "".join(f" | {name}: {self.timers[name].elapsed(reset=reset) / normalizer:.2f}"
                                     for name in names if name in self.timers)
        if memory_breakdown:
            line += self.memory_usage()
        _print_on(ranks or [0], line)

    def get_mean(self, names, normalizer=1.0, reset=True):
        """{name: trimmed mean interval / normalizer} for the named timers
        that exist, in microseconds (DeepSpeed's scale for it). `reset` is
        accepted as DeepSpeed's is; like DeepSpeed's, the timers are kept."""
        if normalizer <= 0.0:
            raise ValueError(f"timers.get_mean: normalizer must be positive, not {normalizer}")
        return {name: self.timers[name].mean() * 1e3 / normalizer for name in names if name in self.timers}


class EngineTimers:
    """Which phase timers an engine runs, as DeepSpeed's: the micro-step
    ones with wall_clock_breakdown, the step ones also for the flops
    profiler (its latency lines)."""

    def __init__(self, enable_micro_timers, enable_global_timers):
        def pick(micro, whole):
            # The step's timer first: started first and stopped last, it
            # encloses the micro-step's (the engine stops them in reverse).
            return ([whole] if enable_global_timers else []) + ([micro] if enable_micro_timers else [])

        self.forward_timers = pick(FORWARD_MICRO_TIMER, FORWARD_GLOBAL_TIMER)
        self.backward_timers = pick(BACKWARD_MICRO_TIMER, BACKWARD_GLOBAL_TIMER)
        self.backward_inner_timers = pick(BACKWARD_INNER_MICRO_TIMER, BACKWARD_INNER_GLOBAL_TIMER)
        self.backward_reduce_timers = pick(BACKWARD_REDUCE_MICRO_TIMER, BACKWARD_REDUCE_GLOBAL_TIMER)
        self.step_timers = pick(STEP_MICRO_TIMER, STEP_GLOBAL_TIMER)
        self.micro_timers = [FORWARD_MICRO_TIMER, BACKWARD_MICRO_TIMER, BACKWARD_INNER_MICRO_TIMER,
                             BACKWARD_REDUCE_MICRO_TIMER, STEP_MICRO_TIMER] if enable_micro_timers else []
        self.global_timers = [FORWARD_GLOBAL_TIMER, BACKWARD_GLOBAL_TIMER, BACKWARD_INNER_GLOBAL_TIMER,
                              BACKWARD_REDUCE_GLOBAL_TIMER, STEP_GLOBAL_TIMER] if enable_global_timers else []

    def active_timers(self):
        return self.micro_timers + self.global_timers


class NoopTimer:
    """SynchronizedWallClockTimer's interface, timing nothing: what the
    engine uses when wall_clock_breakdown is off."""

    class Timer:

        def start(self):
            pass

        def stop(self, **kwargs):
            pass

        def reset(self):
            pass

        def elapsed(self, **kwargs):
            return 0

        def mean(self):
            return 0

    def __init__(self):
        self.timer = self.Timer()

    def __call__(self, name):
        return self.timer

    def get_timers(self):
        return {}

    def log(self, names, normalizer=1.0, reset=True, memory_breakdown=False, ranks=None):
        pass

    def get_mean(self, names, normalizer=1.0, reset=True):
        pass


def _setting(config, name):
    # DeepSpeed's config object (timers.throughput), a dict of the same, or
    # None: enabled and synchronized, as DeepSpeed's defaults are.
    if config is None:
        return True
    if isinstance(config, dict):
        return bool(config.get(name, True))
    return bool(getattr(config, name))


class ThroughputTimer:
    """Training samples per second, timed from each start() to its stop()
    (a micro step); stop(global_step=True) ends an optimizer step. The first
    `start_step` optimizer steps (warm-up) are counted but not timed. Every
    `steps_per_output` steps, with report_speed, the rates are logged
    through `logging_fn` (the package's logger unless given)."""

    def __init__(self, config, batch_size, start_step=2, steps_per_output=None, monitor_memory=False,
                 logging_fn=None):
        self.config = config  # read at each call, as DeepSpeed's is
        self.batch_size = 1 if batch_size is None else batch_size
        self.start_step = start_step
        self.steps_per_output = steps_per_output
        self.monitor_memory = monitor_memory
        self.logging = logger.info if logging_fn is None else logging_fn
        if monitor_memory:
            import psutil  # noqa: F401 (DeepSpeed's requirement for it, checked up front)
        self.initialized = False
        self.started = False
        self.start_time = 0.0
        self.end_time = 0.0
        self.epoch_count = 0
        self.micro_step_count = 0
        self.global_step_count = 0
        self.total_elapsed_time = 0.0  # seconds timed, warm-up steps excluded
        self.step_elapsed_time = 0.0  # seconds timed in the current optimizer step
        self._timing = False  # whether the running micro step is timed

    def update_epoch_count(self):
        self.epoch_count += 1
        self.micro_step_count = 0

    def start(self):
        if not _setting(self.config, "enabled"):
            return
        self.initialized = True
        self.started = True
        self._timing = self.global_step_count >= self.start_step
        if self._timing:
            if _setting(self.config, "synchronized"):
                _synchronize()
            self.start_time = time.perf_counter()

    def stop(self, global_step=False, report_speed=True):
        if not _setting(self.config, "enabled") or not self.started:
            return
        self.started = False
        self.micro_step_count += 1
        if global_step:
            self.global_step_count += 1
        if not self._timing:
            return
        if _setting(self.config, "synchronized"):
            _synchronize()
        self.end_time = time.perf_counter()
        duration = self.end_time - self.start_time
        self.total_elapsed_time += duration
        self.step_elapsed_time += duration
        if global_step:
            if report_speed and self.steps_per_output and self.global_step_count % self.steps_per_output == 0:
                self._report()
            self.step_elapsed_time = 0.0

    def _report(self):
        acc = get_accelerator()
        where = f"epoch={self.epoch_count}/micro_step={self.micro_step_count}/global_step={self.global_step_count}"
        self.logging(f"{where}, RunningAvgSamplesPerSec={self.avg_samples_per_sec()}, "
                     f"CurrSamplesPerSec={self.batch_size / (self.step_elapsed_time + TIME_EPSILON)}, "
                     f"MemAllocated={round(acc.memory_allocated() / _GiB, 2)}GB, "
                     f"MaxMemAllocated={round(acc.max_memory_allocated() / _GiB, 2)}GB")
        if self.monitor_memory:
            import psutil
            self.logging(f"{where}, vm %: {psutil.virtual_memory().percent}, swap %: {psutil.swap_memory().percent}")

    def avg_samples_per_sec(self):
        """Samples per second over the optimizer steps timed so far (the
        steps after warm-up); -inf before one is."""
        timed_steps = self.global_step_count - self.start_step
        if timed_steps <= 0 or self.total_elapsed_time <= 0:
            return -math.inf
        return self.batch_size * timed_steps / self.total_elapsed_time
