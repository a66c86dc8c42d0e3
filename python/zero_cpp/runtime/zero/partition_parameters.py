"""DeepSpeed's `deepspeed.runtime.zero.partition_parameters`, as far as
scripts import from it: Init, GatheredParameters, ZeroParamStatus."""
from ...zero import GatheredParameters, Init, ZeroParamStatus, register_external_parameter  # noqa: F401
