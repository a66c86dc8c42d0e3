"""DeepSpeed's `deepspeed.moe.utils`: which params are expert params, and
the optimizer's param groups with the experts' in groups of their own
(`split_params_into_different_moe_groups_for_optimizer`, as DeepSpeed's MoE
tutorial builds them). zero_cpp's engine trains expert params as any other
(every rank holds them all), so the groups only keep each group's settings;
the split is DeepSpeed's so that scripts and their checkpoints see the same
groups."""
import torch


def has_moe_layers(m):
    """(whether `m` has an MoE layer, the first one's num_experts)."""
    from .layer import MoE
    for module in m.modules():
        if isinstance(module, MoE):
            return True, module.num_experts
    return False, 0


def is_moe_param(param):
    return not getattr(param, "allreduce", True)


def split_params_into_shared_and_expert_params(params):
    shared = [p for p in params if not is_moe_param(p)]
    return shared, [p for p in params if is_moe_param(p)]


def split_params_grads_into_shared_and_expert_params(group):
    """The grads of `group`'s params that have one, (shared, expert), each in its param's dtype."""
    shared, expert = [], []
    for p in group:
        if p.grad is not None:
            (expert if is_moe_param(p) else shared).append(p.grad.to(p.dtype))
    return shared, expert


def split_params_into_different_moe_groups_for_optimizer(param_groups, max_group_size=178956971):
    """`param_groups` (a group, or a list or tuple of groups, each with a
    'name') with the expert params taken out of each into new groups, one
    per expert group name (`param.group_name`) per original group name,
    with the original's settings, 'name' the expert group's and 'moe' True;
    those of more than `max_group_size` elements cut in order into several.
    The new groups come after the originals. The list is returned (a list
    given is changed in place, as DeepSpeed's)."""
    if isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif not isinstance(param_groups, list):
        raise ValueError(f"split_params_into_different_moe_groups_for_optimizer: param groups of type "
                         f"{type(param_groups).__name__}; give a dict, or a list or tuple of them")
    names = []  # the expert groups' names, in the order their params come
    for group in param_groups:
        for p in group["params"]:
            if is_moe_param(p) and p.group_name not in names:
                names.append(p.group_name)
    # Keyed by the original group's name, as DeepSpeed's: groups of one name
    # share their expert groups (with the last one's settings).
    moe_groups = {}
    for group in param_groups:
        moe_groups[group["name"]] = {name: ({**group, "name": name, "moe": True}, []) for name in names}
    for group in param_groups:
        kept = []
        for p in group["params"]:
            if is_moe_param(p):
                moe_groups[group["name"]][p.group_name][1].append(p)
            else:
                kept.append(p)
        group["params"] = kept
    for by_name in moe_groups.values():
        for settings, params in by_name.values():
            for chunk in _cut(params, max_group_size):
                param_groups.append({**settings, "params": chunk})
    return param_groups


def _cut(params, max_group_size):
    """`params` in order, in runs of at most max_group_size elements (a
    larger param alone); all in one run without a limit. No params, no run."""
    if max_group_size is None:
        return [params]
    runs, run, size = [], [], 0
    for p in params:
        n = getattr(p, "ds_numel", None) or p.numel()
        if run and size + n > max_group_size:
            runs.append(run)
            run, size = [], 0
        run.append(p)
        size += n
    if run:
        runs.append(run)
    return runs


def is_moe_param_group(param_group):
    return param_group.get("moe", False)


def configure_moe_param_groups(model_parameters):
    """What DeepSpeed's engine does to `model_parameters` when the model has
    MoE layers: params, or groups none of which is marked 'moe', split as
    above; groups already split kept."""
    if not isinstance(model_parameters, list):
        raise AssertionError("configure_moe_param_groups: model_parameters must be a list")
    for p in model_parameters:
        if not isinstance(p, (torch.Tensor, dict)):
            raise TypeError(f"configure_moe_param_groups: a param or a param group, not {type(p).__name__}")
    if isinstance(model_parameters[0], torch.nn.Parameter):
        return split_params_into_different_moe_groups_for_optimizer(
            {"params": model_parameters, "name": "dense-params"})
    if not any("moe" in group for group in model_parameters):
        return split_params_into_different_moe_groups_for_optimizer(model_parameters)
    return model_parameters
