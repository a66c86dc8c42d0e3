"""DeepSpeed's debugging accessors for one param's full state
(`deepspeed.utils.safe_get_full_fp32_param` and its family), as far as
zero_cpp builds them. Like DeepSpeed's, each is a collective at the stages
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
    an fp32 master. Gathers the masters of every group (every rank calls
    it): a debugging aid, not for each param of a large model in a loop --
    `engine.consolidated_fp32_state_dict()` gives all of them at once."""
    engine, name = _engine_and_name(param)
    if engine is None or not param.requires_grad:
        return None
    return engine._engine.state_dict(False)[name]


def _not_built(name, instead):
    def refuse(*args, **kwargs):
        raise NotImplementedError(f"zero_cpp: deepspeed.utils.{name} is not supported; {instead}")

    refuse.__name__ = name
    return refuse


_READ_INSTEAD = ("read full values with safe_get_full_fp32_param or engine.consolidated_fp32_state_dict(); "
                 "grads and optimizer state are not exposed per param (engine.get_global_grad_norm() gives "
                 "the grad norm of the last step)")
_WRITE_INSTEAD = ("change params inside zero_cpp.zero.GatheredParameters(params, modifier_rank=0): the "
                  "modifier rank's values become every rank's, the fp32 master included")

safe_get_full_grad = _not_built("safe_get_full_grad", _READ_INSTEAD)
safe_get_full_optimizer_state = _not_built("safe_get_full_optimizer_state", _READ_INSTEAD)
safe_get_local_fp32_param = _not_built("safe_get_local_fp32_param", _READ_INSTEAD)
safe_get_local_grad = _not_built("safe_get_local_grad", _READ_INSTEAD)
safe_get_local_optimizer_state = _not_built("safe_get_local_optimizer_state", _READ_INSTEAD)
safe_set_full_fp32_param = _not_built("safe_set_full_fp32_param", _WRITE_INSTEAD)
safe_set_full_optimizer_state = _not_built("safe_set_full_optimizer_state", _WRITE_INSTEAD)
safe_set_local_fp32_param = _not_built("safe_set_local_fp32_param", _WRITE_INSTEAD)
safe_set_local_optimizer_state = _not_built("safe_set_local_optimizer_state", _WRITE_INSTEAD)
