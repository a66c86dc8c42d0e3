"""A stage-3 module's `state_dict()` and `load_state_dict()` at rest.

Between its uses a stage-3 param keeps its full shape, but its memory is
released (only this rank's shard exists, in the engine), and reading it
stops the process (memory/release_guard.h). Scripts written for DeepSpeed
call `torch.save(model.state_dict(), path)` at stage 3 all the same, where
DeepSpeed's params hold empty tensors. So, on every module zero.Init or a
stage-3 engine shards:

- `state_dict()` puts an empty tensor of the param's dtype where a param is
  released, as DeepSpeed's holds, and warns with the ways to the full
  values; params gathered now (inside GatheredParameters, or persistent
  ones) are there whole;
- `load_state_dict()` into a released param raises before anything is
  written (DeepSpeed's fails on the shapes), naming the param and
  GatheredParameters(modifier_rank=0), inside which the load reaches the
  engine.
"""
import warnings
import weakref

import torch

from .. import _C

_guarded = weakref.WeakSet()

_STATE_DICT_AT_REST = (
    "zero_cpp: stage 3: module.state_dict() outside deepspeed.zero.GatheredParameters holds an empty tensor for "
    "each sharded param, as DeepSpeed's does: take the full model with engine.consolidated_fp32_state_dict(), "
    "engine._zero3_consolidated_16bit_state_dict() or engine.save_16bit_model(dir), or call state_dict() inside "
    "deepspeed.zero.GatheredParameters(list(model.parameters())) on every rank")


def guard(modules):
    """Hooks `modules`' state_dict and load_state_dict as above (once each)."""
    for m in modules:
        if m in _guarded:
            continue
        m.register_state_dict_post_hook(_empty_where_released)
        m.register_load_state_dict_pre_hook(_refuse_loads_into_released)
        _guarded.add(m)


def _empty_where_released(module, state_dict, prefix, local_metadata):
    emptied = False
    for name, p in module._parameters.items():
        key = prefix + name
        t = state_dict.get(key)
        # keep_vars=True hands out the param itself: nothing is read there.
        if p is None or t is None or t is p or not _C.released(p):
            continue
        state_dict[key] = torch.empty(0, dtype=t.dtype, device=t.device)
        emptied = True
    if emptied:
        warnings.warn(_STATE_DICT_AT_REST, stacklevel=2)


def _refuse_loads_into_released(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                error_msgs):
    # The outermost module's hook runs before any module is loaded, and sees
    # every key under it: checking its whole subtree refuses before a write.
    for name, p in module.named_parameters(prefix=prefix[:-1]):
        if name in state_dict and _C.released(p):
            raise RuntimeError(
                f"zero_cpp: stage 3: load_state_dict into '{name}', which is sharded and released here (outside "
                "deepspeed.zero.GatheredParameters); nothing was loaded. Load inside `with "
                "deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):` on every rank (rank "
                "0's values then reach every rank and the engine), or use engine.load_checkpoint(dir) or "
                "safe_set_full_fp32_param")
