"""torch.load of DeepSpeed's pickles without DeepSpeed: its classes in
them (loss scalers, the ZeRO stage enum, fragment addresses) come back as
stand-ins holding their attributes, which is all a conversion reads, so
reading a checkpoint does not need the DeepSpeed that wrote it."""
import pickle
import types

import torch

from .errors import DeepSpeedCheckpointError


class DeepSpeedObject:
    """A DeepSpeed object: its attributes, or an enum's value (`args`)."""

    def __init__(self, *args):
        self.args = args

    def __setstate__(self, state):
        if isinstance(state, tuple):  # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        self.__dict__.update(state)


_stand_ins = {}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "deepspeed" or module.startswith("deepspeed."):
            key = f"{module}.{name}"
            if key not in _stand_ins:
                _stand_ins[key] = type(name, (DeepSpeedObject,), {"__module__": module})
            return _stand_ins[key]
        return super().find_class(module, name)


# torch.load's pickle_module: its own unpickler subclasses this one's.
_pickle_without_deepspeed = types.ModuleType("pickle_without_deepspeed")
_pickle_without_deepspeed.Unpickler = _Unpickler
_pickle_without_deepspeed.load = lambda f, **kw: _Unpickler(f, **kw).load()


def load(path):
    # Memory-mapped: a param's elements are read when it is converted.
    # Unpickling runs what the file names, as DeepSpeed's own load does:
    # convert only checkpoints from a source you trust.
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=False,
                          pickle_module=_pickle_without_deepspeed)
    except Exception as e:  # torch's errors do not always name the file
        raise DeepSpeedCheckpointError(f"cannot read {path}: {type(e).__name__}: {e}") from e
