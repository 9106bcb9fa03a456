"""mambaradix.sglang: native drop-ins for SGLang v0.5.15's hybrid prefix
cache (MambaRadixCache), its pools (HybridReqToTokenPool, MambaPool, the
token and state allocators) and the value types they exchange.

This subpackage imports torch; `mambaradix` itself does not.  With SGLang
installed, `register()` makes `--radix-cache-backend mambaradix` select
this cache.
"""

from __future__ import annotations

from typing import Any

from .. import _C
from ._api import (
    CacheInitParams,
    DecLockRefParams,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    Mamba2CacheParams,
    Mamba2StateDType,
    Mamba2StateShape,
    MatchPrefixParams,
    MatchResult,
    RadixKey,
    Range,
    Req,
    SlotIndex,
    SamplingParams,
)
from .cache import MambaRadixCache, TreeNode
from .pools import (
    HybridReqToTokenPool,
    MambaPool,
    MambaSlotAllocator,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from .scheduling import alloc_req_slots, release_kv_cache

OwnershipError = _C.OwnershipError

BACKEND_NAME = "mambaradix"

__all__ = [
    "BACKEND_NAME",
    "CacheInitParams",
    "DecLockRefParams",
    "DecLockRefResult",
    "EvictParams",
    "EvictResult",
    "HybridReqToTokenPool",
    "IncLockRefResult",
    "InsertParams",
    "InsertResult",
    "Mamba2CacheParams",
    "Mamba2StateDType",
    "Mamba2StateShape",
    "MambaPool",
    "MambaRadixCache",
    "MambaSlotAllocator",
    "MatchPrefixParams",
    "MatchResult",
    "OwnershipError",
    "PagedTokenToKVPoolAllocator",
    "RadixKey",
    "Range",
    "Req",
    "ReqToTokenPool",
    "SlotIndex",
    "SamplingParams",
    "TokenToKVPoolAllocator",
    "TreeNode",
    "alloc_req_slots",
    "register",
    "release_kv_cache",
]


def _factory(ctx: Any) -> MambaRadixCache:
    """SGLang's TreeCacheBuildContext -> our cache (hybrid SSM models only)."""
    if not getattr(ctx, "is_hybrid_ssm", True):
        raise ValueError("the mambaradix cache backend serves hybrid SSM models only")
    return MambaRadixCache(ctx.params)


def register(name: str = BACKEND_NAME) -> bool:
    """Register MambaRadixCache with SGLang's radix-cache registry so that
    `--radix-cache-backend <name>` selects it.  Returns False when SGLang is
    not importable, True when registered (or already registered by us)."""
    try:
        from sglang.srt.mem_cache import registry  # type: ignore
    except Exception:
        return False
    get = getattr(registry, "get_radix_cache_factory", None)
    if get is not None and get(name) is _factory:
        return True
    registry.register_radix_cache_backend(name, _factory)
    return True
