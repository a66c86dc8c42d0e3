"""DeepSpeed's `deepspeed.runtime.zero.utils`, the part scripts call."""
import torch


def is_zero_param(parameter):
    """Whether `parameter` is a stage-3 (or zero.Init) param: sharded at rest, marked with ds_id."""
    return torch.is_tensor(parameter) and hasattr(parameter, "ds_id")
