"""DeepSpeed's optimizer classes by name (`deepspeed.ops.adam.FusedAdam`,
...), for scripts that build one in code: each holds its hyperparameters
(DeepSpeed's defaults) and zero_cpp.initialize maps it onto the engine's
fused update. Their own step() is not an optimizer: the engine's is."""
from . import adam, adagrad, lamb, lion  # noqa: F401
