"""SGLang v0.5.15's own pools, allocators and scheduler admission function,
loaded from the installed wheel's files the way test_sglang_oracle.py loads
mamba_radix_cache.py (SGLang's package imports a large stack that is not
installed here):

- allocator/base.py, allocator/token.py and allocator/mamba.py, whole:
  TokenToKVPoolAllocator and MambaSlotAllocator;
- memory_pool.py's ReqToTokenPool and HybridReqToTokenPool classes (their
  source, read from the file), over a stand-in for MambaPool (the state
  tensors play no part in slot accounting);
- common.py's alloc_req_slots function and its headroom factors.

`load()` returns test_sglang_oracle's namespace with these added, or raises
ImportError with the reason; the `wheel` fixture (import it into a test
module) is (this module, that namespace), or skips with the reason.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import os
import sys
import types
from typing import Any, Optional

import pytest
import torch

from test_sglang_oracle import _exec_module, _stub, load_sglang

_MC = ("srt", "mem_cache")


def _sources(path: str, classes: tuple = (), functions: tuple = (), assigns: tuple = ()) -> str:
    """The source of the named top-level classes, functions and assignments
    of a file, in file order."""
    src = open(path).read()
    want = set(classes) | set(functions) | set(assigns)
    out, found = [], set()
    for node in ast.parse(src).body:
        name = None
        if isinstance(node, ast.ClassDef) and node.name in classes:
            name = node.name
        elif isinstance(node, ast.FunctionDef) and node.name in functions:
            name = node.name
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1
              and isinstance(node.targets[0], ast.Name) and node.targets[0].id in assigns):
            name = node.targets[0].id
        if name is not None:
            out.append(ast.get_source_segment(src, node))
            found.add(name)
    missing = want - found
    if missing:
        raise ImportError("%s has no %s" % (path, sorted(missing)))
    return "from __future__ import annotations\n" + "\n\n".join(out) + "\n"


class _MambaPoolStandIn:
    """What HybridReqToTokenPool and MambaRadixCache touch of MambaPool when
    no state is computed: its size, no ReplaySSM ring, copies as no-ops."""

    def __init__(self, *, size: int, **_: Any) -> None:
        self.size = size
        self.replayssm_write_pos = None

    def copy_from(self, *_: Any, **__: Any) -> None:
        pass

    def clear_slots(self, *_: Any, **__: Any) -> None:
        pass


class _NoMemorySaver:
    @staticmethod
    def create(enable: bool = False) -> "_NoMemorySaver":
        return _NoMemorySaver()

    def region(self, *_: Any, **__: Any):
        return contextlib.nullcontext()


_CKPT = "sglang.srt.mem_cache.mamba_checkpoint_pool"


def _more(d: str) -> dict:
    mc = os.path.join(d, *_MC)
    al = os.path.join(mc, "allocator")
    # the allocator files, whole, over the package stand-in
    base = _exec_module("sglang.srt.mem_cache.allocator.base", os.path.join(al, "base.py"))
    token = _exec_module("sglang.srt.mem_cache.allocator.token", os.path.join(al, "token.py"))
    mamba = _exec_module("sglang.srt.mem_cache.allocator.mamba", os.path.join(al, "mamba.py"))
    alloc_pkg = sys.modules["sglang.srt.mem_cache.allocator"]
    alloc_pkg.BaseTokenToKVPoolAllocator = base.BaseTokenToKVPoolAllocator
    alloc_pkg.TokenToKVPoolAllocator = token.TokenToKVPoolAllocator
    # the paged allocator, the class mamba_radix_cache.py checks for
    paged = _load_paged(al, base.BaseTokenToKVPoolAllocator)
    alloc_pkg.PagedTokenToKVPoolAllocator = paged
    # the two pool classes of memory_pool.py
    pool_ns = {"torch": torch, "logger": logging.getLogger("sglang.memory_pool"),
               "TorchMemorySaverAdapter": _NoMemorySaver, "GPU_MEMORY_TYPE_KV_CACHE": "kv_cache",
               "MambaPool": _MambaPoolStandIn, "MambaSlotAllocator": mamba.MambaSlotAllocator,
               "__name__": "sglang.srt.mem_cache.memory_pool"}
    exec("from typing import *\n", pool_ns)
    exec(_sources(os.path.join(mc, "memory_pool.py"), classes=("ReqToTokenPool", "HybridReqToTokenPool")),
         pool_ns)
    mp = sys.modules["sglang.srt.mem_cache.memory_pool"]
    mp.ReqToTokenPool = pool_ns["ReqToTokenPool"]
    mp.HybridReqToTokenPool = pool_ns["HybridReqToTokenPool"]
    # the scheduler's admission
    common_src = _sources(os.path.join(mc, "common.py"), functions=("alloc_req_slots",),
                          assigns=("MAMBA_STATE_PER_REQ_PREFIX_CACHE", "MAMBA_STATE_PER_REQ_PREFIX_CACHE_LAZY",
                                   "MAMBA_STATE_PER_REQ_NO_CACHE"))
    return {"TokenToKVPoolAllocator": token.TokenToKVPoolAllocator,
            "PagedTokenToKVPoolAllocator": paged,
            "MambaSlotAllocator": mamba.MambaSlotAllocator,
            "HybridReqToTokenPool": pool_ns["HybridReqToTokenPool"],
            "common_source": common_src}


def alloc_req_slots_for(sg: Any, evict_params: Any):
    """SGLang's alloc_req_slots, unchanged (its HybridReqToTokenPool is
    SGLang's class), building its evictions with evict_params (the cache's
    own EvictParams class)."""
    g = {"HybridReqToTokenPool": sg.HybridReqToTokenPool, "EvictParams": evict_params,
         "ReqToTokenPool": object, "BasePrefixCache": object, "Req": object,
         "__name__": "sglang.srt.mem_cache.common"}
    exec(sg.common_source, g)
    return g["alloc_req_slots"]


def make_pools(sg: Any, *, size: int, mamba_size: int, max_context_len: int, kv_size: int,
               extra_buffer: bool, lazy: bool = False, overlap: bool = True, page_size: int = 1):
    """SGLang's HybridReqToTokenPool and TokenToKVPoolAllocator (page_size >
    1: its PagedTokenToKVPoolAllocator, see paged_allocator_class) on CPU."""
    saved = sys.modules.get(_CKPT)
    sys.modules[_CKPT] = _stub(_CKPT, maybe_init_int8_mamba_checkpoint_pool=lambda **_: None)
    try:
        pool = sg.HybridReqToTokenPool(
            size=size, mamba_size=mamba_size, mamba_spec_state_size=0, max_context_len=max_context_len,
            device="cpu", enable_memory_saver=False, cache_params=types.SimpleNamespace(),
            mamba_layer_ids=[0], enable_mamba_extra_buffer=extra_buffer,
            enable_mamba_extra_buffer_lazy=lazy, enable_overlap_schedule=overlap)
    finally:
        if saved is None:
            del sys.modules[_CKPT]
        else:
            sys.modules[_CKPT] = saved
    if page_size == 1:
        alloc = sg.TokenToKVPoolAllocator(size=kv_size, dtype=torch.bfloat16, device="cpu", kvcache=None,
                                          need_sort=False)
    else:
        alloc = paged_allocator_class(sg)(size=kv_size, page_size=page_size, dtype=torch.bfloat16,
                                          device="cpu", kvcache=None, need_sort=False)
    return pool, alloc


class _Launch:
    """``fn[grid](*args)`` for a plain function standing in for a Triton kernel."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __getitem__(self, grid: Any) -> Any:
        return self.fn


