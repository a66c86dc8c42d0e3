"""The job: the ranks, their devices and communicators.

`init_distributed()` is DeepSpeed's: it reads the launcher's variables
(zero-run, torchrun, DeepSpeed's launcher, Slurm's srun, Open MPI's mpirun),
sets up a `torch.distributed` process group -- so that user code calling
`torch.distributed` (an all-reduce of a metric, a barrier) keeps working --
and then the C++ engine's world, which joins the same rendezvous store
(its keys under a prefix) and routes the engine's collectives as the C++
API does: shared memory or Gloo between host tensors, NCCL or CUDA IPC
between CUDA tensors.
"""
import atexit
import datetime
import os

import torch
import torch.distributed as dist

from . import _C

_world = None  # the C++ World, once init_distributed has run
_set_up_torch_group = False  # whether init_distributed made torch.distributed's group (then it is ours to end)


def _set_launch_variables(env):
    """torch.distributed's env:// reads RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT; mpirun and srun set their own names, which the C++ reader
    (`env`) understood. Set the torch ones from it where missing."""
    defaults = {
        "RANK": env["rank"],
        "WORLD_SIZE": env["world_size"],
        "LOCAL_RANK": env["local_rank"],
    }
    if env["master_addr"]:
        defaults["MASTER_ADDR"] = env["master_addr"]
        defaults["MASTER_PORT"] = env["master_port"]
    for name, value in defaults.items():
        os.environ.setdefault(name, str(value))


def _device_for(local_rank):
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=29500, verbose=True,
                     timeout=datetime.timedelta(minutes=30), init_method=None, dist_init_required=None,
                     config=None, rank=-1, world_size=-1):
    """Initialize the job's communicators (DeepSpeed's `init_distributed`).

    Idempotent. `rank` and `world_size`, when given, are used instead of the
    launcher's variables. `dist_backend` chooses torch.distributed's backend
    (default: "gloo" on the CPU, "cuda:nccl,cpu:gloo" with CUDA); the engine's
    own collectives are routed by the C++ engine whatever it is.
    `dist_init_required=False` with no process group set up is an error
    here: the engine needs the rendezvous store torch.distributed's group
    runs on.
    """
    global _world, _set_up_torch_group
    if _world is not None:
        return
    if rank >= 0:
        os.environ["RANK"] = str(rank)
    if world_size > 0:
        os.environ["WORLD_SIZE"] = str(world_size)
    env = _C.launch_env()  # raises naming a variable that is missing or wrong
    multi = env["world_size"] > 1 or bool(env["master_addr"])
    device = _device_for(env["local_rank"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if dist_init_required is False:
            raise RuntimeError("zero_cpp.init_distributed: dist_init_required=False, but torch.distributed has no "
                               "process group; zero_cpp joins torch.distributed's rendezvous store, so set one up "
                               "first or leave dist_init_required unset")
        backend = dist_backend or ("cuda:nccl,cpu:gloo" if device.type == "cuda" else "gloo")
        _set_up_torch_group = True
        if multi:
            _set_launch_variables(env)
            dist.init_process_group(backend=backend, init_method=init_method or "env://", timeout=timeout,
                                    rank=env["rank"], world_size=env["world_size"])
        else:
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    elif dist.get_world_size() != env["world_size"] or dist.get_rank() != env["rank"]:
        raise RuntimeError(f"zero_cpp.init_distributed: torch.distributed's process group has rank "
                           f"{dist.get_rank()} of {dist.get_world_size()}, but the launcher's variables say rank "
                           f"{env['rank']} of {env['world_size']} ({env['launcher']})")
    _world = _C.init_distributed(join_existing_store=multi)
    warning = _C.std_filesystem_binding_warning()
    if warning:
        import warnings
        warnings.warn(warning)
    atexit.register(_shutdown)


def _shutdown():
    # The engine's communicators (NCCL's, the shared-memory lanes, CUDA IPC)
    # go while CUDA is still up, as the C++ API's World::shutdown.
    if _world is not None and not _world.is_shut_down:
        _world.shutdown()
    # Then the torch.distributed group init_distributed set up, if the script
    # left it up: Gloo's worker threads still holding work at interpreter
    # teardown abort the process ("terminate called without an active
    # exception", pytorch/pytorch#190489). A group the user made is theirs.
    if _set_up_torch_group and dist.is_initialized():
        dist.destroy_process_group()


def world():
    """The C++ World; init_distributed() first if it has not run."""
    if _world is None:
        init_distributed()
    return _world


def is_initialized():
    return _world is not None


def device():
    """This rank's device: its GPU (LOCAL_RANK mod the GPUs visible), else the CPU."""
    return torch.device(world().device)
