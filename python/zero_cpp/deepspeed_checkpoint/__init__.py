"""DeepSpeed's own checkpoints, for a run moving from DeepSpeed to zero-cpp:
`convert_deepspeed_checkpoint` rewrites one (DeepSpeed 0.19.8, any world
size, ZeRO stage 0-3, fp32/bf16/fp16, Adam or AdamW) as a zero-cpp
checkpoint, which the engine then loads at any world size and stage.

    from zero_cpp.deepspeed_checkpoint import convert_deepspeed_checkpoint
    convert_deepspeed_checkpoint("ds_ckpt", None, "zc_ckpt", "from_deepspeed")
    engine.load_checkpoint("zc_ckpt")  # the weights, Adam's moments, counters, scheduler, client_state
"""
from .convert import convert_deepspeed_checkpoint
from .errors import DeepSpeedCheckpointError
from .reader import is_deepspeed_checkpoint

__all__ = ["convert_deepspeed_checkpoint", "is_deepspeed_checkpoint", "DeepSpeedCheckpointError"]