def _decode_kernel_standin(seq_lens, last_loc, free_pages, out, _bs_upper, page_size):
    """alloc_decode_kernel's result, written from its semantics: each request
    (seq_len tokens after this step, last_loc its last KV index) writes at
    last_loc + 1 while its page has room; a request whose new token starts a
    page (seq_len - 1 a page multiple) takes the next free page, in batch
    order, at the page's first offset."""
    taken = 0
    for i in range(len(seq_lens)):
        if (int(seq_lens[i]) - 1) % page_size:
            out[i] = int(last_loc[i]) + 1
        else:
            if taken >= len(free_pages):   # the kernel reads past the list; the caller returns None
                return
            out[i] = int(free_pages[taken]) * page_size
            taken += 1


def _extend_kernel_standin(mod: Any) -> Any:
    """alloc_extend_kernel as the wheel's own alloc_extend_naive (the NPU
    path's fallback, same file), skipped when the free list is too short
    (the kernel then reads past it and alloc_extend returns None)."""

    def run(prefix_lens, seq_lens, last_loc, free_pages, out, _bs_upper, page_size):
        need = int(((seq_lens + page_size - 1) // page_size - (prefix_lens + page_size - 1) // page_size).sum())
        if need <= len(free_pages):
            mod.alloc_extend_naive(prefix_lens, seq_lens, last_loc, free_pages, out, page_size, out.device)

    return run


def _load_paged(al: str, base: Any) -> Any:
    """The wheel's allocator/paged.py, whole, over stand-ins for its Triton
    kernels (alloc_extend: the file's own alloc_extend_naive; alloc_decode:
    _decode_kernel_standin) and for the sglang.srt.utils helpers it imports
    (get_num_new_pages: the wheel's own function, read from
    utils/common.py); base is its BaseTokenToKVPoolAllocator."""
    path = os.path.join(al, "paged.py")
    utils_ns = {"torch": torch, "Optional": Optional}
    exec(_sources(os.path.join(al, "..", "..", "utils", "common.py"), functions=("get_num_new_pages",)), utils_ns)
    pkg = "sglang.srt.mem_cache"
    stubs = {pkg + ".allocator.base": {"BaseTokenToKVPoolAllocator": base},
             pkg + ".triton_ops": {}, pkg + ".triton_ops.allocator": {"alloc_decode_kernel": None,
                                                                     "alloc_extend_kernel": None},
             "sglang.srt.utils": {"get_bool_env_var": lambda *a, **k: False, "is_hip": lambda: False,
                                  "get_num_new_pages": utils_ns["get_num_new_pages"],
                                  "next_power_of_2": lambda n: 1 << max(int(n) - 1, 0).bit_length()}}
    for n in ("sglang", "sglang.srt", pkg, pkg + ".allocator"):
        if n not in sys.modules:
            stubs[n] = {}
    saved = {n: sys.modules.get(n) for n in list(stubs) + [pkg + ".allocator.paged"]}
    for n, attrs in stubs.items():
        sys.modules[n] = _stub(n, **attrs)
    try:
        mod = _exec_module(pkg + ".allocator.paged", path)
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    mod.alloc_extend_kernel = _Launch(_extend_kernel_standin(mod))
    mod.alloc_decode_kernel = _Launch(_decode_kernel_standin)
    return mod.PagedTokenToKVPoolAllocator


def paged_allocator_class(sg: Any) -> Any:
    """SGLang's PagedTokenToKVPoolAllocator (see _load_paged), the class
    SGLang's MambaRadixCache accepts.  From load()."""
    return sg.PagedTokenToKVPoolAllocator


def recording_frees(alloc: Any) -> list:
    """Records every tensor an allocator's free gets, as (dtype, indices),
    in the returned list (the allocator frees it as before)."""
    log = []
    free = alloc.free

    def recording(index):
        log.append((index.dtype, index.tolist()))
        return free(index)

    alloc.free = recording
    return log


def load() -> Any:
    return load_sglang(more=_more)


@pytest.fixture(scope="module")
def wheel():
    try:
        return sys.modules[__name__], load()
    except ImportError as e:
        pytest.skip(str(e))
