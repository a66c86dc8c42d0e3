"""DeepSpeed's z3 leaf modules: a module marked as a leaf is one stage-3
unit with everything under it -- gathered whole before its forward,
released after, with no hooks inside it. For mixture-of-experts blocks,
whose experts each rank runs in its own data-dependent order (per-expert
units would make the ranks' gathers differ), and for modules that read
their children's params directly. Mark them before initialize(): by class
(set_z3_leaf_modules), by module name or name suffix (the _by_name and
_by_suffix forms), or in the config's zero_optimization.leaf_module, which
initialize() applies (apply_zero_leaf_module_config; DeepSpeed's defaults
there are Hugging Face's sparse MoE blocks)."""
from .logging import logger


def _qualified_name(module):
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def _matches(module, classes):
    """As DeepSpeed's: a class matches its instances and its subclasses'; a
    string the class's bare or fully qualified name."""
    return any((isinstance(c, type) and isinstance(module, c)) or
               (isinstance(c, str) and c in (type(module).__name__, _qualified_name(module))) for c in classes)


def _set(model, classes, flag, raise_if_not_found=True):
    classes = list(classes)
    bad = [c for c in classes if not isinstance(c, (type, str))]
    if bad:
        raise TypeError(f"set_z3_leaf_modules: leaf_module_classes are classes or class names, not {bad}")
    marked = []
    for module in model.modules():
        if _matches(module, classes):
            module._z3_leaf = flag
            marked.append(module)
    if not marked and raise_if_not_found:
        raise ValueError(f"set_z3_leaf_modules: no module of type {classes} in the model")
    return marked


def set_z3_leaf_modules(model, leaf_module_classes, raise_if_not_found=True):
    """Marks every module of these classes (or their subclasses; classes or
    class names) in `model` as a leaf; returns them."""
    return _set(model, leaf_module_classes, True, raise_if_not_found)


def unset_z3_leaf_modules(model, leaf_module_classes, raise_if_not_found=True):
    return _set(model, leaf_module_classes, False, raise_if_not_found)


def set_z3_leaf_modules_by_name(model, module_names, flag=True, raise_if_not_found=True):
    """Marks the modules of these names (as named_modules() gives them);
    returns (the modules, the names matching none)."""
    by_name = dict(model.named_modules())
    marked, missing = [], []
    for name in module_names:
        module = by_name.get(name)
        if module is None:
            missing.append(name)
            continue
        module._z3_leaf = flag
        marked.append(module)
    if missing and raise_if_not_found:
        raise ValueError(f"set_z3_leaf_modules_by_name: no module named {missing} in the model")
    return marked, missing


def set_z3_leaf_modules_by_suffix(model, module_name_suffixes, flag=True, raise_if_not_found=True):
    """Marks every module whose name ends with one of these suffixes;
    returns (the modules, the suffixes matching none)."""
    named = list(model.named_modules())
    marked, missing, seen = [], [], set()
    for suffix in module_name_suffixes:
        hits = [m for name, m in named if name.endswith(suffix)]
        if not hits:
            missing.append(suffix)
        for module in hits:
            module._z3_leaf = flag
            if id(module) not in seen:
                seen.add(id(module))
                marked.append(module)
    if missing and raise_if_not_found:
        raise ValueError(f"set_z3_leaf_modules_by_suffix: no module name ends with {missing}")
    return marked, missing


def apply_zero_leaf_module_config(model, leaf_config):
    """The config's zero_optimization.leaf_module (a dict of classes, names
    and name_suffixes, as zero_cpp.config.leaf_module reads it): the
    modules it names marked as leaves, nothing raised for names that match
    none (a warning where the config set them); returns the modules."""
    if leaf_config is None:
        return []
    from ..config import LEAF_MODULE_DEFAULTS
    marked = {}
    for module in _set(model, leaf_config["classes"], True, raise_if_not_found=False):
        marked.setdefault(id(module), module)
    for key, mark in (("names", set_z3_leaf_modules_by_name), ("name_suffixes", set_z3_leaf_modules_by_suffix)):
        if not leaf_config[key]:
            continue
        modules, missing = mark(model, leaf_config[key], True, raise_if_not_found=False)
        for module in modules:
            marked.setdefault(id(module), module)
        if missing and leaf_config[key] != LEAF_MODULE_DEFAULTS[key]:
            logger.warning(f"zero_optimization.leaf_module.{key}: nothing in the model matches {missing}")
    customized = any(leaf_config[k] != LEAF_MODULE_DEFAULTS[k] for k in LEAF_MODULE_DEFAULTS)
    if not marked and customized:
        logger.warning("zero_optimization.leaf_module matches no module: every module with params of its own is "
                       "a unit, as without it")
    return list(marked.values())


def set_z3_leaf_module(model, flag):
    """Marks (or unmarks) this one module."""
    model._z3_leaf = flag


def z3_leaf_module(model):
    return getattr(model, "_z3_leaf", False)


def get_z3_leaf_modules(model):
    return [m for m in model.modules() if z3_leaf_module(m)]
