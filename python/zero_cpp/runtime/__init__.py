"""DeepSpeed's `deepspeed.runtime`, as far as scripts reach into it: the LR schedules."""
from . import lr_schedules  # noqa: F401
