"""A stage-3 param read at rest reads as DeepSpeed's does: an empty tensor.

Between its uses a stage-3 param keeps its full shape (the C++ engine's
modules need it), but its memory is released: only this rank's shard
exists, in the engine, and touching the released pages stops the process
(memory/release_guard.h: libtorch has no hook that could make the C++ read
an exception). DeepSpeed's params hold empty tensors there instead, so
scripts written for it read them without harm: a norm logged at rest is 0,
`copy.deepcopy(model)` copies empty params.

Each stage-3 param (the engine's and zero.Init's) becomes a
`PartitionedParameter`, whose `__torch_function__` runs every torch call
that has a released one among its arguments on an empty tensor of its dtype
and device in its place, and warns once per process, naming it. What reads
no values passes untouched: the metadata (shape, dtype, device, numel,
requires_grad, grad, storage pointers) and a conversion that gives the
param itself back (`.to(its device)`, `.float()` of an fp32 param: torch's
own rule, tried on the stand-in). Gathered params (in the engine's forward
and backward, inside GatheredParameters) are whole and pass untouched.
Calls from C++ never come here, nor does `Tensor.set_`; a compiled forward
is traced without this guard. Read params from the training thread: the
check and the read are not one atomic step.

`param.data = value` keeps the engine's storage: inside GatheredParameters
a value of the param's shape, dtype and device is copied into it (DeepSpeed
keeps such a write); anything else is refused naming the param, nothing
changed -- so are `model.half()` and `model.to("cuda")` after initialize,
which torch's `Module._apply` writes back through `param.data`. A deep copy
is a plain `nn.Parameter` of the values read now. A param whose class is
a Parameter subclass of its own (bitsandbytes', torchao's) is left as it
is: read released, it still stops the process, naming it.
"""
import copy
import warnings

import torch

from .. import _C

_DATA = torch._C.TensorBase.__dict__["data"]

# Attributes that read no values. Any other getter (`.T`, `.mT`, `.H`,
# `.real`, `__cuda_array_interface__`, ...) is a view or a read: the stand-in's.
_METADATA_ATTRS = frozenset({
    "shape", "dtype", "device", "layout", "ndim", "names", "name", "itemsize", "nbytes", "requires_grad", "grad",
    "_grad", "grad_fn", "_grad_fn", "grad_dtype", "is_leaf", "retains_grad", "output_nr", "_version",
    "_backward_hooks", "_post_accumulate_grad_hooks", "_base", "_cdata", "_python_dispatch",
    "_has_symbolic_sizes_strides", "volatile", "is_cpu", "is_cuda", "is_ipu", "is_maia", "is_meta", "is_mkldnn",
    "is_mps", "is_mtia", "is_nested", "is_quantized", "is_sparse", "is_sparse_csr", "is_vulkan", "is_xla", "is_xpu"})

# Calls that read no values: they run on the param itself even when released.
_METADATA = frozenset(getattr(torch.Tensor, name) for name in (
    "size", "dim", "numel", "nelement", "element_size", "stride", "storage_offset", "is_contiguous", "data_ptr",
    "untyped_storage", "storage", "_typed_storage", "get_device", "is_floating_point", "is_complex", "is_signed",
    "__hash__", "requires_grad_", "register_hook", "register_post_accumulate_grad_hook", "retain_grad", "_is_view",
    "is_shared", "is_pinned", "is_set_to", "__len__", "__setstate__", "__reduce_ex__"))

# Conversions: torch gives back the tensor itself when there is nothing to change.
_CONVERSIONS = frozenset(getattr(torch.Tensor, name) for name in (
    "to", "cpu", "cuda", "float", "half", "bfloat16", "double", "type", "type_as", "contiguous"))

_warned = False


def _released(t):
    return isinstance(t, PartitionedParameter) and _C.released(t)


def _name(p):
    return getattr(p, "_zero_cpp_name", None) or f"ds_id {getattr(p, 'ds_id', '?')} of shape {tuple(p.shape)}"


def _stand_in(p):
    return torch.empty(0, dtype=p.dtype, device=p.device)


def _values_now(p):
    """What reading `p` gives now, with no warning: its stand-in while
    released, else its data."""
    return _stand_in(p) if _C.released(p) else _run(_DATA.__get__, (), (p,), {})


def _swap(value, found):
    """`value` with each released param in it (inside lists and tuples, at
    any depth) replaced by its empty stand-in; the params replaced go to `found`."""
    if _released(value):
        found.append(value)
        return _stand_in(value)
    if type(value) in (list, tuple) and _any_released(value):
        return type(value)(_swap(v, found) for v in value)
    return value


def _refuse(p, what):
    raise RuntimeError(
        f"zero_cpp: stage 3: {what} of '{_name(p)}' is refused (the engine's param would lose its storage; nothing "
        "was changed). Change a param's values in place (`p.data.copy_(x)`, `p.copy_(x)`) inside `with "
        "deepspeed.zero.GatheredParameters(params, modifier_rank=0):` on every rank, or through "
        "deepspeed.utils.safe_set_full_fp32_param; cast or move the model before deepspeed.initialize")


