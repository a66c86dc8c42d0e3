"""DeepSpeed's `deepspeed.accelerator.get_accelerator()`: the device this
rank trains on, as scripts ask for it (`get_accelerator().device_name()`,
`.current_device_name()`, `.synchronize()`, `.max_memory_allocated()`).

CUDA where torch sees a GPU, else the CPU -- the device the engine picks
(zero_cpp.distributed). DeepSpeed's accelerator also builds its op
extensions (`create_op_builder`); zero_cpp has none to build: its ops are
in the C++ engine, their Python classes in `zero_cpp.ops`.
"""
import contextlib
import os

import torch


def _host_memory():
    """(total, available) bytes of the host's RAM, from /proc/meminfo."""
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0]) * 1024
    return fields["MemTotal"], fields.get("MemAvailable", fields["MemFree"])


def host_rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Cuda:
    """The CUDA accelerator: torch.cuda under DeepSpeed's names."""
    _name = "cuda"
    _communication_backend_name = "nccl"

    def device_name(self, device_index=None):
        return "cuda" if device_index is None else f"cuda:{device_index}"

    def device(self, device_index=None):
        return torch.device(self.device_name(device_index))

    def set_device(self, device_index):
        torch.cuda.set_device(device_index)

    def current_device(self):
        return torch.cuda.current_device()

    def current_device_name(self):
        return f"cuda:{torch.cuda.current_device()}"

    def device_count(self):
        return torch.cuda.device_count()

    def synchronize(self, device_index=None):
        torch.cuda.synchronize(device_index)

    def is_synchronized_device(self):
        return False  # kernels run asynchronously to the host

    def use_host_timers(self):
        return self.is_synchronized_device()

    def resolves_data_dependency(self):
        return self.is_synchronized_device()

    def handles_memory_backpressure(self):
        return self.is_synchronized_device()

    # RNG
    def random(self):
        return torch.random

    def manual_seed(self, seed):
        torch.cuda.manual_seed(seed)

    def manual_seed_all(self, seed):
        torch.cuda.manual_seed_all(seed)

    def initial_seed(self):
        return torch.cuda.initial_seed()

    def get_rng_state(self, device_index=None):
        return torch.cuda.get_rng_state() if device_index is None else torch.cuda.get_rng_state(device_index)

    def set_rng_state(self, new_state, device_index=None):
        if device_index is None:
            torch.cuda.set_rng_state(new_state)
        else:
            torch.cuda.set_rng_state(new_state, device_index)

    def default_generator(self, device_index):
        return torch.cuda.default_generators[device_index]

    # Streams and events
    @property
    def Stream(self):  # noqa: N802 (DeepSpeed's name)
        return torch.cuda.Stream

    @property
    def Event(self):  # noqa: N802
        return torch.cuda.Event

    def stream(self, stream):
        return torch.cuda.stream(stream)

    def current_stream(self, device_index=None):
        return torch.cuda.current_stream(device_index)

    def default_stream(self, device_index=None):
        return torch.cuda.default_stream(device_index)

    # Memory
    def empty_cache(self):
        torch.cuda.empty_cache()

    def memory_allocated(self, device_index=None):
        return torch.cuda.memory_allocated(device_index)

    def max_memory_allocated(self, device_index=None):
        return torch.cuda.max_memory_allocated(device_index)

    def reset_max_memory_allocated(self, device_index=None):
        torch.cuda.reset_peak_memory_stats(device_index)

    def memory_reserved(self, device_index=None):
        return torch.cuda.memory_reserved(device_index)

    def max_memory_reserved(self, device_index=None):
        return torch.cuda.max_memory_reserved(device_index)

    memory_cached = memory_reserved
    max_memory_cached = max_memory_reserved
    reset_max_memory_cached = reset_max_memory_allocated

    def memory_stats(self, device_index=None):
        return torch.cuda.memory_stats(device_index)

    def reset_peak_memory_stats(self, device_index=None):
        torch.cuda.reset_peak_memory_stats(device_index)

    def total_memory(self, device_index=None):
        return torch.cuda.get_device_properties(device_index or 0).total_memory

    def available_memory(self, device_index=None):
        return torch.cuda.mem_get_info(device_index)[0]

    # Data types
    def is_bf16_supported(self):
        return torch.cuda.is_bf16_supported()

    def is_fp16_supported(self):
        return True

    def is_fp64_supported(self):
        return True

    def supported_dtypes(self):
        return [torch.float, torch.half] + ([torch.bfloat16] if self.is_bf16_supported() else [])

    # Misc
    def is_available(self):
        return torch.cuda.is_available()

    def range_push(self, msg):
        torch.cuda.nvtx.range_push(msg)

    def range_pop(self):
        torch.cuda.nvtx.range_pop()

    def communication_backend_name(self):
        return self._communication_backend_name

    def is_triton_supported(self):
        return False

    def pin_memory(self, tensor, align_bytes=1):
        return tensor.pin_memory()

    def is_pinned(self, tensor):
        return tensor.is_pinned()

    def on_accelerator(self, tensor):
        return tensor.device.type == self._name

    def create_op_builder(self, class_name):
        raise RuntimeError(f"zero_cpp's accelerator builds no op extensions ({class_name}): zero_cpp's optimizers "
                           "and ops are in its C++ engine; use zero_cpp.ops (e.g. zero_cpp.ops.adam.FusedAdam)")

    get_op_builder = create_op_builder


