"""DeepSpeed's `torch_autocast` (`deepspeed.runtime.torch_autocast`): the
params, grads and optimizer stay fp32 and the engine's forward runs under
`torch.autocast` in the config's dtype:

    "torch_autocast": {"enabled": true, "dtype": "bfloat16",
                       "lower_precision_safe_modules": ["torch.nn.modules.linear.Linear"]}

DeepSpeed reduces the grads of the lower-precision-safe modules' params
(Linear and Conv by default) in the autocast dtype; zero_cpp reduces every
grad in fp32 (the C++ engine has one wire dtype per engine), so losses
agree with DeepSpeed's to the bf16 roundings of those reductions (1e-4 to
7e-4 relative over tens of steps; exactly with no safe modules). The module list is checked and
reported as DeepSpeed's is. A float16 autocast needs torch's GradScaler,
which zero_cpp does not run: refused, naming bfloat16 and the fp16 block.
"""
import contextlib
import importlib

import torch

from .. import config as configs
from ..utils.logging import logger

LOWER_PRECISION_SAFE_MODULES = [torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d]

# DeepSpeed's DtypeEnum spellings.
_DTYPES = {name: dtype for dtype, names in (
    (torch.float16, ("torch.float16", "fp16", "float16", "half")),
    (torch.float32, ("torch.float32", "fp32", "float32", "float")),
    (torch.int8, ("torch.int8", "int8")),
    (torch.bfloat16, ("torch.bfloat16", "bf16", "bfloat16"))) for name in names}

_warned_nested = False


def get_default_autocast_lower_precision_modules():
    return [f"{cls.__module__}.{cls.__name__}" for cls in LOWER_PRECISION_SAFE_MODULES]


class AutocastSettings:
    """The config's torch_autocast block, checked: `enabled`, `dtype` (a
    torch dtype; unset: torch's default for the device) and
    `lower_precision_safe_modules` (class paths; unset: DeepSpeed's)."""

    def __init__(self, block, device_type):
        self.enabled = bool(block["enabled"])
        self.device_type = device_type
        given = block["dtype"]
        if given is not None and given not in _DTYPES:
            raise configs._ConfigValueError(f"Invalid dtype for torch autocast: {given}")
        self.dtype = _DTYPES.get(given) if given is not None else None
        names = block["lower_precision_safe_modules"]
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise configs._ConfigValueError(f"Invalid module names for torch autocast: {names}. Expected list of "
                                            "strings.")
        self.lower_precision_safe_modules = names
        if not self.enabled:
            return
        for name in names or []:
            try:
                package, cls = name.rsplit(".", 1)
                getattr(importlib.import_module(package), cls)
            except Exception as e:  # noqa: BLE001 -- DeepSpeed's error, naming the module
                raise configs._ConfigValueError(f"Failed to import lower precision safe module {name}: {e}") from None
        if (self.dtype or torch.get_autocast_dtype(device_type)) == torch.float16:
            raise configs.DeepSpeedConfigError(
                "ds_config: torch_autocast in float16 needs torch's GradScaler, which zero_cpp does not run: set "
                "torch_autocast.dtype to bfloat16, or use the fp16 block (the engine's dynamic loss scaling)")

    def safe_modules(self):
        names = self.lower_precision_safe_modules
        return get_default_autocast_lower_precision_modules() if names is None else list(names)


@contextlib.contextmanager
def autocast_if_enabled(engine):
    """The engine's forward under the config's autocast, as DeepSpeed's: an
    autocast the script opened around it gives way to the config's, or,
    with torch_autocast off, is turned off (the bf16/fp16 blocks deciding).
    As DeepSpeed's, the outer autocast is found by torch.is_autocast_enabled()
    -- CUDA's -- so on the CPU a script's own autocast stays in force."""
    global _warned_nested
    settings = engine._autocast
    outer = torch.is_autocast_enabled()
    if outer and not _warned_nested:
        if engine.global_rank == 0:
            logger.info("torch.autocast is already enabled outside the engine: the forward follows the config's "
                        "torch_autocast section" if settings.enabled else
                        "torch.autocast is enabled outside the engine but torch_autocast is off: the forward runs "
                        "without it (the bf16/fp16 blocks decide the precision)")
        _warned_nested = True
    if settings.enabled:
        with torch.autocast(device_type=settings.device_type, dtype=settings.dtype, enabled=True):
            yield
    elif outer:
        with torch.autocast(device_type=settings.device_type, enabled=False):
            yield
    else:
        yield
