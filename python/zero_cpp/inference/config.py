"""DeepSpeed's inference config (`deepspeed.inference.config.
DeepSpeedInferenceConfig`): the keys of `init_inference(model, config,
**kwargs)`, DeepSpeed 0.19.8's names, aliases and defaults, read the way
its config model reads them (an unknown key is an error).

What each key does here is in docs/from-deepspeed.md ("Inference"): the
model runs as written, in `dtype`, on this rank's device. The keys that ask
for DeepSpeed's own kernels or tensor parallelism are accepted and do
nothing to the results' meaning; those that would need what zero_cpp does
not have (DeepSpeed's inference checkpoints, int8 kernels, Triton) are
errors naming the key.
"""
import copy
import json
from types import SimpleNamespace

import torch

from ..config import _ConfigValueError

# name -> (default, aliases). Nested blocks are dicts of their own defaults.
_TP = {"enabled": True, "tp_size": 1, "tp_grain_size": 64, "mpu": None, "tp_group": None}
_MOE = {"enabled": True, "ep_size": 1, "moe_experts": [1], "type": "standard", "ep_mp_group": None,
        "ep_group": None}
_MOE_ALIASES = {"num_experts": "moe_experts", "expert_group": "ep_group"}
_QUANT_PART = {"enabled": True, "num_bits": 8, "q_type": "symmetric", "q_groups": 1}
_QUANT = {"enabled": True, "activation": dict(_QUANT_PART), "qkv": {"enabled": True},
          "weight": dict(_QUANT_PART, quantized_initialization={}, post_init_quant={})}
_CHECKPOINT = {"checkpoint_dir": None, "save_mp_checkpoint_path": None, "base_dir": None}

_KEYS = {
    "replace_with_kernel_inject": (False, ("kernel_inject",)),
    "dtype": (torch.float16, ()),
    "tensor_parallel": (_TP, ("tp",)),
    "enable_cuda_graph": (False, ()),
    "use_triton": (False, ()),
    "triton_autotune": (False, ()),
    "zero": ({}, ()),
    "triangular_masking": (True, ("tm",)),
    "moe": (_MOE, ()),
    "keep_module_on_host": (False, ()),
    "quant": (_QUANT, ()),
    "checkpoint": (None, ()),
    "base_dir": ("", ()),
    "set_empty_params": (False, ()),
    "save_mp_checkpoint_path": (None, ()),
    "checkpoint_config": (_CHECKPOINT, ("ckpt_config",)),
    "return_tuple": (True, ()),
    "training_mp_size": (1, ()),
    "replace_method": ("auto", ()),
    "injection_policy": (None, ("injection_dict",)),
    "injection_policy_tuple": (None, ()),
    "config": (None, ("args",)),
    "max_out_tokens": (1024, ("max_tokens",)),
    "min_out_tokens": (1, ("min_tokens",)),
    "transposed_mode": (False, ()),
    # Deprecated there, each moved into a block (DeepSpeed copies them across as here).
    "mp_size": (1, ()),
    "mpu": (None, ()),
    "ep_size": (1, ()),
    "ep_group": (None, ("expert_group",)),
    "ep_mp_group": (None, ("expert_mp_group",)),
    "moe_experts": ([1], ()),
    "moe_type": ("standard", ()),
}
_ALIAS = {alias: name for name, (_, aliases) in _KEYS.items() for alias in aliases}

# DeepSpeed's deprecated top-level keys -> the block key that replaced each.
_DEPRECATED = {"mp_size": ("tensor_parallel", "tp_size"), "mpu": ("tensor_parallel", "mpu"),
               "ep_size": ("moe", "ep_size"), "ep_group": ("moe", "ep_group"), "ep_mp_group": ("moe", "ep_mp_group"),
               "moe_experts": ("moe", "moe_experts"), "moe_type": ("moe", "type")}

# DeepSpeed's names for its dtypes.
_DTYPES = {torch.float16: ("torch.float16", "fp16", "float16", "half"),
           torch.float32: ("torch.float32", "fp32", "float32", "float"),
           torch.bfloat16: ("torch.bfloat16", "bf16", "bfloat16", "bfloat"),
           torch.int8: ("torch.int8", "int8")}


def _error(message):
    return _ConfigValueError(f"zero_cpp init_inference: {message}")


def _dtype(value):
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        for dtype, names in _DTYPES.items():
            if value in names:
                return dtype
        raise _error(f"dtype '{value}' is not one of {sorted(n for names in _DTYPES.values() for n in names)}")
    raise TypeError(f"zero_cpp init_inference: dtype must be a torch.dtype or its name, not {type(value).__name__}")


_TRUE, _FALSE = ("true", "yes", "on", "1", "t", "y"), ("false", "no", "off", "0", "f", "n")


