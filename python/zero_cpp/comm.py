"""DeepSpeed's `deepspeed.comm`: the job's ranks and torch.distributed's
collectives over the process group init_distributed set up. Names it does
not define here are torch.distributed's (all_reduce, broadcast, ReduceOp,
...), as DeepSpeed's module forwards to it; with the comms logger on, the
collectives among them are timed into it (utils/comms_logging.py)."""
import functools as _functools
import time as _time

import torch as _torch
import torch.distributed as _dist

from . import distributed as _distributed
from .distributed import init_distributed  # noqa: F401  (deepspeed.comm.init_distributed)
from .utils.comms_logging import caller_name, comms_logger  # noqa: F401  (deepspeed.comm.comms_logger)


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


def get_world_rank_from_launcher():
    """This process's rank as its launcher set it (zero-run, torchrun,
    DeepSpeed's launcher, Slurm, Open MPI), before any process group."""
    return _torch_launch_env()["rank"]


def get_world_size_from_launcher():
    return _torch_launch_env()["world_size"]


def get_local_rank_from_launcher():
    return _torch_launch_env()["local_rank"]


def _torch_launch_env():
    from . import _C
    return _C.launch_env()


def has_all_gather_into_tensor():
    return True  # torch.distributed's all_gather_into_tensor, on every backend zero_cpp sets up


def has_reduce_scatter_tensor():
    return True


def inference_all_reduce(tensor, op=_dist.ReduceOp.SUM, group=None, async_op=False, prof=False,
                         log_name="all_reduce", debug=None):
    """DeepSpeed's all-reduce for inference: the process group's
    all_reduce, in place; returns the tensor."""
    if get_world_size(group) > 1:
        __getattr__("all_reduce")(tensor, op=op, group=group)
    return tensor


def barrier(group=None, async_op=False, device_ids=None):
    return __getattr__("barrier")(group=group, async_op=async_op)


def get_world_group():
    return _dist.group.WORLD


def get_all_ranks_from_group(group=None):
    return _dist.get_process_group_ranks(group or _dist.group.WORLD)


def configure(deepspeed_config=None, enabled=None, prof_all=None, prof_ops=None, verbose=None, debug=None):
    """DeepSpeed's: the comms logger's settings, from a ds_config (a path, a
    dict or a DeepSpeedConfig: its comms_logger block) and the arguments."""
    if deepspeed_config is not None:
        from . import config as configs
        given = getattr(deepspeed_config, "_param_dict", deepspeed_config)
        block = configs.python_block(configs.load(config=given), "comms_logger")
        comms_logger.configure(**block)
    comms_logger.configure(enabled=enabled, prof_all=prof_all, prof_ops=prof_ops, verbose=verbose, debug=debug)


def log_summary(show_straggler=False, return_dict=False):
    """DeepSpeed's: every rank calls it; rank 0 prints the table of the
    collectives logged so far (the engine's and those called through this
    module), and each rank returns its own dict when asked."""
    if _dist.is_initialized():
        _dist.barrier()  # not logged
    result = comms_logger.log_all(print_log=get_rank() == 0, show_straggler=show_straggler,
                                  return_dict=return_dict)
    if _dist.is_initialized():
        _dist.barrier()
    return result


# The collectives a script calls through this module that the logger times
# (torch.distributed's names), and where each takes the tensor whose bytes are
# the message, as DeepSpeed's: a gather's input shard, a reduce-scatter's
# whole input.
_MESSAGE_ARG = {"all_reduce": 0, "broadcast": 0, "reduce": 0, "all_gather": 1, "all_gather_into_tensor": 1,
                "reduce_scatter": 1, "reduce_scatter_tensor": 1, "all_to_all": 1, "all_to_all_single": 1,
                "gather": 0, "scatter": 0, "send": 0, "recv": 0, "isend": 0, "irecv": 0, "barrier": None}
_KEYWORD = {0: ("tensor", "output", "output_tensor"), 1: ("input_tensor", "input", "input_tensor_list")}


def _message_bytes(position, args, kwargs):
    if position is None:
        return 0
    t = args[position] if len(args) > position else next(
        (kwargs[k] for k in _KEYWORD[position] if k in kwargs), None)
    tensors = t if isinstance(t, (list, tuple)) else [t]
    return sum(x.element_size() * x.numel() for x in tensors if isinstance(x, _torch.Tensor))


def _timed(name, op):
    @_functools.wraps(op)
    def call(*args, **kwargs):
        if not comms_logger.profiles(name):
            return op(*args, **kwargs)
        group = kwargs.get("group")
        on_device = any(isinstance(a, _torch.Tensor) and a.device.type != "cpu" for a in args)
        if on_device:
            _torch.cuda.synchronize()
        start = _time.perf_counter()
        result = op(*args, **kwargs)
        if on_device:
            _torch.cuda.synchronize()
        ms = (_time.perf_counter() - start) * 1e3
        record = f"{name} | [Caller Func: {caller_name()}]" if comms_logger.debug else name
        comms_logger.append(name, record, ms, _message_bytes(_MESSAGE_ARG[name], args, kwargs),
                            get_world_size(group))
        return result
    return call


def __getattr__(name):
    op = getattr(_dist, name)
    return _timed(name, op) if name in _MESSAGE_ARG else op
