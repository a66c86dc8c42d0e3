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
requires_grad, grad, storage pointers) and a conversion that returns the
param itself (`.to(its device)`, `.float()` of an fp32 param). Gathered
params (in the engine's forward and backward, inside GatheredParameters)
are whole and pass untouched too. Calls from C++ never come here.

Assigning `param.data` of a released param is refused rather than run: the
engine's param would lose its storage. Torch's `Module._apply` assigns it
when a conversion changes the params (`model.half()`, `model.to("cuda")`
after initialize), so those are refused too, naming the param.
"""
import warnings

import torch

from .. import _C

_DATA = torch._C.TensorBase.__dict__["data"]

# Calls that read no values: they run on the param itself even when released.
_METADATA = frozenset(getattr(torch.Tensor, name) for name in (
    "size", "dim", "numel", "nelement", "element_size", "stride", "storage_offset", "is_contiguous", "data_ptr",
    "untyped_storage", "storage", "_typed_storage", "get_device", "is_floating_point", "is_complex", "is_signed",
    "__hash__", "requires_grad_", "register_hook", "register_post_accumulate_grad_hook", "retain_grad", "_is_view",
    "is_shared", "is_pinned", "is_set_to", "__len__", "__setstate__", "__reduce_ex__"))

# Conversions: torch returns the param itself when nothing changes.
_CONVERSIONS = frozenset(getattr(torch.Tensor, name) for name in (
    "to", "cpu", "cuda", "float", "half", "bfloat16", "double", "type", "type_as", "contiguous"))

_warned = False


def _is_descriptor(func, *names):
    return getattr(func, "__name__", "") in names and hasattr(func, "__self__")


def _released(t):
    return isinstance(t, PartitionedParameter) and _C.released(t)


def _name(p):
    return getattr(p, "_zero_cpp_name", None) or f"ds_id {getattr(p, 'ds_id', '?')} of shape {tuple(p.shape)}"


def _stand_in(p):
    return torch.empty(0, dtype=p.dtype, device=p.device)


def _swap(value, found):
    """`value` with each released param in it (inside lists and tuples too)
    replaced by its empty stand-in; the params replaced go to `found`."""
    if _released(value):
        found.append(value)
        return _stand_in(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, PartitionedParameter) for v in value):
        return type(value)(_swap(v, found) for v in value)
    return value


def _refuse(p, what):
    raise RuntimeError(
        f"zero_cpp: stage 3: '{_name(p)}' is sharded and released outside deepspeed.zero.GatheredParameters, so "
        f"{what} is refused (the engine's param would lose its storage; nothing was changed). Change params inside "
        "`with deepspeed.zero.GatheredParameters(params, modifier_rank=0):` on every rank, or through "
        "deepspeed.utils.safe_set_full_fp32_param; cast or move the model before deepspeed.initialize")


class PartitionedParameter(torch.nn.Parameter):
    """A stage-3 param (module docstring): an `nn.Parameter` that, released,
    reads as an empty tensor, as DeepSpeed's does at rest."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # The common case first, and cheap: every param gathered (a forward).
        if kwargs is None:
            kwargs = {}
        if func not in _METADATA and (_any_released(args) or (kwargs and _any_released(kwargs.values()))):
            return _at_rest(func, types, args, kwargs)
        return _run(func, types, args, kwargs)

    def __repr__(self):
        # Torch's own layout for a Parameter (a subclass's repr would wrap it in the class name).
        return torch.nn.Parameter.__repr__(torch.nn.Parameter(self.data, self.requires_grad))


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


def _at_rest(func, types, args, kwargs):
    """`func` called with a released param among its arguments."""
    if _is_descriptor(func, "__get__", "__set__", "__delete__"):
        if func.__self__ is not _DATA or not _released(args[0]):
            return _run(func, types, args, kwargs)  # shape, dtype, grad, requires_grad, ...
        if func.__name__ != "__get__":
            if len(args) > 1 and args[1] is args[0]:
                return _run(func, types, args, kwargs)  # p.data = p (Module._apply after a no-op conversion)
            _refuse(args[0], "assigning its .data (as model.half(), model.to(another device or dtype) and "
                             "load_state_dict(assign=True) do)")
        # p.data: the stand-in, as below.
    elif func in _CONVERSIONS and _released(args[0]) and _returns_itself(func, args, kwargs):
        return _run(func, types, args, kwargs)  # nothing read
    found = []
    args = tuple(_swap(a, found) for a in args)
    kwargs = {k: _swap(v, found) for k, v in kwargs.items()}
    _warn(found[0])
    return _run(func, types, args, kwargs)


_FIXED_DTYPE = {torch.Tensor.float: torch.float32, torch.Tensor.half: torch.float16,
                torch.Tensor.bfloat16: torch.bfloat16, torch.Tensor.double: torch.float64}


def _returns_itself(func, args, kwargs):
    """Whether conversion `func(*args, **kwargs)` of a param gives back the
    param itself (torch's rule: nothing to change, no copy asked)."""
    p, rest = args[0], args[1:]
    dtype = device = None
    if func in _FIXED_DTYPE:
        dtype = _FIXED_DTYPE[func]
    elif func is torch.Tensor.cpu:
        device = torch.device("cpu")
    elif func is torch.Tensor.cuda:
        device = torch.device("cuda", torch.cuda.current_device()) if not rest and "device" not in kwargs \
            else torch.device("cuda", kwargs.get("device", rest[0] if rest else None))
    elif func is torch.Tensor.to:
        if kwargs.get("copy") or (len(rest) > 0 and rest[-1] is True and isinstance(rest[0], torch.dtype)):
            return False
        device, dtype, _, _ = torch._C._nn._parse_to(*rest, **{k: v for k, v in kwargs.items() if k != "copy"})
    elif func is torch.Tensor.type_as:
        dtype, device = rest[0].dtype, rest[0].device
    elif func is torch.Tensor.type:
        if not rest and "dtype" not in kwargs:
            return True  # its name: metadata
        return False
    elif func is torch.Tensor.contiguous:
        return p.is_contiguous(**kwargs) if not rest else p.is_contiguous(memory_format=rest[0])
    if dtype is not None and dtype != p.dtype:
        return False
    if device is not None:
        device = torch.device(device)
        if device.type != p.device.type or (device.index is not None and device.index != p.device.index):
            return False
    return True


def _warn(p):
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"zero_cpp: stage 3: '{_name(p)}' was read outside deepspeed.zero.GatheredParameters, where it is "
            "sharded and released: it reads as an empty tensor, as DeepSpeed's params do at rest (said once). "
            "Read full params inside `with deepspeed.zero.GatheredParameters(params):` on every rank, or take "
            "engine.consolidated_fp32_state_dict()", stacklevel=3)


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
