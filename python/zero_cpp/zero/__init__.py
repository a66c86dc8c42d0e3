"""DeepSpeed's `deepspeed.zero`: `Init` (build a model already sharded),
`GatheredParameters` (full params outside forward), and
`register_external_parameter`.

`Init` is seed 003's zero::Init: each module that owns trainable params is
sharded once its constructor has returned -- flattened, synced from rank 0
and cut to this rank's shard, in C++ -- so building a model peaks at about
one module whole plus the shards. Modules are caught as DeepSpeed catches
them: every nn.Module subclass's __init__ is wrapped while the context is
open (classes defined inside it too).

Constructors initialise the children they have just built: torch's
MultiheadAttention writes its out_proj's bias, and most models end with
`self.apply(self._init_weights)`. So a built module is sharded when the next
module's construction begins (or the context closes), not at once: its
parent may still write it. And `Module.apply` gathers each module's own
params around the function while the context is open, keeping rank 0's
values, as DeepSpeed's Init does.
"""
import contextlib
import functools
import json

import torch

from .. import _C
from .. import config as configs
from .. import distributed
from . import host_copies, state_dict_at_rest
from ..mirror import (_EXTERNAL_ATTR, _INIT_PARAMS_ATTR, _UNIT_ATTR, ZeroParamStatus,  # noqa: F401
                      modules_built_under_init, set_status, unit_mirror_for_init, unsharded_trainable)

_active = []  # open Init contexts, innermost last


def _all_subclasses(cls):
    out, todo = [], [cls]
    while todo:
        c = todo.pop()
        for s in c.__subclasses__():
            out.append(s)
            todo.append(s)
    return out


