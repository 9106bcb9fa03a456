"""Stand-in for triton where it is not installed (mambaradix.sglang_replay.env puts it on the path):
SGLang modules define kernels at import time; neither the tree nor the replay runs one.  Every
submodule exists and every name is a stand-in."""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "3.5.0"


class _Any:
    """A name from the stand-in: decorates, indexes, calls (raising), subclasses."""

    def __init__(self, name="triton"):
        self._name = name

    def __call__(self, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k:
            return _Any(getattr(a[0], "__name__", self._name))  # decorator use
        if any(type(x).__name__ == "Tensor" for x in list(a) + list(k.values())):
            raise NotImplementedError(f"triton stand-in: {self._name} cannot run")
        return self  # constexpr(...), decorator factories: @jit(...), @autotune(...)

    def __getitem__(self, item):
        return self

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if self._name.endswith("runtime.driver") and name == "active":
            raise RuntimeError("triton stand-in: no active driver (no GPU)")
        return _Any(f"{self._name}.{name}")

    def __mro_entries__(self, bases):
        return (object,)


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("triton."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Module(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.append(_Finder())
sys.modules[__name__].__class__ = _Module


def cdiv(a, b):
    return -(-a // b)


def next_power_of_2(n):
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


class Config:
    def __init__(self, *a, **k):
        self.kwargs = k