class _Cpu(_Cuda):
    """The CPU accelerator: the host is the device; memory is the process's."""
    _name = "cpu"
    _communication_backend_name = "gloo"  # the engine's host collectives: shared memory or Gloo

    def device_name(self, device_index=None):
        return "cpu"

    def set_device(self, device_index):
        pass

    def current_device(self):
        return int(os.environ.get("LOCAL_RANK", 0))

    def current_device_name(self):
        return "cpu"

    def device_count(self):
        return 1

    def synchronize(self, device_index=None):
        pass

    def is_synchronized_device(self):
        return True

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def initial_seed(self):
        return torch.initial_seed()

    def get_rng_state(self, device_index=None):
        return torch.get_rng_state()

    def set_rng_state(self, new_state, device_index=None):
        torch.set_rng_state(new_state)

    def default_generator(self, device_index):
        return torch.default_generator

    @property
    def Stream(self):  # noqa: N802
        return None

    @property
    def Event(self):  # noqa: N802
        return None

    def stream(self, stream):
        return contextlib.nullcontext()

    def current_stream(self, device_index=None):
        return None

    default_stream = current_stream

    def empty_cache(self):
        pass

    def memory_allocated(self, device_index=None):
        return host_rss_bytes()

    def max_memory_allocated(self, device_index=None):
        import resource
        # The kernel's high-water mark (KiB) lags its current count by a few
        # pages (per-CPU counters): never below the current RSS.
        return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, host_rss_bytes())

    def reset_max_memory_allocated(self, device_index=None):
        pass  # the kernel's high-water mark cannot be reset

    memory_reserved = memory_allocated
    max_memory_reserved = max_memory_allocated
    memory_cached = memory_allocated
    max_memory_cached = max_memory_allocated
    reset_max_memory_cached = reset_max_memory_allocated
    reset_peak_memory_stats = reset_max_memory_allocated

    def memory_stats(self, device_index=None):
        return {"allocated_bytes.all.current": self.memory_allocated(),
                "allocated_bytes.all.peak": self.max_memory_allocated()}

    def total_memory(self, device_index=None):
        return _host_memory()[0]

    def available_memory(self, device_index=None):
        return _host_memory()[1]

    def is_bf16_supported(self):
        return True

    def is_available(self):
        return True

    def range_push(self, msg):
        pass

    def range_pop(self):
        pass

    def pin_memory(self, tensor, align_bytes=1):
        return tensor

    def is_pinned(self, tensor):
        return False


_accelerator = None


def get_accelerator():
    """This process's accelerator: CUDA where torch sees a GPU, else the CPU."""
    global _accelerator
    if _accelerator is None:
        _accelerator = _Cuda() if torch.cuda.is_available() and torch.cuda.device_count() > 0 else _Cpu()
    return _accelerator
