"""DeepSpeed's `deepspeed.runtime.zero.offload_config` enums, which scripts
pass to `engine.offload_states(include=..., device=...)`."""
from enum import Enum


class OffloadDeviceEnum(str, Enum):
    """Where offload_states moves the states (and the ds_config's offload devices)."""
    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadStateTypeEnum(str, Enum):
    """The engine's states offload_states can move."""
    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"
