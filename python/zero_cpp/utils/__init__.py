"""DeepSpeed's `deepspeed.utils`: the checkpoint readers (zero_to_fp32)."""
from . import zero_to_fp32  # noqa: F401
from .zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint  # noqa: F401
