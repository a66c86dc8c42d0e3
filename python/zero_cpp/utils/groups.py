"""DeepSpeed's `deepspeed.utils.groups`: the process groups a model's code
asks for. zero_cpp is data parallel only, so every rank is in one
data-parallel group (torch.distributed's world group), and the model-,
tensor-, sequence- and expert-parallel groups each hold this rank alone
(the experts' data-parallel group is the world: every rank holds every
expert)."""
import torch.distributed as dist


def _world():
    return dist.group.WORLD


def _size():
    return dist.get_world_size() if dist.is_initialized() else 1


def _rank():
    return dist.get_rank() if dist.is_initialized() else 0


def initialize(ep_size=1, mpu=None):
    """DeepSpeed's old set-up call: nothing to set up at ep_size 1 without an mpu."""
    if ep_size != 1 or mpu is not None:
        raise NotImplementedError("zero_cpp: groups.initialize(ep_size > 1 or mpu=...): expert and model "
                                  "parallelism are not supported; zero_cpp is data parallel only")


# ---- data parallel: every rank ----
def get_data_parallel_group():
    return _world()


def get_data_parallel_world_size():
    return _size()


def get_data_parallel_rank():
    return _rank()


_get_data_parallel_group = get_data_parallel_group
_get_data_parallel_world_size = get_data_parallel_world_size
_get_data_parallel_rank = get_data_parallel_rank


def _get_data_parallel_group_ranks():
    return list(range(_size()))


def _get_broadcast_src_rank():
    return 0


# ---- model, tensor and sequence parallel: this rank alone ----
def get_model_parallel_world_size():
    return 1


def get_model_parallel_rank():
    return 0


def get_tensor_model_parallel_world_size():
    return 1


def get_tensor_model_parallel_rank():
    return 0


def get_tensor_model_parallel_src_rank():
    return _rank()


_get_model_parallel_world_size = get_model_parallel_world_size


def _get_sequence_parallel_world_size():
    return 1


def _get_sequence_parallel_rank():
    return 0


def _get_sequence_data_parallel_world_size():
    return _size()


def _get_sequence_data_parallel_rank():
    return _rank()


def _get_sequence_data_parallel_group():
    return _world()


# ---- experts (deepspeed.moe at ep_size 1): each rank holds every expert ----
def _get_expert_parallel_world_size(group_name):
    return 1


def _get_expert_parallel_rank(group_name):
    return 0


def _get_expert_data_parallel_world_size(group_name):
    return _size()


def _get_expert_data_parallel_rank(group_name):
    return _rank()


def _get_expert_data_parallel_group(group_name):
    return _world()
