"""DeepSpeed's `deepspeed.runtime.engine`: the engine class under its
DeepSpeed name, for scripts that test `isinstance(x, DeepSpeedEngine)`."""
from ..engine import ZeroEngine as DeepSpeedEngine  # noqa: F401
