"""The ds_config as the engine gets it: from a dict, a path or
`args.deepspeed_config`, validated by the C++ parser (every key of DeepSpeed
0.19.8 honoured, accepted at its default, or refused by name), with what a
Python front end adds: the optimizer given in code, and DeepSpeed's
precision semantics (a bf16/fp16 model computes in that dtype)."""
import copy
import json
import os

import torch

from . import _C


class DeepSpeedConfigError(Exception):
    """A ds_config that zero_cpp cannot run, with what is wrong."""


class _AssertedConfigError(DeepSpeedConfigError, AssertionError):
    """Where DeepSpeed's check is an `assert` (the batch sizes; where the
    config comes from): a script's `except AssertionError` catches it too."""


class _ConfigValueError(DeepSpeedConfigError, ValueError):
    """Where DeepSpeed's is a ValueError (a config path that is not a file,
    a torch_autocast dtype it does not know)."""


def add_config_arguments(parser):
    """DeepSpeed's `add_config_arguments`: --deepspeed, --deepspeed_config
    (and its old name --deepscale_config) on an argparse parser."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations (zero_cpp)")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (helper flag for user code, no impact on zero_cpp)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true", help=argparse_suppress())
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse_suppress())
    return parser


def argparse_suppress():
    import argparse
    return argparse.SUPPRESS


def _read_text(path):
    if not os.path.exists(path):
        raise _ConfigValueError(f"ds_config: no such file: {path}")
    with open(path) as f:
        return f.read()


def load(args=None, config=None, config_params=None):
    """The config as a dict, from `config` (dict or path), `config_params`
    (DeepSpeed's older name) or `args.deepspeed_config`."""
    if config is None and config_params is not None:
        config = config_params
    if args is not None and getattr(args, "deepscale_config", None) is not None:
        if getattr(args, "deepspeed_config", None) is not None:
            raise DeepSpeedConfigError("both --deepscale_config and --deepspeed_config were given; use one")
        args.deepspeed_config = args.deepscale_config
    from_args = getattr(args, "deepspeed_config", None) if args is not None else None
    if from_args is not None:
        if config is not None:
            raise _AssertedConfigError("a config was given both in args.deepspeed_config and to initialize(); "
                                       "give one")
        config = from_args
    if config is None:
        raise _AssertedConfigError("no ds_config: pass config= (a dict or a path) or args.deepspeed_config")
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if isinstance(config, (str, os.PathLike)):
        text = _read_text(os.fspath(config))
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            # Comments (DeepSpeed reads its files with hjson): the C++
            # parser takes them, and gives the config back as plain JSON.
            return json.loads(parse(text))
    raise DeepSpeedConfigError(f"config must be a dict or a path, got {type(config).__name__}")


def resolve_batch(config, dp_size):
    """(train_batch_size, train_micro_batch_size_per_gpu,
    gradient_accumulation_steps) of an engine config on `dp_size` ranks,
    each derived from the others as DeepSpeed's; what does not add up
    raises naming the sizes (an AssertionError too, as DeepSpeed's)."""
    try:
        return tuple(_C.resolve_batch(for_cxx(config), dp_size))
    except (ValueError, RuntimeError) as e:
        raise _AssertedConfigError(str(e)) from None


def parse(text):
    """The C++ parser's reading of `text`, as JSON; DeepSpeedConfigError
    naming the key at fault."""
    try:
        return _C.parse_config(text)
    except (ValueError, RuntimeError) as e:
        raise DeepSpeedConfigError(str(e)) from None


# The torch dtype of each precision name (precision(), data_types.grad_accum_dtype).
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def precision(config):
    """"bf16", "fp16" or "fp32", as the config enables."""
    for name in ("bf16", "bfloat16"):
        if config.get(name, {}).get("enabled", False):
            return "bf16"
    if config.get("fp16", {}).get("enabled", False):
        return "fp16"
    return "fp32"


def stage(config):
    return int(config.get("zero_optimization", {}).get("stage", 0))


# The blocks the Python front end carries out itself, with DeepSpeed 0.19.8's
# keys and defaults: the C++ engine refuses them (a C++ program has no
# TensorBoard writer, flops profiler, comms logger or deepspeed.checkpointing;
# its CSV monitor writes its own events, the front end DeepSpeed's), so they
# are read here and taken out of what it gets.
PYTHON_BLOCKS = {
    "tensorboard": {"enabled": False, "output_path": "", "job_name": "DeepSpeedJobName"},
    "csv_monitor": {"enabled": False, "output_path": "", "job_name": "DeepSpeedJobName"},
    "wandb": {"enabled": False, "group": None, "team": None, "project": "deepspeed"},
    "comet": {"enabled": False, "samples_log_interval": 100, "project": None, "workspace": None, "api_key": None,
              "experiment_name": None, "experiment_key": None, "online": None, "mode": None},
    "flops_profiler": {"enabled": False, "recompute_fwd_factor": 0.0, "profile_step": 1, "module_depth": -1,
                       "top_modules": 1, "detailed": True, "output_file": None},
    "comms_logger": {"enabled": False, "verbose": False, "prof_all": True, "prof_ops": [], "debug": False},
    "torch_autocast": {"enabled": False, "dtype": None, "lower_precision_safe_modules": None},
    "activation_checkpointing": {"partition_activations": False, "contiguous_memory_optimization": False,
                                 "cpu_checkpointing": False, "number_checkpoints": None,
                                 "synchronize_checkpoint_boundary": False, "profile": False},
}


def python_block(config, name):
    """Block `name` of PYTHON_BLOCKS as the config sets it, DeepSpeed's
    defaults filled in; DeepSpeedConfigError naming a key it does not have."""
    given = config.get(name) or {}
    if not isinstance(given, dict):
        raise DeepSpeedConfigError(f"ds_config: {name} must be an object, got {given!r}")
    defaults = PYTHON_BLOCKS[name]
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise DeepSpeedConfigError(f"ds_config: {name}.{unknown[0]} is not a key of {name} (its keys: "
                                   f"{', '.join(defaults)})")
    return dict(defaults, **given)


# zero_optimization.leaf_module: z3 leaves chosen by the config (Python
# classes and module names, which the C++ engine cannot match: the front end
# marks them itself). DeepSpeed 0.19.8's defaults: Hugging Face's sparse MoE
# blocks, whose experts run in a data-dependent order.
LEAF_MODULE_DEFAULTS = {
    "classes": ["transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
                "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
                "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock"],
    "names": [],
    "name_suffixes": [],
}


def leaf_module(config):
    """zero_optimization.leaf_module as DeepSpeed reads it: each of
    `classes` (class names, bare or fully qualified), `names` and
    `name_suffixes` (of named_modules()) a list (a string is one), repeats
    dropped, DeepSpeed's defaults where the config is silent."""
    given = (config.get("zero_optimization") or {}).get("leaf_module") or {}
    if not isinstance(given, dict):
        raise DeepSpeedConfigError(f"ds_config: zero_optimization.leaf_module must be an object with classes, "
                                   f"names, name_suffixes; got {given!r}")
    unknown = sorted(set(given) - set(LEAF_MODULE_DEFAULTS))
    if unknown:
        raise DeepSpeedConfigError(f"ds_config: zero_optimization.leaf_module.{unknown[0]} is not a key of "
                                   f"leaf_module (its keys: {', '.join(LEAF_MODULE_DEFAULTS)})")
    out = {}
    for key, default in LEAF_MODULE_DEFAULTS.items():
        value = given.get(key, default)
        value = [value] if isinstance(value, str) else list(value)
        out[key] = list(dict.fromkeys(str(v) for v in value))
    return out


def for_cxx(config):
    """`config` as JSON for the C++ engine: the Python blocks taken out, and
    the keys the front end carries out itself (_FRONT_END_KEYS)."""
    cxx = {k: v for k, v in config.items() if k not in PYTHON_BLOCKS and k not in _FRONT_END_TOP_KEYS}
    for block, key in _FRONT_END_KEYS:
        inner = cxx.get(block)
        if isinstance(inner, dict) and key in inner:
            cxx[block] = {k: v for k, v in inner.items() if k != key}
    return json.dumps(cxx)


# Keys inside the engine's blocks that the Python front end carries out
# itself: z3 leaf modules (utils/z3_leaf_module.py), fp16's casting of the
# forward's inputs (ZeroEngine.forward).
_FRONT_END_KEYS = (("zero_optimization", "leaf_module"), ("fp16", "auto_cast"))
_FRONT_END_TOP_KEYS = ("memory_breakdown",)  # memory lines around each phase (ZeroEngine._memory_lines)


def for_engine(config):
    """The config the C++ engine gets: a bf16/fp16 model computes in that
    dtype, as DeepSpeed's (which converts the module to it); the C++ API's
    default, "auto", may widen to fp32 compute where 16-bit GEMMs are slow,
    which would make a Python model see fp32 params where DeepSpeed's sees
    16-bit ones. Buffers (BatchNorm's running stats) stay each rank's own, as
    DeepSpeed leaves them; the C++ API's default copies rank 0's to every
    rank at each step, as DDP does. And they keep their dtype under 16-bit
    compute (a rotary table stays fp32) unless data_types.buffer_dtype says
    otherwise, as DeepSpeed 0.19.8 casts only params; the C++ API's default
    casts them with the frozen params. What the user set under `zero_cpp` is
    kept."""
    config = copy.deepcopy(config)
    p = precision(config)
    own = config.setdefault("zero_cpp", {})
    if p != "fp32" and "compute_dtype" not in own:
        own["compute_dtype"] = p
    own.setdefault("broadcast_buffers", False)
    own.setdefault("keep_buffer_dtype", True)  # DeepSpeed 0.19.8 casts params only, unless data_types.buffer_dtype
    if not own:
        del config["zero_cpp"]
    for name in PYTHON_BLOCKS:
        python_block(config, name)
    from . import checkpointing  # it reads this module's PYTHON_BLOCKS
    checkpointing.check(python_block(config, "activation_checkpointing"))
    leaf_module(config)
    parse(for_cxx(config))  # a config error now, naming its key
    return config
