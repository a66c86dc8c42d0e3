"""The Python model as the C++ engine sees it, and stage 3's module hooks.

`build()` mirrors a Python module tree in C++ (module_mirror.h): every
module a C++ module registering the same tensors under the same names, so
the engine's param names are the Python ones (checkpoints load from either
front end). At stage 3 the units are chosen as DeepSpeed chooses them:
every module, the root excepted, that owns trainable params directly is a
unit holding those params (units nest: an outer unit holds only its own),
and a z3 leaf module (set_z3_leaf_modules) one unit with all under it;
a param registered in two modules (tied weights) belongs to the root, which
is gathered around the whole engine forward. Each unit's forward hooks tell
the C++ runtime when it runs (gather before, release after, outputs hooked
so that backward regathers), and the runtime prefetches along the recorded
order within stage3_prefetch_bucket_size / stage3_max_live_parameters and
keeps units reused within stage3_max_reuse_distance, as the C++ API does.
"""
import dataclasses
import enum
import itertools
import os
import time
import weakref

import torch

from . import _C

_UNIT_ATTR = "_zero_cpp_unit"  # the UnitMirror zero.Init made for a module
_EXTERNAL_ATTR = "_zero_cpp_external_params"  # register_external_parameter's
_live_at_last_prune = 0
_BUILT_UNDER_INIT = []  # weak references to the modules zero.Init sharded, in build order (a UnitMirror under _UNIT_ATTR each)
EXTERNAL_PREFIX = "_zero_cpp_external_"


class ZeroParamStatus(enum.Enum):
    """DeepSpeed's: whether a stage-3 param is whole here (`param.ds_status`)."""
    AVAILABLE = 1  # whole (inside GatheredParameters)
    NOT_AVAILABLE = 2  # only this rank's shard (at rest)
    INFLIGHT = 3  # being gathered (DeepSpeed's prefetch; not reported here)


_next_ds_id = itertools.count()


def mark_partitioned(params):
    """DeepSpeed's marks of a stage-3 param, which scripts test before reading
    one (`hasattr(p, "ds_id")`, LLaVA's maybe_zero_3): ds_id, ds_numel,
    ds_shape, and ds_status -- NOT_AVAILABLE at rest, AVAILABLE inside
    GatheredParameters; the engine's own gathers for forward and backward
    are not reported. Each becomes a PartitionedParameter: read while
    released, it reads as DeepSpeed's does at rest (zero/released_params.py)."""
    from .zero import released_params  # here: zero_cpp.zero imports this module
    params = list(params)
    released_params.mark(params)
    for p in params:
        if not hasattr(p, "ds_id"):
            p.ds_id = next(_next_ds_id)
        p.ds_numel = p.numel()  # metadata only: the released storage is not touched
        p.ds_shape = p.shape
        p.ds_status = ZeroParamStatus.NOT_AVAILABLE


def set_status(params, status):
    for p in params:
        if hasattr(p, "ds_id"):
            p.ds_status = status


def owns_trainable_params(module):
    return any(p is not None and p.requires_grad for p in module._parameters.values())


def tensors_in(value, out=None, seen=None):
    """Every tensor in a forward's result: tensors inside tuples, lists,
    dicts (Hugging Face's ModelOutput is one), dataclasses and namedtuples."""
    if out is None:
        out, seen = [], set()
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif id(value) in seen:
        return out
    elif isinstance(value, dict):
        seen.add(id(value))
        for v in value.values():
            tensors_in(v, out, seen)
    elif isinstance(value, (list, tuple)):
        seen.add(id(value))
        for v in value:
            tensors_in(v, out, seen)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        seen.add(id(value))
        for f in dataclasses.fields(value):
            tensors_in(getattr(value, f.name), out, seen)
    return out


def members(module):
    params = [(n, p) for n, p in module._parameters.items() if p is not None]
    for i, p in enumerate(getattr(module, _EXTERNAL_ATTR, ())):
        params.append((f"{EXTERNAL_PREFIX}{i}", p))
    buffers = [(n, b) for n, b in module._buffers.items() if b is not None]
    return params, buffers


_INIT_PARAMS_ATTR = "_zero_cpp_init_params"  # the params zero.Init sharded through a module's UnitMirror


def unsharded_trainable(module):
    """zero.Init: whether `module` owns a trainable param no unit has
    sharded yet (a weight tied in a constructor belongs to the module
    built first; the engine then finds the tie, as for any tied weight)."""
    return any(p is not None and p.requires_grad and not hasattr(p, "ds_id") for p in module._parameters.values())


