"""DeepSpeed's accessors for one param's training state (`deepspeed.utils`):
its fp32 master, its reduced grad and its optimizer state, read or written
whole (`safe_get_full_*`, `safe_set_full_*`) or as this rank's part
(`safe_get_local_*`, `safe_set_local_*`, stage 3 only, as DeepSpeed's).

As DeepSpeed's:
- the full getters are collectives at the stages that shard the state
  (every rank calls them, for the same param); the others are not;
- a setter changes the fp32 state only: the param itself takes a new master
  value at the next step (at once where the fp32 master is the param);
- grads exist between a boundary's backward and its step (an error
  otherwise, where DeepSpeed would hand back stale or absent ones);
- a param no live engine trains (frozen, or not the engine's) gives None,
  and a setter leaves it alone.

A param's local part is the part of it this rank's shard holds. The engine
lays a unit's params end to end and shards the whole, so the parts differ
in size from DeepSpeed's per-param partitions (one rank may hold none of a
small param); `param.ds_tensor` has this rank's part's size, and the local
setters take a value of that size."""


def _engine_and_name(param):
    from ..engine import engine_of  # the engine module imports this package: late

    engine = engine_of(param)
    if engine is None:
        return None, None
    return engine, engine.param_name(param)


def _trained(param):
    """(engine, name) of a param a live engine trains, else (None, None)."""
    engine, name = _engine_and_name(param)
    if engine is None or not param.requires_grad:
        return None, None
    return engine, name


def _check_stage3_param(param):
    # DeepSpeed asserts the same (its local API is for stage 3's partitions).
    assert hasattr(param, "ds_id"), "This API is only defined for ZeRO-3 partitioned parameters"


def _kind(optim_state_key):
    key = str(optim_state_key)
    if key in ("master", "grad"):  # the C++ names of the other two kinds: not optimizer state
        raise ValueError(f"zero_cpp: {key!r} is not an optimizer state key (Adam's: 'exp_avg', 'exp_avg_sq')")
    return key


def _get(param, kind, local, fn):
    engine, name = _trained(param)
    if engine is None:
        return None
    try:
        value = engine._engine.local_state(kind, name) if local else engine._engine.full_state(kind, name)
    except ValueError as e:  # std::invalid_argument: an unknown state key
        raise ValueError(f"zero_cpp: {fn}: {e}") from None
    return value.to(engine.device)


def _set(param, value, kind, local, fn):
    import torch

    engine, name = _trained(param)
    if engine is None:
        return
    if not torch.is_tensor(value):
        raise TypeError(f"zero_cpp: {fn}: the value is a {type(value).__name__}, not a tensor")
    try:
        engine._engine.set_state(kind, name, value, local)
    except ValueError as e:
        raise ValueError(f"zero_cpp: {fn}: {e}") from None


# ---- full values (stages 0-3) ----

def safe_get_full_fp32_param(param):
    """The full fp32 master value of a trainable `param` (a copy), or None
    for a param no live engine trains, as DeepSpeed returns for one without
    an fp32 master. A collective of the param's size (every rank calls it,
    for the same param); `engine.consolidated_fp32_state_dict()` gives
    every param at once."""
    return _get(param, "master", False, "safe_get_full_fp32_param")


def safe_get_full_grad(param):
    """The full fp32 grad of a trainable `param` as the next step will take
    it (reduced over the ranks), between a boundary's backward and its step;
    None for a param no live engine trains. A collective, as
    safe_get_full_fp32_param."""
    return _get(param, "grad", False, "safe_get_full_grad")


def safe_get_full_optimizer_state(param, optim_state_key):
    """The full fp32 optimizer state `optim_state_key` ("exp_avg",
    "exp_avg_sq") of a trainable `param`; None for a param no live engine
    trains. A collective, as safe_get_full_fp32_param."""
    return _get(param, _kind(optim_state_key), False, "safe_get_full_optimizer_state")


def safe_set_full_fp32_param(param, value):
    """Writes `value` (the param's shape or size; the same on every rank)
    into the param's fp32 master; the param takes it at the next step."""
    _set(param, value, "master", False, "safe_set_full_fp32_param")


def safe_set_full_optimizer_state(param, value, optim_state_key):
    """Writes `value` into the param's optimizer state `optim_state_key`."""
    _set(param, value, _kind(optim_state_key), False, "safe_set_full_optimizer_state")


def safe_set_full_grad(param, value):
    """Replaces the param's reduced grad, which the next step takes (its
    norm and clipping included), between a boundary's backward and its step."""
    _set(param, value, "grad", False, "safe_set_full_grad")


def safe_update_full_grad_vectorized(param_list, update_func):
    """For each trainable param: its grad becomes update_func(full grad,
    param). Every rank calls it with the same list (one collective per
    param where grads are sharded)."""
    for p in param_list:
        grad = safe_get_full_grad(p)
        if grad is not None:
            safe_set_full_grad(p, update_func(grad, p))


# ---- this rank's part (stage 3) ----

def safe_get_local_fp32_param(param):
    """This rank's part of the param's fp32 master, flat (a copy)."""
    _check_stage3_param(param)
    return _get(param, "master", True, "safe_get_local_fp32_param")


def safe_get_local_grad(param):
    """This rank's part of the param's reduced fp32 grad, flat (a copy)."""
    _check_stage3_param(param)
    return _get(param, "grad", True, "safe_get_local_grad")


def safe_get_local_optimizer_state(param, optim_state_key):
    """This rank's part of the param's optimizer state, flat (a copy)."""
    _check_stage3_param(param)
    return _get(param, _kind(optim_state_key), True, "safe_get_local_optimizer_state")


def safe_set_local_fp32_param(param, value):
    """Writes this rank's part of the param's fp32 master (`param.ds_tensor`'s size)."""
    _check_stage3_param(param)
    _set(param, value, "master", True, "safe_set_local_fp32_param")


def safe_set_local_optimizer_state(param, value, optim_state_key):
    """Writes this rank's part of the param's optimizer state `optim_state_key`."""
    _check_stage3_param(param)
    _set(param, value, _kind(optim_state_key), True, "safe_set_local_optimizer_state")


def safe_set_local_grad(param, value):
    """Writes this rank's part of the param's reduced grad."""
    _check_stage3_param(param)
    _set(param, value, "grad", True, "safe_set_local_grad")
