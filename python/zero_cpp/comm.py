"""DeepSpeed's `deepspeed.comm`: the job's ranks and torch.distributed's
collectives over the process group init_distributed set up. Names it does
not define here are torch.distributed's (all_reduce, broadcast, ReduceOp,
...), as DeepSpeed's module forwards to it."""
import torch.distributed as _dist

from . import distributed as _distributed
from .distributed import init_distributed  # noqa: F401  (deepspeed.comm.init_distributed)


def is_initialized():
    return _distributed.is_initialized()


def get_rank(group=None):
    return _dist.get_rank(group) if _dist.is_initialized() else 0


def get_world_size(group=None):
    return _dist.get_world_size(group) if _dist.is_initialized() else 1


def get_local_rank():
    return _distributed.world().local_rank


def get_global_rank(group=None, group_rank=0):
    return _dist.get_global_rank(group, group_rank) if group is not None else group_rank


def barrier(group=None, async_op=False, device_ids=None):
    return _dist.barrier(group=group, async_op=async_op)


def get_world_group():
    return _dist.group.WORLD


def get_all_ranks_from_group(group=None):
    return _dist.get_process_group_ranks(group or _dist.group.WORLD)


def log_summary(show_straggler=False, return_dict=False):
    """DeepSpeed prints its comms logger's table here. zero_cpp has no comms
    logger (the ds_config's comms_logger block is refused); the engine's own
    collectives are counted by engine.comm_counts(). Nothing to print."""
    return {} if return_dict else None


def __getattr__(name):
    return getattr(_dist, name)
