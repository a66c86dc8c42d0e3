"""`deepspeed` as another name of zero_cpp, where DeepSpeed is not installed.

A script changed to `import zero_cpp as deepspeed` often also says
`from deepspeed.accelerator import get_accelerator` or
`from deepspeed.ops.adam import FusedAdam`. With DeepSpeed absent, those
lines find zero_cpp's modules of the same names (the same module objects:
`deepspeed.utils is zero_cpp.utils`), so the one changed import is the only
change.

The finder sits at the end of `sys.meta_path`: Python's own finders are
asked first, so an installed DeepSpeed is always found as itself (scripts
and tests that compare the two in one process keep both). Where DeepSpeed
is installed, a script imports DeepSpeed's objects through those lines;
`zero_cpp.initialize` warns when it finds DeepSpeed imported.
"""
import importlib
import importlib.abc
import importlib.util
import sys

_ALIAS, _TARGET = "deepspeed", "zero_cpp"


class _SameModule(importlib.abc.Loader):
    """Hands the import system zero_cpp's module itself (not a copy), keeping
    its own spec, so the module stays zero_cpp's under both names."""

    def __init__(self, module):
        self._module = module
        self._spec = module.__spec__

    def create_module(self, spec):
        return self._module

    def exec_module(self, module):
        module.__spec__ = self._spec  # the import system set the alias's; the module keeps its own


class _DeepSpeedAlias(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != _ALIAS and not fullname.startswith(_ALIAS + "."):
            return None
        name = _TARGET + fullname[len(_ALIAS):]
        try:
            if importlib.util.find_spec(name) is None:
                return None  # DeepSpeed has it, zero_cpp does not: "No module named 'deepspeed.X'"
        except ModuleNotFoundError:
            return None
        module = importlib.import_module(name)
        return importlib.util.spec_from_loader(fullname, _SameModule(module),
                                               is_package=hasattr(module, "__path__"))


def install():
    """Puts the finder last on sys.meta_path (once)."""
    if not any(isinstance(f, _DeepSpeedAlias) for f in sys.meta_path):
        sys.meta_path.append(_DeepSpeedAlias())


def deepspeed_itself_imported():
    """Whether DeepSpeed's own package (not this alias) is imported in this process."""
    module = sys.modules.get(_ALIAS)
    return module is not None and not module.__name__.startswith(_TARGET)