class PartitionedParameter(torch.nn.Parameter):
    """A stage-3 param (module docstring): an `nn.Parameter` that, released,
    reads as an empty tensor, as DeepSpeed's does at rest."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        # torch.compile traces the model's ops, not this guard (dynamo cannot
        # trace the C++ check): a compiled forward runs with its units gathered.
        if torch.compiler.is_compiling():
            with torch._C.DisableTorchFunctionSubclass():  # what dynamo traces; the result a plain tensor
                return func(*args, **kwargs)
        # The common case first, and cheap: every param gathered (a forward).
        if func in _METADATA:
            return _run(func, types, args, kwargs)
        if _is_descriptor(func):
            return _attribute(func, types, args, kwargs)
        if _any_released(args) or (kwargs and _any_released(kwargs.values())):
            return _at_rest(func, types, args, kwargs)
        return _run(func, types, args, kwargs)

    def __repr__(self):
        # Torch's own layout for a Parameter (a subclass's repr would wrap it
        # in the class name); released, the stand-in's, with no warning.
        return torch.nn.Parameter.__repr__(torch.nn.Parameter(_values_now(self), self.requires_grad))

    def __deepcopy__(self, memo):
        # A copy (a reference model, an EMA) is a plain Parameter of the
        # values read now (empty at rest, whole inside GatheredParameters).
        if id(self) in memo:
            return memo[id(self)]
        result = torch.nn.Parameter(_values_now(self).clone(memory_format=torch.preserve_format), self.requires_grad)
        memo[id(self)] = result
        result.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return result


_run = torch._C._disabled_torch_function_impl  # nn.Parameter's own: the call, its result a plain tensor
_released_now = _C.released


def _any_released(values):
    for v in values:
        if type(v) is PartitionedParameter:
            if _released_now(v):
                return True
        elif type(v) in (list, tuple) and _any_released(v):
            return True
    return False


def _is_descriptor(func):
    return getattr(func, "__name__", "") in ("__get__", "__set__", "__delete__") and hasattr(func, "__self__")


def _attribute(func, types, args, kwargs):
    """A getter or setter of one of TensorBase's attributes on a param."""
    p, descriptor = args[0], func.__self__
    if descriptor is _DATA and func.__name__ == "__set__":
        return _assign_data(func, types, args, kwargs)
    if func.__name__ != "__get__" or getattr(descriptor, "__name__", None) in _METADATA_ATTRS or not _released(p):
        return _run(func, types, args, kwargs)  # shape, dtype, grad, requires_grad, ...; or whole now
    _warn(p)  # .data, .T, .mT, .H, .real ... at rest: the stand-in's
    return _run(func, types, (_stand_in(p),) + tuple(args[1:]), kwargs)


def _assign_data(func, types, args, kwargs):
    """`p.data = value`: the engine's param must keep its storage, so a value
    of the same shape, dtype and device is copied into it while the param is
    whole (inside GatheredParameters; DeepSpeed keeps such a write), and the
    rest is refused, naming the param."""
    p, value = args[0], args[1]
    if value is p:
        return _run(func, types, args, kwargs)  # p.data = p (Module._apply after a no-op conversion)
    if _released(p):
        _refuse(p, "assigning .data (as model.half(), model.to(another device or dtype) and "
                   "load_state_dict(assign=True) do) outside GatheredParameters")
    if not (isinstance(value, torch.Tensor) and value.shape == p.shape and value.dtype == p.dtype and
            value.device == p.device):
        _refuse(p, f"assigning .data of another shape, dtype or device ({tuple(getattr(value, 'shape', ()))}, "
                   f"{getattr(value, 'dtype', type(value).__name__)})")
    with torch.no_grad():
        _run(torch.Tensor.copy_, types, (p, value), {})


def _at_rest(func, types, args, kwargs):
    """`func` called with a released param among its arguments: run on the
    stand-ins, unless it is a conversion that gives the param itself back."""
    if func in _CONVERSIONS and _released(args[0]):
        probe = _stand_in(args[0])
        result = func(probe, *args[1:], **kwargs)  # torch's own rule, on a tensor of the same dtype and device
        if result is probe or not isinstance(result, torch.Tensor):
            return _run(func, types, args, kwargs)  # the param itself, or its type's name: nothing read
        _warn(args[0])
        return result
    found = []
    args = tuple(_swap(a, found) for a in args)
    kwargs = {k: _swap(v, found) for k, v in kwargs.items()}
    _warn(found[0])
    return _run(func, types, args, kwargs)


def _warn(p):
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"zero_cpp: stage 3: '{_name(p)}' was read outside deepspeed.zero.GatheredParameters, where it is "
            "sharded and released: it reads as an empty tensor, as DeepSpeed's params do at rest (said once). "
            "Read full params inside `with deepspeed.zero.GatheredParameters(params):` on every rank, or take "
            "engine.consolidated_fp32_state_dict()", stacklevel=4)


def mark(params):
    """Make each of `params` a PartitionedParameter, in place: the same
    object, its class changed (a subclass of nn.Parameter of the user's own
    is left as it is)."""
    for p in params:
        if type(p) is torch.nn.Parameter:
            p.__class__ = PartitionedParameter


def name(named_params):
    """The names the warning and the errors give, from (name, param) pairs."""
    for n, p in named_params:
        if isinstance(p, PartitionedParameter) and not hasattr(p, "_zero_cpp_name"):
            p._zero_cpp_name = n
