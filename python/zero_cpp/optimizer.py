"""Optimizers and LR schedulers as DeepSpeed accepts them, mapped onto the
C++ engine's fused flat update.

The update itself runs in C++ (AdamW, Adam, SGD, Lion, Adagrad, LAMB, Muon
over each rank's shard). What lives here: turning a torch optimizer given
in code (or DeepSpeed's own classes, or a callable making one) into the
config's "optimizer" block; the param groups; and the optimizer object
`initialize` returns, whose `param_groups` are the truth for each group's
lr -- a torch LR scheduler writes them, DeepSpeed's config schedulers
(computed by the C++ library's formulas) too, a training loop may -- and
are pushed to the engine before each optimizer step.
"""
import collections
import json
import math
import warnings
import weakref

import torch

from . import _C
from . import config as configs
from .config import DeepSpeedConfigError
from .moe import utils as moe_utils

# torch.optim classes and DeepSpeed's optimizer classes (by name: scripts may
# pass deepspeed.ops objects) -> the config's optimizer type and how to read
# their hyperparameters.
_SUPPORTED = ("torch.optim.AdamW, Adam, SGD and Adagrad; DeepSpeed's FusedAdam, DeepSpeedCPUAdam, FusedLamb, "
              "FusedLion, DeepSpeedCPULion and DeepSpeedCPUAdagrad (or zero_cpp.ops' classes of those names)")


def _adam_block(defaults, decoupled):
    return {"lr": defaults["lr"], "betas": list(defaults.get("betas", (0.9, 0.999))), "eps": defaults.get("eps", 1e-8),
            "weight_decay": defaults.get("weight_decay", 0.0), "adam_w_mode": decoupled}


def _refuse_flags(opt, name, **expected):
    for key, want in expected.items():
        got = opt.defaults.get(key, want)
        if got != want:
            raise DeepSpeedConfigError(f"zero_cpp: {name} with {key}={got!r} is not supported (the fused update "
                                       f"runs {key}={want!r}); drop it or use another optimizer")


def optimizer_block(opt):
    """The config's {"type", "params"} for a torch or DeepSpeed optimizer object."""
    cls = type(opt).__name__
    d = opt.defaults
    if isinstance(opt, torch.optim.AdamW):
        _refuse_flags(opt, "torch.optim.AdamW", amsgrad=False, maximize=False)
        return {"type": "AdamW", "params": _adam_block(d, True)}
    if isinstance(opt, torch.optim.Adam):
        _refuse_flags(opt, "torch.optim.Adam", amsgrad=False, maximize=False)
        decoupled = bool(d.get("decoupled_weight_decay", False))
        return {"type": "AdamW" if decoupled else "Adam", "params": _adam_block(d, decoupled)}
    if isinstance(opt, torch.optim.SGD):
        _refuse_flags(opt, "torch.optim.SGD", maximize=False)
        return {"type": "SGD", "params": {"lr": d["lr"], "momentum": d.get("momentum", 0.0),
                                          "dampening": d.get("dampening", 0.0),
                                          "weight_decay": d.get("weight_decay", 0.0),
                                          "nesterov": bool(d.get("nesterov", False))}}
    if isinstance(opt, torch.optim.Adagrad):
        _refuse_flags(opt, "torch.optim.Adagrad", lr_decay=0, maximize=False)
        return {"type": "Adagrad", "params": {"lr": d["lr"], "eps": d.get("eps", 1e-10),
                                              "weight_decay": d.get("weight_decay", 0.0),
                                              "initial_accumulator_value": d.get("initial_accumulator_value", 0.0)}}
    if cls in ("FusedAdam", "DeepSpeedCPUAdam"):
        decoupled = bool(getattr(opt, "adam_w_mode", d.get("adam_w_mode", True)))
        return {"type": "AdamW" if decoupled else "Adam", "params": _adam_block(d, decoupled)}
    if cls == "FusedLamb":
        return {"type": "Lamb", "params": {"lr": d["lr"], "betas": list(d.get("betas", (0.9, 0.999))),
                                           "eps": d.get("eps", 1e-8), "weight_decay": d.get("weight_decay", 0.0),
                                           "max_coeff": d.get("max_coeff", 10.0),
                                           "min_coeff": d.get("min_coeff", 0.01)}}
    if cls in ("FusedLion", "DeepSpeedCPULion"):
        return {"type": "Lion", "params": {"lr": d["lr"], "betas": list(d.get("betas", (0.9, 0.999))),
                                           "weight_decay": d.get("weight_decay", 0.0)}}
    if cls == "DeepSpeedCPUAdagrad":
        return {"type": "Adagrad", "params": {"lr": d["lr"], "eps": d.get("eps", 1e-10),
                                              "weight_decay": d.get("weight_decay", 0.0)}}
    raise DeepSpeedConfigError(f"zero_cpp: the optimizer {type(opt).__module__}.{cls} has no fused update here; "
                               f"zero_cpp runs {_SUPPORTED}, or the \"optimizer\" block of the ds_config")


