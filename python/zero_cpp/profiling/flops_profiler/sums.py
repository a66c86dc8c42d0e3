"""A module's profile with its submodules': sums of the counts the
profiler leaves on each module while profiling."""


def get_module_flops(module):
    """The flops of `module`'s forwards, its submodules' included."""
    return sum(m.__flops__ for m in module.modules())


def get_module_macs(module):
    return sum(m.__macs__ for m in module.modules())


def get_module_duration(module):
    """Seconds in `module`'s forwards; for one never called itself (a
    ModuleList), its children's."""
    return module.__duration__ or sum(get_module_duration(m) for m in module.children())
