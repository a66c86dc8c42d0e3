"""DeepSpeed's `deepspeed.utils`: the checkpoint readers (zero_to_fp32),
one param's training state, whole or this rank's part (param_access), the logger, the timers, RepeatingLoader,
z3 leaf modules, OnDevice, the process groups a model asks for (groups)."""
from . import timer, zero_to_fp32  # noqa: F401
from .zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint  # noqa: F401
from .param_access import (  # noqa: F401
    safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state, safe_get_local_fp32_param,
    safe_get_local_grad, safe_get_local_optimizer_state, safe_set_full_fp32_param, safe_set_full_grad,
    safe_set_full_optimizer_state, safe_set_local_fp32_param, safe_set_local_grad, safe_set_local_optimizer_state,
    safe_update_full_grad_vectorized)
from .logging import log_dist, log_dist_once, logger, set_log_level_from_string  # noqa: F401
from ..runtime.dataloader import RepeatingLoader  # noqa: F401
from .z3_leaf_module import (apply_zero_leaf_module_config, get_z3_leaf_modules, set_z3_leaf_module,  # noqa: F401
                             set_z3_leaf_modules, set_z3_leaf_modules_by_name, set_z3_leaf_modules_by_suffix,
                             unset_z3_leaf_modules, z3_leaf_module)
from .init_on_device import OnDevice  # noqa: F401
from . import groups  # noqa: F401
from .groups import (get_data_parallel_group, get_data_parallel_rank, get_data_parallel_world_size,  # noqa: F401
                     get_model_parallel_rank, get_model_parallel_world_size, get_tensor_model_parallel_rank,
                     get_tensor_model_parallel_world_size)