class Init:
    """Modules built inside are sharded as they are built (stage 3; below
    it the context does nothing, as the C++ API's, so one script runs at
    every stage).

    Arguments as DeepSpeed's: `config_dict_or_path` (or `config`) is the
    ds_config; `enabled=False` turns it off; `module` shards a model built
    already. `remote_device` "cpu" keeps the shards in host memory on a GPU
    machine (offload_param then decides where they live). Under bf16 or
    fp16 (the config's, or `dtype`), floating-point tensors made inside the
    context by torch's factories take that dtype as they are made, as
    DeepSpeed's Init makes them, so a module's init draws its values in it
    (the same weights as DeepSpeed's).
    Model parallelism (`mpu`, `data_parallel_group`,
    `zero_param_parallel_group`, `sequence_data_parallel_group`) and
    quantized weights are not supported: an error names them.
    """

    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True, remote_device=None,
                 pin_memory=False, config_dict_or_path=None, config=None, enabled=True, dtype=None, mpu=None,
                 zero_param_parallel_group=None, zero_quantized_weights=False,
                 zero_quantized_nontrainable_weights=False, sequence_data_parallel_group=None, param_swapper=None):
        for name, value in (("data_parallel_group", data_parallel_group), ("mpu", mpu),
                            ("zero_param_parallel_group", zero_param_parallel_group),
                            ("sequence_data_parallel_group", sequence_data_parallel_group),
                            ("param_swapper", param_swapper)):
            if value is not None:
                raise NotImplementedError(f"zero_cpp.zero.Init: {name} is not supported (the data-parallel group "
                                          f"is the whole job)")
        if zero_quantized_weights or zero_quantized_nontrainable_weights:
            raise NotImplementedError("zero_cpp.zero.Init: quantized weights (ZeRO++ qwZ) are not supported")
        if remote_device not in (None, "cpu", "nvme", "cuda"):
            raise ValueError(f"zero_cpp.zero.Init: remote_device {remote_device!r}: None, 'cpu' or 'nvme'")
        if remote_device in ("cpu", "nvme") and torch.cuda.is_available():
            raise NotImplementedError(f"zero_cpp.zero.Init(remote_device={remote_device!r}) on a GPU machine: the "
                                      f"shards are built on the GPU; offload them with the ds_config's "
                                      f"zero_optimization.offload_param (device \"cpu\" or \"nvme\") instead")
        self._enabled = enabled
        self._cfg = None
        if enabled:
            cfg = configs.load(config=config_dict_or_path if config_dict_or_path is not None else config) \
                if (config_dict_or_path is not None or config is not None) else {"zero_optimization": {"stage": 3}}
            self._enabled = configs.stage(cfg) == 3
            self._cfg = cfg
        self._dtype = dtype if dtype in (torch.bfloat16, torch.float16) else \
            {"bf16": torch.bfloat16, "fp16": torch.float16}.get(configs.precision(self._cfg)) \
            if dtype is None and self._cfg is not None else None
        self._remote_device = remote_device
        self._init = None
        self._units_sharded = 0
        self._patched = []
        self._depth = {}
        self._pending = []  # built, not yet sharded: their parent's constructor may still write them
        if module is not None and self._enabled:
            with self:
                for m in reversed(list(module.modules())):  # inner modules first, as when built
                    self._built(m)

    # ---- the context ----
    def __enter__(self):
        if not self._enabled:
            return self
        distributed.init_distributed()
        world = distributed.world()
        device = world.device if self._remote_device in (None, "cuda") else "cpu"
        # The C++ scope: units are sharded over the job's ranks, their
        # frozen params and buffers synced from rank 0.
        cfg = dict(self._cfg)
        cfg.setdefault("train_micro_batch_size_per_gpu", 1)
        cfg.pop("optimizer", None)
        cfg.pop("scheduler", None)
        self._init = _C.Init(world, json.dumps(cfg), device)
        self._patch()
        _active.append(self)
        return self

    def __exit__(self, *exc):
        if not self._enabled:
            return False
        _active.remove(self)
        self._unpatch()
        if exc[0] is None:
            self._shard_pending()
        self._pending = []
        self._units_sharded = self._init.units_sharded
        self._init.close()
        self._init = None
        return False

    @property
    def units_sharded(self):
        """Modules sharded in this context so far."""
        return self._init.units_sharded if self._init is not None else self._units_sharded

    # ---- catching each module as its constructor returns ----
    def _patch(self):
        for cls in [torch.nn.Module] + _all_subclasses(torch.nn.Module):
            self._wrap_init(cls)
        # Classes defined inside the context.
        original = torch.nn.Module.__dict__.get("__init_subclass__")  # nn.Module defines none: object's
        ctx = self

        @classmethod
        def init_subclass(cls, **kwargs):
            if original is not None:
                original.__get__(None, cls)(**kwargs)
            else:
                super(torch.nn.Module, cls).__init_subclass__(**kwargs)
            ctx._wrap_init(cls)

        torch.nn.Module.__init_subclass__ = init_subclass
        self._patched.append((torch.nn.Module, "__init_subclass__", original))
        self._wrap_apply()
        self._wrap_factories()

    # torch's tensor factories DeepSpeed's Init wraps.
    _FACTORIES = ("tensor", "empty", "zeros", "ones", "full", "arange", "eye", "randn")

    def _wrap_factories(self):
        """Under bf16/fp16: a floating-point tensor a factory makes inside
        the context is converted to that dtype as it is made (DeepSpeed's
        Init does the same), so `reset_parameters` draws in it."""
        if self._dtype is None:
            return
        for name in self._FACTORIES:
            original = getattr(torch, name)

            def made_in(*args, _original=original, _dtype=self._dtype, **kwargs):
                t = _original(*args, **kwargs)
                if t.is_floating_point() and t.dtype != _dtype:
                    t.data = t.data.to(_dtype)
                return t

            functools.update_wrapper(made_in, original)
            setattr(torch, name, made_in)
            self._patched.append((torch, name, original))

    def _wrap_apply(self):
        """Module.apply while the context is open: each module's own params
        whole around `fn` (every rank runs it; rank 0's values are kept)."""
        original = torch.nn.Module.apply
        ctx = self

        @functools.wraps(original)
        def apply(module, fn):
            if getattr(fn, "_zero_cpp_gathers", False):  # a child's apply within the outer one
                return original(module, fn)
            ctx._shard_pending()  # one state for every module: sharded, each gathered below

            def gathered(m):
                # The module's own params and its children's: an init function
                # may write a child's through the parent (transformers' GPT-2
                # scales every `c_proj.weight` from its block's attention and
                # MLP), which DeepSpeed's Init would lose.
                params = []
                for owner in [m, *m.children()]:
                    unit = getattr(owner, _UNIT_ATTR, None)
                    if unit is not None and unit.sharded_at_init:
                        params += [p for p in owner._parameters.values()
                                   if p is not None and all(p is not q for q in params)]
                if not params:
                    return fn(m)
                with GatheredParameters(params, modifier_rank=0):
                    return fn(m)

            gathered._zero_cpp_gathers = True
            return original(module, gathered)

        torch.nn.Module.apply = apply
        self._patched.append((torch.nn.Module, "apply", original))

    def _wrap_init(self, cls):
        original = cls.__dict__.get("__init__")
        if original is None or getattr(original, "_zero_cpp_wrapped", False):
            return
        ctx = self

        @functools.wraps(original)
        def __init__(module, *args, **kwargs):
            depth = ctx._depth.get(id(module), 0)
            if depth == 0 and ctx._init is not None:
                ctx._shard_pending()  # a new module: the ones built before it are done with
            ctx._depth[id(module)] = depth + 1
            try:
                original(module, *args, **kwargs)
            finally:
                if depth == 0:
                    del ctx._depth[id(module)]
                else:
                    ctx._depth[id(module)] = depth
            if depth == 0 and ctx._init is not None:
                ctx._built(module)

        __init__._zero_cpp_wrapped = True
        cls.__init__ = __init__
        self._patched.append((cls, "__init__", original))

    def _unpatch(self):
        for cls, name, original in reversed(self._patched):
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
        self._patched = []

    def _built(self, module):
        """A module's constructor returned: its own trainable params are
        sharded when the next module's construction begins."""
        if all(m is not module for m in self._pending):
            self._pending.append(module)

    def _shard_pending(self):
        """Shard the built modules' own trainable params, in build order (the
        same on every rank)."""
        pending, self._pending = self._pending, []
        for module in pending:
            if getattr(module, _UNIT_ATTR, None) is None and unsharded_trainable(module):
                self._init.shard(unit_mirror_for_init(module))
        state_dict_at_rest.guard(pending)


