"""DeepSpeed's `deepspeed.runtime`, as far as scripts reach into it: the LR
schedules, RepeatingLoader, see_memory_usage, `runtime.zero`, the engine
class (`runtime.engine`), activation checkpointing under its path."""
from . import activation_checkpointing, dataloader, lr_schedules, utils, zero  # noqa: F401
