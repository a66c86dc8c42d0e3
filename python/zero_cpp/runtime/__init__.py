"""DeepSpeed's `deepspeed.runtime`, as far as scripts reach into it: the LR
schedules, RepeatingLoader, see_memory_usage, `runtime.zero`."""
from . import dataloader, lr_schedules, utils, zero  # noqa: F401
