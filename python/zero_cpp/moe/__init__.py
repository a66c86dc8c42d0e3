"""DeepSpeed's mixture of experts (`deepspeed.moe`): the MoE layer, its
top-k gate and experts, and the helpers that put expert params in groups of
their own. zero_cpp is data parallel, so the experts are replicated on every
rank (`ep_size` 1): DeepSpeed's expert parallelism, which places experts on
different ranks and exchanges tokens all-to-all, is not built."""
from . import experts, layer, sharded_moe, utils  # noqa: F401
