"""DeepSpeed's `deepspeed.runtime.zero`: the same objects as `zero_cpp.zero`
(DeepSpeed's `deepspeed.zero` is this module), and its submodules scripts
reach through it, as `deepspeed.runtime.zero.stage3.estimate_...` (the
memory estimators)."""
from ...zero import GatheredParameters, Init, ZeroParamStatus, register_external_parameter  # noqa: F401
from . import offload_config, partition_parameters, stage3, stage_1_and_2, tiling, utils  # noqa: F401
from .tiling import TiledLinear, TiledLinearReturnBias  # noqa: F401