def _as_groups(model_parameters):
    """model_parameters as DeepSpeed takes them (params, or dicts of params
    and settings) -> a list of group dicts."""
    items = list(model_parameters)
    if not items:
        raise DeepSpeedConfigError("zero_cpp.initialize: model_parameters is empty")
    if all(isinstance(i, dict) for i in items):
        groups = []
        for g in items:
            g = dict(g)
            params = g["params"]
            g["params"] = [params] if isinstance(params, torch.Tensor) else list(params)
            groups.append(g)
        return groups
    if any(isinstance(i, dict) for i in items):
        raise DeepSpeedConfigError("zero_cpp.initialize: model_parameters mixes params and param-group dicts")
    return [{"params": items}]


class BasicOptimizer(torch.optim.Optimizer):
    """The optimizer DeepSpeed builds from its config (its "basic
    optimizer"): here only the param groups and their settings -- the update
    is the engine's. It is what a scheduler callable is given, and the
    `param_groups` every scheduler writes.

    Not through Optimizer.__init__: its first add_param_group imports
    torch._dynamo (and triton), ~130 MB of resident memory per rank that
    nothing here uses. The groups are checked as torch checks them."""

    def __init__(self, groups, defaults):
        self.defaults = defaults
        self.state = collections.defaultdict(dict)
        self.param_groups = []
        self._optimizer_step_pre_hooks = collections.OrderedDict()
        self._optimizer_step_post_hooks = collections.OrderedDict()
        self._optimizer_state_dict_pre_hooks = collections.OrderedDict()
        self._optimizer_state_dict_post_hooks = collections.OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = collections.OrderedDict()
        self._optimizer_load_state_dict_post_hooks = collections.OrderedDict()
        seen = set()
        for k, g in enumerate(groups):
            g = dict(g)
            g["params"] = list(g["params"])
            for p in g["params"]:
                if not isinstance(p, torch.Tensor):
                    raise TypeError(f"param group {k} holds a {type(p).__name__}, not a tensor")
                if id(p) in seen:
                    raise ValueError(f"a param appears in more than one param group (group {k})")
                seen.add(id(p))
            for key, value in defaults.items():
                g.setdefault(key, value)
            self.param_groups.append(g)

    def step(self, closure=None):
        raise RuntimeError("zero_cpp: the update runs in engine.step(); call that, not optimizer.step()")