def unit_mirror_for_init(module):
    """zero.Init: the UnitMirror a just-built module is sharded through,
    holding its own (direct) members but the params another unit sharded
    already; kept on the module for the engine, with the params it holds."""
    unit = _C.UnitMirror()
    params, buffers = members(module)
    params = [(n, p) for n, p in params if not hasattr(p, "ds_id")]
    for _, p in params:
        if p.dtype in (torch.bfloat16, torch.float16):  # made in 16 bits (Init under bf16/fp16): held in fp32, exactly
            p.data = p.data.float()
    unit.set_members(params, buffers)
    mark_partitioned(p for _, p in params)
    object.__setattr__(module, _UNIT_ATTR, unit)
    object.__setattr__(module, _INIT_PARAMS_ATTR, [p for _, p in params])
    global _live_at_last_prune
    if len(_BUILT_UNDER_INIT) > 2 * _live_at_last_prune + 64:  # dead references dropped now and then: amortised O(1)
        _BUILT_UNDER_INIT[:] = [r for r in _BUILT_UNDER_INIT if r() is not None]
        _live_at_last_prune = len(_BUILT_UNDER_INIT)
    _BUILT_UNDER_INIT.append(weakref.ref(module))
    return unit


def modules_built_under_init():
    """The live modules zero.Init sharded, in the order they were built (the
    same on every rank, unlike a set's)."""
    return [m for m in (r() for r in _BUILT_UNDER_INIT) if m is not None]


class Mirror:
    """The C++ tree over a Python model, and which modules are units."""

    def __init__(self, model, stage3, world):
        self.units = []  # (module, UnitMirror), each module once
        self._memo = {}
        self._stage3 = stage3
        self._world = world
        self.root = self._mirror(model, is_root=True)

    def _mirror(self, module, is_root, in_leaf=False):
        key = id(module)
        if key in self._memo:
            return self._memo[key]
        made_at_init = getattr(module, _UNIT_ATTR, None)
        # A z3 leaf (set_z3_leaf_modules) is one unit with all under it: the
        # unit holds what no unit inside it holds, and nothing inside is one.
        leaf = not in_leaf and getattr(module, "_z3_leaf", False)
        owns = any(p.requires_grad for p in module.parameters()) if leaf else owns_trainable_params(module)
        is_unit = self._stage3 and not is_root and not in_leaf and owns
        if is_unit:
            m = made_at_init if made_at_init is not None else _C.UnitMirror()
            self.units.append((module, m))
        else:
            if made_at_init is not None:
                # Sharded by zero.Init, but no unit here (the root, or its
                # params since frozen): whole again before the engine groups it.
                made_at_init.gather_back(self._world)
            m = _C.ModuleMirror(type(module).__name__)
        m.set_members(*members(module))
        self._memo[key] = m
        for name, child in module._modules.items():
            if child is not None:
                m.add_child(name, self._mirror(child, is_root=False, in_leaf=in_leaf or leaf))
        return m


class _ForwardScope:
    """The engine forward running now, if any: units whose params code
    outside their own forward reads during it (a tied head computed as
    F.linear(x, self.wte.weight) in the model's forward) are gathered at that
    read and held to the end of the engine forward, their backward then
    regathered from its outputs -- DeepSpeed's external parameters, found as
    DeepSpeed finds them: a unit's params dict notices the read."""

    def __init__(self):
        self.active = False
        self.entered = []  # units entered by such a read in this forward

    def begin(self):
        self.active, self.entered = True, []

    def end(self, outputs):
        self.active = False
        entered, self.entered = self.entered, []
        for unit in entered:
            unit.leave(outputs)


class _UnitParameters(dict):
    """A unit module's `_parameters`: reading a param while the engine's
    forward runs but the unit's own forward does not gathers the unit for
    the rest of that forward (and hooks it for its backward)."""

    __slots__ = ("_unit", "_running", "_scope", "_held")

    def __getitem__(self, name):
        p = dict.__getitem__(self, name)
        if self._scope.active and self._running[0] == 0 and not self._held[0]:
            self._unit.enter()
            self._held[0] = True
            self._scope.entered.append(_Held(self._unit, self._held))
        return p

    def __reduce__(self):
        # A copy of the model (copy.deepcopy, pickle) is a plain model: its params in a plain dict.
        return (dict, (list(dict.items(self)),))


