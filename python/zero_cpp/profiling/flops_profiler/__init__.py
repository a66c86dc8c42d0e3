"""DeepSpeed's `deepspeed.profiling.flops_profiler`: the flops, MACs,
parameters and latency of a model's forward, by module.

    from zero_cpp.profiling.flops_profiler import get_model_profile, FlopsProfiler
    flops, macs, params = get_model_profile(model, input_shape=(8, 3, 32, 32))

How the counts compare with DeepSpeed's: counter.py and
docs/from-deepspeed.md.
"""
from .profiler import FlopsProfiler, get_model_profile  # noqa: F401
from .sums import get_module_duration, get_module_flops, get_module_macs  # noqa: F401
from .units import (DEFAULT_PRECISION, bytes_to_string, duration_to_string, flops_to_string,  # noqa: F401
                    macs_to_string, number_to_string, params_to_string)