class ZeroOptimizer(torch.optim.Optimizer):
    """What `initialize` returns as the optimizer (DeepSpeed's ZeRO optimizer
    wrapper): `param_groups` (the basic optimizer's: a scheduler built on
    either writes the same dicts), `zero_grad()`, `loss_scale`,
    `state_dict()`. Its `step()` is the engine's: engine.step() calls it at
    the accumulation boundary (so a torch LR scheduler sees its optimizer
    step); called directly it says to call engine.step()."""

    def __init__(self, engine, basic):
        # Not Optimizer.__init__: the groups are the basic optimizer's own.
        # The engine weakly: no reference cycle, so an engine the script
        # drops is freed then, not whenever the garbage collector runs.
        self._engine_ref = weakref.ref(engine)
        self.basic_optimizer = basic
        self.defaults = basic.defaults
        self.state = basic.state
        self._stepping = False
        self.overflow = False  # DeepSpeed's: the last boundary's step was skipped (fp16 overflow)
        self._optimizer_step_pre_hooks = {}
        self._optimizer_step_post_hooks = {}
        self._optimizer_state_dict_pre_hooks = {}
        self._optimizer_state_dict_post_hooks = {}
        self._optimizer_load_state_dict_pre_hooks = {}
        self._optimizer_load_state_dict_post_hooks = {}
        self._zero_grad_profile_name = "Optimizer.zero_grad#ZeroOptimizer.zero_grad"

    @property
    def _engine(self):
        engine = self._engine_ref()
        if engine is None:
            raise RuntimeError("zero_cpp: this optimizer's engine is gone")
        return engine

    @property
    def param_groups(self):
        return self.basic_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups):
        self.basic_optimizer.param_groups = groups

    @property
    def optimizer(self):  # DeepSpeed's wrappers expose the basic optimizer as .optimizer
        return self.basic_optimizer

    def step(self, closure=None):
        if not self._stepping:
            raise RuntimeError("zero_cpp: the update runs in engine.step(); call that, not optimizer.step()")
        return self._engine._update()

    def zero_grad(self, set_to_none=True):
        self._engine.zero_grad()

    @property
    def loss_scale(self):
        """The fp16 loss scale now (dynamic, or the config's static one)."""
        return self._engine._engine.loss_scale

    cur_scale = loss_scale

    def state_dict(self):
        """The groups' settings. The optimizer's state (its moments, the fp32
        masters) lives sharded in the C++ engine, which
        engine.save_checkpoint saves: a script saving this dict by hand
        would lose it without a word, so it is said."""
        warnings.warn("zero_cpp: optimizer.state_dict() holds the param groups' settings only; the optimizer's "
                      "state (moments, fp32 masters) is saved and loaded by engine.save_checkpoint(dir) and "
                      "engine.load_checkpoint(dir)", stacklevel=2)
        return {"param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]}

    def load_state_dict(self, state_dict):
        for g, saved in zip(self.param_groups, state_dict.get("param_groups", [])):
            g.update(saved)

    def __repr__(self):
        return f"ZeroOptimizer({self._engine._optimizer_type}, {len(self.param_groups)} param groups)"


class ConfigScheduler:
    """A ds_config "scheduler" (WarmupLR, WarmupDecayLR, WarmupCosineLR,
    LRRangeTest, OneCycle) as DeepSpeed runs it: it starts at iteration -1,
    writes each group's lr into the param groups at construction and after
    each step() (the engine calls it after every optimizer step that was not
    skipped); the lrs are the C++ library's formulas (src/optim/lr_schedule.h),
    per group from the group's initial lr where DeepSpeed's do so (WarmupLR
    without warmup_max_lr, WarmupCosineLR)."""

    def __init__(self, optimizer, config):
        self.optimizer = optimizer
        self._config_json = json.dumps({"optimizer": config["optimizer"], "scheduler": config["scheduler"],
                                        "train_micro_batch_size_per_gpu": 1})
        configs.parse(self._config_json)  # a scheduler's bad argument named now
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        # A schedule begun part way (a resumed run's last_batch_iteration)
        # writes nothing until its first step, as DeepSpeed's: the first
        # step takes the optimizer's own lr and betas.
        self.last_batch_iteration = int((config["scheduler"].get("params") or {}).get("last_batch_iteration", -1))
        # OneCycle's momentum cycle: the fused update moves Adam's beta1 itself; the groups show it.
        self.moves_betas = _C.scheduled_betas(self._config_json, 0) is not None
        self._last_lr = self._write() if self.last_batch_iteration == -1 else list(self.base_lrs)

    def get_lr(self):
        return [_C.scheduled_lr(self._config_json, base, self.last_batch_iteration) for base in self.base_lrs]

    def get_last_lr(self):
        return self._last_lr

    def _write(self):
        lrs = self.get_lr()
        betas = _C.scheduled_betas(self._config_json, self.last_batch_iteration) if self.moves_betas else None
        for g, lr in zip(self.optimizer.param_groups, lrs):
            g["lr"] = lr
            if betas is not None:
                g["betas"] = tuple(betas)
        return lrs

    def step(self, last_batch_iteration=None, **kwargs):
        self.last_batch_iteration = (self.last_batch_iteration + 1 if last_batch_iteration is None
                                     else last_batch_iteration)
        self._last_lr = self._write()

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd):
        """The schedule's position, as DeepSpeed's: the param groups' lrs
        stay as they are until the next step() writes them (a checkpoint's
        load restores them with the optimizer's state: restore_lrs)."""
        self.last_batch_iteration = sd["last_batch_iteration"]

    def restore_lrs(self):
        """The groups' lrs (and OneCycle's betas) at the loaded position, as
        the schedule wrote them before the checkpoint was saved."""
        self._last_lr = self._write()


