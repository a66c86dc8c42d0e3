"""DeepSpeed's `deepspeed.runtime.activation_checkpointing.checkpointing`:
zero_cpp.checkpointing under DeepSpeed's path (the same functions)."""
from ...checkpointing import (checkpoint, configure, is_configured, non_reentrant_checkpoint,  # noqa: F401
                              reset)
