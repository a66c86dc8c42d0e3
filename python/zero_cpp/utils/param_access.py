"""DeepSpeed's debugging accessors for one param's full state
(`deepspeed.utils.safe_get_full_fp32_param`, `safe_get_full_grad`,
`safe_get_full_optimizer_state`), as far as zero_cpp builds them. Like DeepSpeed's, each is a collective at the stages
that shard the state: every rank calls it, for the same param."""


def _engine_and_name(param):
    from ..engine import engine_of  # the engine module imports this package: late

    engine = engine_of(param)
    if engine is None:
        return None, None
    for name, p in engine.module.named_parameters():
        if p is param:
            return engine, name
    return None, None


def safe_get_full_fp32_param(param):
    """The full fp32 master value of a trainable `param` (a copy), or None
    for a param no live engine trains, as DeepSpeed returns for one without
    an fp32 master. A collective of the param's size (every rank calls it,
    for the same param); `engine.consolidated_fp32_state_dict()` gives
    every param at once."""
    engine, name = _engine_and_name(param)
    if engine is None or not param.requires_grad:
        return None
    return engine._engine.full_state("master", name)


def safe_get_full_grad(param):
    """The full fp32 grad of a trainable `param` as the next step will take
    it (reduced over the ranks), between a boundary's backward and its step;
    None for a param no live engine trains. A collective, as
    safe_get_full_fp32_param."""
    engine, name = _engine_and_name(param)
    if engine is None or not param.requires_grad:
        return None
    return engine._engine.full_state("grad", name)


def safe_get_full_optimizer_state(param, optim_state_key):
    """The full fp32 optimizer state `optim_state_key` ("exp_avg",
    "exp_avg_sq") of a trainable `param`; None for a param no live engine
    trains. A collective, as safe_get_full_fp32_param."""
    engine, name = _engine_and_name(param)
    if engine is None or not param.requires_grad:
        return None
    try:
        return engine._engine.full_state(str(optim_state_key), name)
    except ValueError as e:  # std::invalid_argument
        raise ValueError(f"zero_cpp: safe_get_full_optimizer_state: {e}") from None


def _not_built(name, instead):
    def refuse(*args, **kwargs):
        raise NotImplementedError(f"zero_cpp: deepspeed.utils.{name} is not supported; {instead}")

    refuse.__name__ = name
    return refuse


_READ_INSTEAD = ("read full values with safe_get_full_fp32_param, safe_get_full_grad and "
                 "safe_get_full_optimizer_state (this rank's shard alone is not exposed)")
_WRITE_INSTEAD = ("change params inside zero_cpp.zero.GatheredParameters(params, modifier_rank=0): the "
                  "modifier rank's values become every rank's, the fp32 master included")

safe_get_local_fp32_param = _not_built("safe_get_local_fp32_param", _READ_INSTEAD)
safe_get_local_grad = _not_built("safe_get_local_grad", _READ_INSTEAD)
safe_get_local_optimizer_state = _not_built("safe_get_local_optimizer_state", _READ_INSTEAD)
safe_set_full_fp32_param = _not_built("safe_set_full_fp32_param", _WRITE_INSTEAD)
safe_set_full_optimizer_state = _not_built("safe_set_full_optimizer_state", _WRITE_INSTEAD)
safe_set_local_fp32_param = _not_built("safe_set_local_fp32_param", _WRITE_INSTEAD)
safe_set_local_optimizer_state = _not_built("safe_set_local_optimizer_state", _WRITE_INSTEAD)
