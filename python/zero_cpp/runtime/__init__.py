"""DeepSpeed's `deepspeed.runtime`, as far as scripts reach into it: the LR
schedules, RepeatingLoader, see_memory_usage."""
from . import dataloader, lr_schedules, utils  # noqa: F401