def _typed(name, value, default):
    """`value` as the type of `default` (a bool or an int), taking what
    DeepSpeed's config model takes in their place ("2", 2.0, "yes")."""
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise _error(f"'{name}' must be true or false, not {value!r}")
    if isinstance(default, int):
        try:
            number = float(value) if isinstance(value, str) else value
            if isinstance(number, bool) or not isinstance(number, (int, float)) or number != int(number):
                raise ValueError
            return int(number)
        except (TypeError, ValueError):
            raise _error(f"'{name}' must be an integer, not {value!r}") from None
    return value


def _block(name, given, defaults, aliases=None):
    """A nested block: its defaults overlaid with what was given ("auto"
    meaning the default, as DeepSpeed's reads it), unknown keys refused."""
    if isinstance(given, SimpleNamespace):
        given = vars(given)
    if not isinstance(given, dict):
        raise _error(f"'{name}' must be a dict, not {type(given).__name__}")
    out = copy.deepcopy(defaults)
    for key, value in given.items():
        key = (aliases or {}).get(key, key)
        if key not in defaults:
            raise _error(f"'{name}.{key}' is not a key of DeepSpeed's inference config "
                         f"(its keys: {', '.join(sorted(defaults))})")
        if value == "auto":
            continue
        if isinstance(defaults[key], dict) and defaults[key]:
            value = _block(f"{name}.{key}", value, defaults[key])
        out[key] = _typed(f"{name}.{key}", value, defaults[key])
    return out


def _namespace(block, defaults):
    """The blocks with defaults of their own as attributes; every other
    value (zero, config, injection_policy's {class: layers}) as given."""
    return SimpleNamespace(**{k: _namespace(v, defaults[k]) if isinstance(defaults.get(k), dict) and defaults[k]
                              else v for k, v in block.items()})


class DeepSpeedInferenceConfig:
    """`DeepSpeedInferenceConfig(**keys)`: every key DeepSpeed's takes,
    as attributes (`config.dtype`, `config.tensor_parallel.tp_size`)."""

    def __init__(self, **given):
        values = {name: copy.deepcopy(default) for name, (default, _) in _KEYS.items()}
        named = {}  # the keys given, by their names (not aliases), "auto" left out
        for key, value in given.items():
            name = _ALIAS.get(key, key)
            if name not in _KEYS:
                raise _error(f"'{key}' is not a key of DeepSpeed's inference config "
                             f"(its keys: {', '.join(sorted(_KEYS))})")
            if isinstance(value, str) and value == "auto":
                continue
            default = _KEYS[name][0]
            if name == "moe" and isinstance(value, bool):
                value = {"enabled": value}
            if isinstance(default, dict) and default:
                value = _block(name, value, default, _MOE_ALIASES if name == "moe" else None)
            values[name] = _typed(name, value, default)
            named[name] = value
        values["dtype"] = _dtype(values["dtype"])
        if values["max_out_tokens"] <= 0:
            raise _error(f"max_out_tokens must be greater than 0, not {values['max_out_tokens']}")
        # The deprecated keys, moved into their blocks as DeepSpeed moves them
        # (refused beside the key that replaces them).
        for old, (block, key) in _DEPRECATED.items():
            if old not in named:
                continue
            if block in named and key in (named[block] if isinstance(named[block], dict) else {}):
                raise AssertionError(f"zero_cpp init_inference: '{old}' is DeepSpeed's deprecated name for "
                                     f"'{block}.{key}': give one of them")
            values[block][key] = values[old]
        self.__dict__.update(vars(_namespace(values, {name: default for name, (default, _) in _KEYS.items()})))
        self._given = dict(given)

    def dict(self):
        """The config as a dict (DeepSpeed's pydantic `.dict()`: the dtype by its name)."""
        def plain(v):
            return {k: plain(x) for k, x in vars(v).items()} if isinstance(v, SimpleNamespace) else v
        out = {k: plain(v) for k, v in self.__dict__.items() if not k.startswith("_")}
        out["dtype"] = str(self.dtype)
        return out

    model_dump = dict

    def __repr__(self):
        return " ".join(f"{k}={v!r}" for k, v in self.dict().items())


def merge(config, kwargs):
    """init_inference's `config` (None, a dict, or a JSON file's path) with
    its keyword arguments over it; a key given both ways with two values is
    an error, as under DeepSpeed."""
    if config is None:
        config = {}
    if isinstance(config, str):
        with open(config) as f:
            config = json.load(f)
    elif not isinstance(config, dict):
        raise ValueError(f"zero_cpp init_inference: config must be a dict or a JSON file's path, "
                         f"not {type(config).__name__}")
    for key in set(config).intersection(kwargs):
        if config[key] != kwargs[key]:
            raise ValueError(f"zero_cpp init_inference: '{key}' is {config[key]!r} in the config and "
                             f"{kwargs[key]!r} as a keyword argument")
    return dict(config, **kwargs)
