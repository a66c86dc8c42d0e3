"""Inside zero.GatheredParameters, moving a gathered host param (or a view
of it) to the host copies it, as moving a GPU param there does.

DeepSpeed scripts are written for GPUs, where `v.data.cpu()` inside the
block is a copy that outlives it (DeepSpeed-Chat's export of a stage-3
model). On the host torch returns the tensor itself: a view of pages the
block's end releases, which would stop the process when read. So while a
block holds host params gathered, `Tensor.cpu()` and `Tensor.to(<the
host>)` of a tensor in one of their buffers return a copy; every other call
(another tensor, a dtype cast, an in-place write through the param) is
torch's own, and torch's methods are put back when the last block ends.
"""
import threading

import torch

_lock = threading.Lock()
_gathered = {}  # a gathered buffer's address -> how many open blocks hold it
_torch_methods = None  # (Tensor.cpu, Tensor.to) while patched


def buffers_of(params):
    """The host buffers `params` live in now (gathered: their full values)."""
    out = set()
    for p in params:
        if p.device.type == "cpu" and p.numel() > 0:
            out.add(p.untyped_storage().data_ptr())
    return out


def hold(buffers):
    """From now until release(buffers): host moves of tensors in `buffers` copy."""
    global _torch_methods
    if not buffers:
        return
    with _lock:
        for b in buffers:
            _gathered[b] = _gathered.get(b, 0) + 1
        if _torch_methods is None:
            _torch_methods = (torch.Tensor.cpu, torch.Tensor.to)
            torch.Tensor.cpu = _copying(_torch_methods[0], lambda args, kwargs: True)
            torch.Tensor.to = _copying(_torch_methods[1], _to_host)


def release(buffers):
    global _torch_methods
    if not buffers:
        return
    with _lock:
        for b in buffers:
            _gathered[b] -= 1
            if _gathered[b] == 0:
                del _gathered[b]
        if not _gathered and _torch_methods is not None:
            # Put torch's back unless another library patched over ours meanwhile (then it keeps its own).
            if getattr(torch.Tensor.cpu, "_zero_cpp_host_copy", False):
                torch.Tensor.cpu = _torch_methods[0]
            if getattr(torch.Tensor.to, "_zero_cpp_host_copy", False):
                torch.Tensor.to = _torch_methods[1]
            _torch_methods = None


def _in_gathered_buffer(t):
    try:
        return t.untyped_storage().data_ptr() in _gathered
    except (RuntimeError, NotImplementedError):  # no storage (sparse, nested, functional)
        return False


def _copying(method, moves_to_host):
    def move(self, *args, **kwargs):
        out = method(self, *args, **kwargs)
        if out is self and moves_to_host(args, kwargs) and _in_gathered_buffer(self):
            return self.clone()
        return out
    move.__doc__ = method.__doc__
    move._zero_cpp_host_copy = True
    return move


def _to_host(args, kwargs):
    """Whether a `Tensor.to(...)` call names the host as its device."""
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, torch.Tensor):
        return target.device.type == "cpu"
    if isinstance(target, (str, torch.device)):
        return torch.device(target).type == "cpu"
    return False
