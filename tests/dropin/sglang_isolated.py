"""SGLang v0.5.15's scheduler-side classes and pools, loaded from the wheel in
isolation.

The tests that run SGLang's own ``HybridReqToTokenPool`` / ``MambaPool`` /
``MambaSlotAllocator``, ``TokenToKVPoolAllocator``, ``Req`` and
``MambaRadixCache`` need the modules that define them, and those import
SGLang's serving stack (triton, psutil, msgspec, model layers, ...), which a
``--no-deps`` install lacks.  :func:`load` executes the defining modules
(``REAL`` below) from the wheel's files unchanged, and stands in for
everything else they import with inert stubs (any attribute, call, base
class or context manager; false in a condition), so module-level feature
probes take the CPU path.  Server arguments come from ``SERVER_ARGS``.

SGLang's code imports some modules lazily, inside functions: use the loaded
classes inside ``with ns.active():``, which puts the isolated modules (and the
stand-ins) in ``sys.modules`` and takes them out again afterwards, so other
tests see SGLang exactly as installed.  When a normal ``import`` of SGLang
works (a full installation), that is used instead (``active()`` then does
nothing).  :func:`load` raises ImportError naming the real cause.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional

import sglang_source

#: the modules whose code runs as shipped
REAL = (
    "sglang.srt.environ",
    "sglang.srt.constants",
    "sglang.srt.configs.mamba_utils",
    "sglang.srt.utils.torch_memory_saver_adapter",
    "sglang.srt.dllm.mixin.req",
    "sglang.srt.mem_cache.utils",
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.allocator.base",
    "sglang.srt.mem_cache.allocator.token",
    "sglang.srt.mem_cache.allocator.paged",
    "sglang.srt.mem_cache.allocator.mamba",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.mamba_radix_cache",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.mem_cache.registry",
    "sglang.srt.mem_cache.events",
    "sglang.srt.mem_cache.mamba_checkpoint_pool",
)
#: single definitions taken from modules that are otherwise stand-ins
PIECES = {
    "sglang.srt.utils.common": ("srt/utils/common.py", ("Range",)),
}
#: third-party packages the REAL modules import but never use on this path
MISSING_OK = ("psutil", "pybase64", "triton", "msgspec")

#: what get_global_server_args() returns to the loaded code: ServerArgs'
#: field defaults (read from its class body by load()), then these
SERVER_ARGS = types.SimpleNamespace()
_OURS = dict(
    mamba_cache_chunk_size=64, mamba_track_interval=256, page_size=1, disable_overlap_schedule=False,
    mamba_radix_cache_strategy="extra_buffer", enable_mamba_extra_buffer_lazy_flag=False,
    enable_int8_mamba_checkpoint=False,
)


def _server_args_defaults() -> Dict[str, Any]:
    import ast

    src = sglang_source.source_of("srt/server_args.py", "ServerArgs")
    out: Dict[str, Any] = {}
    for node in ast.parse(src).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            try:
                value = ast.literal_eval(node.value) if node.value is not None else None
            except ValueError:
                value = None  # a default computed at run time
            out[node.target.id] = value
    return out


def _reset_server_args() -> None:
    SERVER_ARGS.__dict__.clear()
    SERVER_ARGS.__dict__.update(_server_args_defaults())
    SERVER_ARGS.__dict__.update(_OURS)
    SERVER_ARGS.enable_mamba_extra_buffer = lambda: SERVER_ARGS.mamba_radix_cache_strategy == "extra_buffer"
    SERVER_ARGS.enable_mamba_extra_buffer_lazy = lambda: SERVER_ARGS.enable_mamba_extra_buffer_lazy_flag


class _Base:
    def __init_subclass__(cls, **kw: Any) -> None:
        pass

    def __init__(self, *a: Any, **k: Any) -> None:
        pass


class _Stub:
    """Anything: attributes, calls (a decorator returns what it decorates),
    subscripts, base classes, context managers; false, empty and zero."""

    def __init__(self, name: str = "stub") -> None:
        object.__setattr__(self, "_n", name)

    def __getattr__(self, k: str) -> Any:
        if k.startswith("__") and k.endswith("__"):
            raise AttributeError(k)
        return _Stub(self._n + "." + k)

    def __call__(self, *a: Any, **k: Any) -> Any:
        if len(a) == 1 and not k and (callable(a[0]) or isinstance(a[0], type)):
            return a[0]
        return _Stub(self._n + "()")

    def __mro_entries__(self, bases: tuple) -> tuple:
        c = self.__dict__.get("_cls")
        if c is None:
            c = type(self._n.split(".")[-1], (_Base,), {})
            object.__setattr__(self, "_cls", c)
        return (c,)

    def __getitem__(self, k: Any) -> Any:
        return _Stub(self._n + "[]")

    def __setitem__(self, k: Any, v: Any) -> None:
        pass

    def __iter__(self):
        return iter(())

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *a: Any) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return False

    def __index__(self) -> int:
        return 0

    def __or__(self, o: Any) -> Any:
        return _Stub()

    __ror__ = __or__

    def __eq__(self, o: Any) -> bool:
        return o is self

    def __hash__(self) -> int:
        return id(self)

    def __lt__(self, o: Any) -> bool:
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.any_schema()

    def __repr__(self) -> str:
        return "<stand-in %s>" % self._n


class _StubModule(types.ModuleType):
    def __getattr__(self, k: str) -> Any:
        if k.startswith("__") and k.endswith("__"):
            raise AttributeError(k)
        v = _Stub(self.__name__ + "." + k)
        setattr(self, k, v)
        return v


def _package_dirs(root: str, name: str) -> list:
    return [os.path.join(root, *name.split(".")[1:])]


class _Loader(importlib.abc.Loader):
    def __init__(self, root: Optional[str]) -> None:
        self.root = root  # a package directory to search (a hollow package), or None (a stub)

    def create_module(self, spec: Any) -> Any:
        m = _StubModule(spec.name)
        m.__path__ = _package_dirs(self.root, spec.name) if self.root else []
        return m

    def exec_module(self, module: Any) -> None:
        pass


class _Finder(importlib.abc.MetaPathFinder):
    """sglang.*: REAL modules from their files (normal finders), packages above
    them hollow (their __init__ is not run), everything else a stub; the
    MISSING_OK packages a stub when they are not installed."""

    def __init__(self, root: str, front: bool) -> None:
        self.root, self.front = root, front
        self.parents = {r.rsplit(".", i)[0] for r in REAL for i in range(1, r.count(".") + 1)}

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        top = name.split(".")[0]
        if self.front and top == "sglang":
            if name in REAL:
                return None
            hollow = self.root if name in self.parents else None
            return importlib.machinery.ModuleSpec(name, _Loader(hollow), is_package=True)
        if not self.front and top in MISSING_OK:
            return importlib.machinery.ModuleSpec(name, _Loader(None), is_package=True)
        return None


_CACHE: dict = {}


def configure(ns: types.SimpleNamespace, *, chunk_size: int = 64, track_interval: int = 256,
              strategy: str = "extra_buffer", overlap: bool = True, lazy: bool = False) -> None:
    """Sets the server arguments the loaded code reads."""
    if ns.isolated:
        SERVER_ARGS.mamba_cache_chunk_size = chunk_size
        SERVER_ARGS.mamba_track_interval = track_interval
        SERVER_ARGS.mamba_radix_cache_strategy = strategy
        SERVER_ARGS.disable_overlap_schedule = not overlap
        SERVER_ARGS.enable_mamba_extra_buffer_lazy_flag = lazy
        return
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    args = ServerArgs(model_path="dummy", page_size=1)
    args._mamba_cache_chunk_size = chunk_size
    args.mamba_track_interval = track_interval
    args.mamba_radix_cache_strategy = strategy
    args.disable_overlap_schedule = not overlap
    set_global_server_args_for_scheduler(args)


def load() -> types.SimpleNamespace:
    """SGLang's classes: Req, HybridReqToTokenPool, MambaPool,
    TokenToKVPoolAllocator, PagedTokenToKVPoolAllocator, Mamba2CacheParams,
    Mamba2StateShape, MambaRadixCache, RadixKey, MatchPrefixParams,
    EvictParams, InsertParams, CacheInitParams, SERVER_ARGS and ``isolated``."""
    if "ns" in _CACHE:
        return _CACHE["ns"]
    if "err" in _CACHE:
        raise ImportError(_CACHE["err"])
    try:
        ns = _load()
    except ImportError as e:
        _CACHE["err"] = str(e)
        raise
    _CACHE["ns"] = ns
    return ns


def _ours(k: str) -> bool:
    return k.split(".")[0] == "sglang" or k.split(".")[0] in MISSING_OK


@contextmanager
def _activated(modules: Dict[str, Any], root: str) -> Iterator[None]:
    """The isolated modules in sys.modules, the finders installed; on exit
    the modules created meanwhile are kept in `modules` and sys.modules is
    as before."""
    saved = {k: v for k, v in sys.modules.items() if _ours(k)}
    for k in saved:
        del sys.modules[k]
    sys.modules.update(modules)
    front, back = _Finder(root, True), _Finder(root, False)
    sys.meta_path.insert(0, front)
    sys.meta_path.append(back)
    try:
        yield
    finally:
        sys.meta_path.remove(front)
        sys.meta_path.remove(back)
        for k in [k for k in sys.modules if _ours(k)]:
            modules[k] = sys.modules.pop(k)
        sys.modules.update(saved)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _sampling_params_fields() -> Dict[str, Any]:
    """The fields and defaults of SGLang's SamplingParams (a msgspec struct),
    read from its class body."""
    import ast

    src, _ = sglang_source.source_of("srt/sampling/sampling_params.py", "SamplingParams", with_line=True)
    env = {"TOP_K_ALL": sglang_source.module_constant("srt/sampling/sampling_params.py", "TOP_K_ALL")}
    out: Dict[str, Any] = {}
    for node in ast.parse(src).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            value = None
            if node.value is not None:
                value = eval(compile(ast.Expression(node.value), "<SamplingParams>", "eval"), env)
            out[node.target.id] = value
    return out


def _sampling_params_class(mods: dict) -> Any:
    """SGLang's SamplingParams when msgspec is installed; otherwise a plain
    record with its fields and defaults."""
    m = mods.get("sglang.srt.sampling.sampling_params")
    if m is not None:
        return m.SamplingParams
    fields = _sampling_params_fields()

    class SamplingParams(types.SimpleNamespace):
        def __init__(self, **kw: Any) -> None:
            unknown = set(kw) - set(fields)
            if unknown:
                raise TypeError("SamplingParams: unknown fields %s" % sorted(unknown))
            super().__init__(**dict(fields, **kw))
            if self.stop_strs is None and self.stop is not None:
                self.stop_strs = self.stop

    return SamplingParams


def _collect(mods: dict, isolated: bool) -> types.SimpleNamespace:
    mp, al, mu = (mods["sglang.srt.mem_cache.memory_pool"], mods["sglang.srt.mem_cache.allocator"],
                  mods["sglang.srt.configs.mamba_utils"])
    bpc = mods["sglang.srt.mem_cache.base_prefix_cache"]
    return types.SimpleNamespace(
        Req=mods["sglang.srt.managers.schedule_batch"].Req,
        HybridReqToTokenPool=mp.HybridReqToTokenPool, MambaPool=mp.MambaPool,
        TokenToKVPoolAllocator=al.TokenToKVPoolAllocator,
        PagedTokenToKVPoolAllocator=al.PagedTokenToKVPoolAllocator,
        Mamba2CacheParams=mu.Mamba2CacheParams, Mamba2StateShape=mu.Mamba2StateShape,
        MambaRadixCache=mods["sglang.srt.mem_cache.mamba_radix_cache"].MambaRadixCache,
        RadixKey=mods["sglang.srt.mem_cache.radix_cache"].RadixKey,
        MatchPrefixParams=bpc.MatchPrefixParams, EvictParams=bpc.EvictParams, InsertParams=bpc.InsertParams,
        CacheInitParams=mods["sglang.srt.mem_cache.cache_init_params"].CacheInitParams,
        SamplingParams=_sampling_params_class(mods),
        SERVER_ARGS=SERVER_ARGS, isolated=isolated, active=_nothing,
    )


def _load() -> types.SimpleNamespace:
    if sglang_source.SKIP_REASON is not None:
        raise ImportError(sglang_source.SKIP_REASON)
    try:  # a full installation: SGLang as it is
        mods = {m: importlib.import_module(m) for m in REAL}
        return _collect(mods, isolated=False)
    except Exception as e:  # noqa: BLE001  (ImportError, or a broken partial install)
        first = "%s: %s" % (type(e).__name__, e)
    root = sglang_source.sglang_dir() or ""
    _reset_server_args()
    srv = types.ModuleType("sglang.srt.server_args")
    srv.get_global_server_args = lambda: SERVER_ARGS
    srv.ServerArgs = type("ServerArgs", (), {})
    modules: Dict[str, Any] = {"sglang.srt.server_args": srv}
    from typing import NamedTuple

    for name, (rel, names) in PIECES.items():
        m = _StubModule(name)
        m.__path__ = []
        got = sglang_source.load_functions(rel, names, {"NamedTuple": NamedTuple})
        for n in names:
            setattr(m, n, getattr(got, n))
        modules[name] = m
    have_msgspec = importlib.util.find_spec("msgspec") is not None
    try:
        with _activated(modules, root):
            mods = {m: importlib.import_module(m) for m in REAL}
            if have_msgspec:
                m = "sglang.srt.sampling.sampling_params"
                mods[m] = importlib.import_module(m)
    except Exception as e:  # noqa: BLE001
        raise ImportError("SGLang's pools and Req do not load from the wheel in isolation (%s: %s); "
                          "a normal import failed with %s" % (type(e).__name__, e, first)) from e
    ns = _collect(mods, isolated=True)
    ns.active = lambda: _activated(modules, root)
    return ns
