"""DeepSpeed's `deepspeed.runtime.activation_checkpointing`, where
`deepspeed.checkpointing` lives in DeepSpeed's tree."""
from . import checkpointing  # noqa: F401
