"""DeepSpeed's `deepspeed.OnDevice` (`deepspeed.utils.OnDevice`): build a
model with its tensors made straight on a device and in a dtype.

    with deepspeed.OnDevice(dtype=torch.float16, device="meta"):
        model = MyModel()        # no memory taken: load or to_empty() later

Inside the block the tensors torch's layers make their params and buffers
with -- `torch.empty`, `zeros`, `ones` and `full`, as DeepSpeed's does --
land on `device` unless the call names one, and a floating-point result is
cast to `dtype` before the layer initialises it (so a layer's init draws
run in that dtype, as under DeepSpeed). Tensors made otherwise (`randn`,
`arange`, `torch.tensor`) keep torch's defaults, as they do there.

Where DeepSpeed replaces those functions in the `torch` module for every
thread, this is a torch function mode: it holds on the thread that entered
it. DeepSpeed's also changes the legacy `torch.Tensor(...)` constructor;
this one does not.
"""
import torch
from torch.overrides import TorchFunctionMode

# The factories DeepSpeed's OnDevice redirects: those torch.nn's layers make their tensors with.
_FACTORIES = frozenset({torch.empty, torch.zeros, torch.ones, torch.full})


class _OnDeviceMode(TorchFunctionMode):
    def __init__(self, device, dtype):
        super().__init__()
        self.device, self.dtype = device, dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func not in _FACTORIES:
            return func(*args, **kwargs)
        if kwargs.get("device") is None:
            kwargs["device"] = self.device
        tensor = func(*args, **kwargs)
        if self.dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(self.dtype)
        return tensor


class OnDevice:
    """Make the tensors of the modules built inside the block on `device`
    (default "meta": no memory) in floating-point `dtype`; `enabled=False`
    makes the block do nothing."""

    def __init__(self, dtype, device="meta", enabled=True):
        self.dtype, self.device, self.enabled = dtype, device, enabled
        self._modes = []  # one per entry not yet left: the same object may be entered again, nested

    def __enter__(self):
        if self.enabled:
            mode = _OnDeviceMode(self.device, self.dtype)
            mode.__enter__()
            self._modes.append(mode)
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        if self.enabled and self._modes:
            self._modes.pop().__exit__(exc_type, exc_value, traceback)
        return False
