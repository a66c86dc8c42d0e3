"""DeepSpeed's `deepspeed.profiling`: the flops profiler
(`zero_cpp.profiling.flops_profiler`)."""
from . import flops_profiler  # noqa: F401