def plan(model, optimizer, model_parameters, config):
    """What the engine is given: the config's optimizer block (from code or
    the config), the basic optimizer over the param groups, and each C++
    param group (its trainable params, lr, weight decay).

    Every trainable param must be in a group: DeepSpeed leaves a param
    outside its groups untrained, which is easy to do by mistake; here it is
    an error naming it (freeze it with requires_grad_(False) instead)."""
    client = None
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer) and callable(optimizer):
        groups = _as_groups(model_parameters if model_parameters is not None else model.parameters())
        client = optimizer(groups)
    elif optimizer is not None:
        client = optimizer
    if client is not None:
        if not isinstance(client, torch.optim.Optimizer):
            raise DeepSpeedConfigError(f"zero_cpp.initialize: optimizer is a {type(client).__name__}, not a "
                                       f"torch.optim.Optimizer (or a callable returning one)")
        block = optimizer_block(client)
        if "optimizer" in config:
            raise DeepSpeedConfigError("zero_cpp.initialize: an optimizer was given in code and the ds_config has "
                                       "an \"optimizer\" block; keep one")
        config["optimizer"] = block
        basic = client
    else:
        if "optimizer" not in config:
            raise DeepSpeedConfigError("zero_cpp.initialize: no optimizer: give one in code (optimizer=) or an "
                                       "\"optimizer\" block in the ds_config")
        # The settings as the C++ parser resolves them (DeepSpeed's defaults,
        # which differ by type and by "torch_adam").
        resolved = json.loads(configs.parse(json.dumps({"optimizer": config["optimizer"],
                                                        "train_micro_batch_size_per_gpu": 1})))
        params = resolved["optimizer"]["params"]
        defaults = {"lr": params["lr"], "weight_decay": params["weight_decay"]}
        for k in ("betas", "eps", "momentum"):
            if k in params:
                defaults[k] = tuple(params[k]) if k == "betas" else params[k]
        given = list(model_parameters if model_parameters is not None else model.parameters())
        if moe_utils.has_moe_layers(model)[0]:
            given = moe_utils.configure_moe_param_groups(given)  # DeepSpeed's expert groups, as its engine makes them
        basic = BasicOptimizer(_as_groups(given), defaults)
    block_params = config["optimizer"].get("params", {})
    _check_groups(basic, block_params)
    names = {id(p): n for n, p in model.named_parameters()}
    in_group = {}
    cxx_groups = []
    for k, g in enumerate(basic.param_groups):
        trainable = [p for p in g["params"] if p.requires_grad]
        for p in trainable:
            if id(p) not in names:
                raise DeepSpeedConfigError(f"zero_cpp.initialize: param group {k} holds a tensor of shape "
                                           f"{tuple(p.shape)} that is not a param of the model")
            in_group[id(p)] = k
        cxx_groups.append((trainable, (float(g["lr"]), float(g.get("weight_decay", 0.0)))))
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in in_group]
    if missing:
        raise DeepSpeedConfigError(f"zero_cpp.initialize: {len(missing)} trainable params are in no param group "
                                   f"(DeepSpeed would leave them untrained): {', '.join(missing[:5])}"
                                   f"{' ...' if len(missing) > 5 else ''}; add them to model_parameters or freeze "
                                   f"them (requires_grad_(False))")
    return basic, cxx_groups


def _check_groups(basic, block_params):
    """A group may set its own lr and weight_decay; other settings the fused
    update takes once, for every group."""
    for k, g in enumerate(basic.param_groups):
        for key in ("betas", "eps", "momentum"):
            if key in g and key in basic.defaults and _differs(g[key], basic.defaults[key]):
                raise DeepSpeedConfigError(f"zero_cpp: param group {k} sets {key}={g[key]!r}, unlike the "
                                           f"optimizer's {basic.defaults[key]!r}; groups may differ in lr and "
                                           f"weight_decay only")


def _differs(a, b):
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) != len(b) or any(_differs(x, y) for x, y in zip(a, b))
    try:
        return not math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
    except (TypeError, ValueError):
        return a != b


def scheduler(lr_scheduler, basic, config):
    """The scheduler the engine steps: the client's (an object, or a
    callable given the basic optimizer), else the config's, else None. A
    client's wins over the config's, as in DeepSpeed (the config's is then
    dropped, so the C++ side runs none either)."""
    if lr_scheduler is not None:
        config.pop("scheduler", None)
        if callable(lr_scheduler) and not hasattr(lr_scheduler, "step"):
            return lr_scheduler(basic)
        return lr_scheduler
    if "scheduler" in config:
        # An instance of DeepSpeed's class of that name (isinstance(s, WarmupDecayLR) holds, as there),
        # built from the config's block rather than from the class's arguments.
        from .runtime import lr_schedules
        cls = getattr(lr_schedules, str(config["scheduler"].get("type")), ConfigScheduler)
        if not (isinstance(cls, type) and issubclass(cls, ConfigScheduler)):
            cls = ConfigScheduler
        sched = cls.__new__(cls)
        ConfigScheduler.__init__(sched, basic, config)
        return sched
    return None
