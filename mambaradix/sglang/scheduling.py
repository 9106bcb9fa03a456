"""The two scheduler-side helpers of SGLang v0.5.15's mem_cache/common.py
that touch the cache's slot accounting, for drivers that do not import
SGLang: admission with state headroom, and releasing a request."""

from __future__ import annotations

from typing import Any, List

from .._C import state_headroom
from ._api import EvictParams, Req

def alloc_req_slots(req_to_token_pool: Any, reqs: List[Req], tree_cache: Any) -> List[int]:
    """Rows (and state slots) for a batch; evicts cached states first when
    fewer than the C core's headroom (``state_headroom``: 3 a request, 2 in
    lazy mode) are free.  RuntimeError when rows are short."""
    mamba_alloc = getattr(req_to_token_pool, "mamba_allocator", None)
    if mamba_alloc is not None and tree_cache is not None and tree_cache.supports_mamba():
        lazy = bool(getattr(req_to_token_pool, "enable_mamba_extra_buffer_lazy", False))
        evict = state_headroom(mamba_alloc.schedulable_available_size(), len(reqs), lazy)
        if evict:
            tree_cache.evict(EvictParams(num_tokens=0, mamba_num=evict))
    rows = req_to_token_pool.alloc(reqs)
    if rows is None:
        raise RuntimeError(
            f"alloc_req_slots(): out of request rows ({req_to_token_pool.available_size()} free, "
            f"{len(reqs)} requests); lower --max-running-requests"
        )
    return rows


def release_kv_cache(req: Req, tree_cache: Any, is_insert: bool = True) -> None:
    """Finish or abort a request: cache it (or not), free over-allocated KV
    and its row.  A request matched but never admitted only gives back its
    copy-on-write slot."""
    pool = tree_cache.req_to_token_pool
    if req.req_pool_idx is None:
        if req.mamba_pool_idx is not None:
            pool.mamba_allocator.free(req.mamba_pool_idx.reshape(1))
            req.mamba_pool_idx = None
        return
    tree_cache.cache_finished_req(req, is_insert=is_insert)
    start, end = req.pop_overallocated_kv_cache()
    ps = tree_cache.page_size
    if ps > 1:
        start = -(-start // ps) * ps
    if start < end:
        tree_cache.token_to_kv_pool_allocator.free(pool.req_to_token[req.req_pool_idx, start:end].long())
    pool.free(req)
