"""DeepSpeed's z3 leaf modules: a module marked as a leaf is one stage-3
unit with everything under it -- gathered whole before its forward,
released after, with no hooks inside it. For mixture-of-experts blocks,
whose experts each rank runs in its own data-dependent order (per-expert
units would make the ranks' gathers differ), and for modules that read
their children's params directly. Mark them before initialize()."""


def _matches(module, classes):
    return any((isinstance(c, type) and type(module) is c) or (isinstance(c, str) and type(module).__name__ == c)
               for c in classes)


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
    """Marks every module of these classes (exact class, or class name) in
    `model` as a leaf; returns them."""
    return _set(model, leaf_module_classes, True, raise_if_not_found)


def unset_z3_leaf_modules(model, leaf_module_classes, raise_if_not_found=True):
    return _set(model, leaf_module_classes, False, raise_if_not_found)


def set_z3_leaf_module(model, flag):
    """Marks (or unmarks) this one module."""
    model._z3_leaf = flag


def z3_leaf_module(model):
    return getattr(model, "_z3_leaf", False)


def get_z3_leaf_modules(model):
    return [m for m in model.modules() if z3_leaf_module(m)]