class _Held:
    """A unit held by a read from outside its forward; left at the end of the engine forward."""

    def __init__(self, unit, held):
        self._unit, self._held = unit, held

    def leave(self, outputs):
        self._held[0] = False
        self._unit.leave(outputs)


class UnitHooks:
    """Stage 3: each unit's forward tells the C++ runtime when it runs. The
    post-hook runs even when the forward raised (always_call), so the
    runtime never counts a unit as still running; a unit whose gather
    itself raised (ranks running units in different orders) was never
    entered, and is not left either. A read of a unit's param from outside
    its forward, during the engine's forward, holds the unit gathered to the
    end of that forward (`scope`, _UnitParameters)."""

    def __init__(self, units):
        self._handles = []
        self._dicts = []
        self.scope = _ForwardScope()
        self.times = HookTimes() if os.environ.get("ZERO_CPP_HOOK_TIMES") == "1" else None
        self._running = []
        for module, unit in units:
            running = [0]  # this unit's forwards entered and not yet left (recursion nests)
            self._running.append((unit, running))
            params = _UnitParameters(module._parameters)
            params._unit, params._running, params._scope, params._held = unit, running, self.scope, [False]
            pre, post = _pre_hook(unit, running), _post_hook(unit, running, params)
            if self.times is not None:
                timed_unit = self.times.wrap(unit)
                pre = self.times.timed(_pre_hook(timed_unit, running))
                post = self.times.timed(_post_hook(timed_unit, running, params))
            self._handles.append(module.register_forward_pre_hook(pre))
            self._handles.append(module.register_forward_hook(post, always_call=True))
            self._dicts.append((module, module._parameters))
            module._parameters = params

    def abort(self):
        """After a forward that raised: every unit still counted as running
        (a BaseException such as KeyboardInterrupt skips the post-hooks)
        ends its forward in the runtime, so it is released and regathered
        as usual from the next forward on."""
        for unit, running in self._running:
            while running[0] > 0:
                running[0] -= 1
                unit.failed()

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        for module, original in self._dicts:
            original.clear()
            original.update(dict.items(module._parameters))
            module._parameters = original
        self._dicts = []


class _UnitHook:
    """A unit's forward hook. A copy of the model (copy.deepcopy, pickle: a
    reference model, an EMA) gets a hook that does nothing in its place: the
    copy is a plain model, which must not reach this engine's units."""

    def __init__(self, hook):
        self._hook = hook

    def __call__(self, *args):
        return self._hook(*args)

    def __reduce__(self):
        return (_no_hook, ())


def _no_hook():
    return _do_nothing


def _do_nothing(*args):
    return None


def _pre_hook(unit, running):
    def hook(module, args):
        unit.enter()
        running[0] += 1
    return _UnitHook(hook)


def _post_hook(unit, running, params):
    def hook(module, args, output):
        if running[0] == 0:
            return
        running[0] -= 1
        outputs = tensors_in(output)
        if running[0] == 0 and params._scope.active and not params._held[0] and _returns_own_param(outputs, params):
            # A forward that returns one of its own params (zero3.rst's
            # CustomLinear returning its bias): the caller reads it after this
            # forward, so the unit stays gathered to the end of the engine
            # forward, as a param read from outside is (DeepSpeed registers
            # such a param as its caller's, found the same way).
            params._held[0] = True
            params._scope.entered.append(_Held(unit, params._held))
            return
        unit.leave(outputs)
    return _UnitHook(hook)


def _returns_own_param(outputs, params):
    own = [p for p in dict.values(params) if p is not None]
    return any(t is p for t in outputs for p in own)


class HookTimes:
    """Where the front end's own time goes (ZERO_CPP_HOOK_TIMES=1; the
    benchmark's breakdown): each hook's wall time, and the part of it spent
    in the C++ engine (gathers, releases); the rest is Python's."""

    def __init__(self):
        self.calls = 0
        self.total_s = 0.0
        self.engine_s = 0.0

    def wrap(self, unit):
        times = self

        class Timed:
            def enter(self):
                t0 = time.perf_counter()
                unit.enter()
                times.engine_s += time.perf_counter() - t0

            def leave(self, outputs):
                t0 = time.perf_counter()
                unit.leave(outputs)
                times.engine_s += time.perf_counter() - t0

        return Timed()

    def timed(self, hook):
        def run(*args):
            t0 = time.perf_counter()
            try:
                return hook(*args)
            finally:
                self.total_s += time.perf_counter() - t0
                self.calls += 1
        return run
