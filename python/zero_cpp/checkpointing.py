"""DeepSpeed's `deepspeed.checkpointing` (activation checkpointing): torch's
own checkpoint, which the engine's stage-3 hooks follow as any recompute
(a unit's forward runs again in backward and is gathered again)."""
import torch.utils.checkpoint as _torch_checkpoint


def checkpoint(function, *args):
    """Recomputes `function(*args)` in backward instead of keeping its activations."""
    return _torch_checkpoint.checkpoint(function, *args, use_reentrant=False)


def configure(mpu_, deepspeed_config=None, partition_activations=None, contiguous_checkpointing=None,
              num_checkpoints=None, checkpoint_in_cpu=None, synchronize=None, profile=None):
    if partition_activations or contiguous_checkpointing or checkpoint_in_cpu:
        raise NotImplementedError("zero_cpp.checkpointing: partitioned, contiguous or CPU activation checkpoints "
                                  "are not supported; plain recomputation is")


def is_configured():
    return True
