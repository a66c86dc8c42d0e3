"""DeepSpeed's `deepspeed.runtime.zero`: the same objects as `zero_cpp.zero`
(DeepSpeed's `deepspeed.zero` is this module)."""
from ...zero import GatheredParameters, Init, ZeroParamStatus, register_external_parameter  # noqa: F401
from . import partition_parameters  # noqa: F401