@contextlib.contextmanager
def paused():
    """No module built inside is sharded (initialize() builds its own)."""
    saved = list(_active)
    for ctx in reversed(saved):  # innermost first: each restores what it found
        ctx._shard_pending()
        ctx._unpatch()
    try:
        yield
    finally:
        for ctx in saved:
            ctx._patch()


class GatheredParameters:
    """Full params outside forward and backward (DeepSpeed's): inside the
    block `params` (one or an iterable) hold their full values on every
    rank; with `modifier_rank`, that rank's changes are written back to every
    rank when the block ends (into the fp32 master weights too). Every rank
    enters and leaves it together (collective). Params of no engine (built
    under zero.Init, before initialize) or of a stage below 3 are whole
    already: the block then only broadcasts modifier_rank's values."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        if isinstance(params, torch.Tensor):
            params = [params]
        self._params = [p for p in params if p is not None] if params is not None else []
        self._modifier_rank = modifier_rank
        self._enabled = enabled and bool(self._params)
        self._scope = None
        self._init_units = []
        self._held = set()  # host buffers whose moves to the host copy inside the block

    def __enter__(self):
        if not self._enabled:
            return self
        from ..engine import engine_of
        engine = engine_of(self._params[0])
        if engine is not None:
            self._scope = _C.GatheredParameters(engine._engine, self._params, self._modifier_rank)
            self._gathered()
            return self
        # Built under zero.Init, before initialize(): gathered from the units
        # zero.Init sharded, re-sharded (with modifier_rank's values) after.
        self._init_units = _init_units_holding(self._params)
        world = distributed.world() if (self._init_units or self._modifier_rank is not None) else None
        for unit in self._init_units:
            _C.gather_init_unit(unit, world)
        self._gathered()
        return self

    def _gathered(self):
        set_status(self._params, ZeroParamStatus.AVAILABLE)
        # Sharded params (ds_id) are released at the block's end: a host copy
        # taken inside it must not be a view of them.
        self._held = host_copies.buffers_of(p for p in self._params if hasattr(p, "ds_id"))
        host_copies.hold(self._held)

    def __exit__(self, exc_type, exc, tb):
        if not self._enabled:
            return False
        ok = exc_type is None
        set_status(self._params, ZeroParamStatus.NOT_AVAILABLE)
        host_copies.release(self._held)
        self._held = set()
        if self._scope is not None:
            self._scope.end(ok)
            self._scope = None
            return False
        modified = ok and self._modifier_rank is not None
        if modified and distributed.is_initialized():
            import torch.distributed as dist
            for p in self._params:
                with torch.no_grad():
                    dist.broadcast(p.data, src=self._modifier_rank)
        for unit in self._init_units:  # changes kept only from modifier_rank, as DeepSpeed
            _C.release_init_unit(unit, distributed.world(), modified)
        self._init_units = []
        return False


def _init_units_holding(params):
    """The UnitMirrors zero.Init made that hold any of `params`, in the order
    of `params` (the same on every rank: each unit is gathered collectively)."""
    unit_of = {}
    for module in modules_built_under_init():
        unit = getattr(module, _UNIT_ATTR)
        if unit.sharded_at_init:
            # The params the unit sharded, not the module's now: a tie made
            # since (head.weight = emb.weight) leaves the unit its own.
            for p in getattr(module, _INIT_PARAMS_ATTR):
                unit_of[id(p)] = unit
    found = []
    for p in params:
        unit = unit_of.get(id(p))
        if unit is not None and all(u is not unit for u in found):
            found.append(unit)
    return found


def register_external_parameter(module, parameter):
    """DeepSpeed's: `parameter` is used in `module`'s forward though another
    module owns it (e.g. a tied embedding read by the head). Here such a
    param becomes the root's, gathered around the whole forward. Call it
    before initialize()."""
    external = module.__dict__.setdefault(_EXTERNAL_ATTR, [])
    if all(p is not parameter for p in external):
        external.append(parameter)


def unregister_external_parameter(module, parameter):
    external = module.__dict__.get(_EXTERNAL_ATTR, [])
    module.__dict__[_EXTERNAL_ATTR] = [p for p in external if p is not parameter]


# DeepSpeed's deepspeed.zero.TiledLinear (last: its module reaches GatheredParameters through this one).
from ..runtime.zero.tiling import TiledLinear, TiledLinearReturnBias  # noqa: E402,F401
