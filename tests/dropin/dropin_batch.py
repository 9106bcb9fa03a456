"""A full drop-in batch over mambaradix's own pools, on any device, with a
guard around every drop-in call: match, admission, the deferred
copy-on-write / clear, prefill tracking, cache_unfinished_req, decode
tracking and cache_finished_req.  The harness's own work (allocating KV,
writing the request's table row) runs outside the guard, as a scheduler's
forward-side code does.

Used by test_dropin_no_sync.py (a CPU guard that counts device-to-host
conversions) and test_dropin_no_sync_gpu.py (torch.cuda's sync debug mode).
"""

from __future__ import annotations

import contextlib
from array import array
from typing import Any, Callable, ContextManager, List

import torch

from mambaradix.sglang import (
    CacheInitParams,
    HybridReqToTokenPool,
    Mamba2CacheParams,
    Mamba2StateShape,
    MambaRadixCache,
    Req,
    SamplingParams,
    TokenToKVPoolAllocator,
)
from mambaradix.sglang.scheduling import alloc_req_slots, release_kv_cache

MODES = {
    # name: (extra_buffer, lazy, overlap)
    "no_buffer": (False, False, False),
    "extra_buffer": (True, False, True),
    "extra_buffer_pp1": (True, False, False),
    "lazy": (True, True, True),
}

CHUNK = 4
INTERVAL = 4


def _params() -> Mamba2CacheParams:
    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=16, n_groups=1, num_heads=2, head_dim=4,
                                    state_size=4, conv_kernel=4)
    return Mamba2CacheParams(shape=shape, layers=[0, 1])


def make(mode: str, device: Any, wrap: Callable[[Any], Any] = lambda pool: pool) -> tuple:
    """(cache, pool, allocator) for one mode; wrap(pool) is what the cache
    is given (a wrapper that is not one of our classes sends it down the
    path for someone else's pools)."""
    extra, lazy, overlap = MODES[mode]
    pool = HybridReqToTokenPool(
        size=8, mamba_size=24, max_context_len=128, device=device, cache_params=_params(), mamba_layer_ids=[0, 1],
        enable_mamba_extra_buffer=extra, enable_mamba_extra_buffer_lazy=lazy, enable_overlap_schedule=overlap,
        mamba_track_interval=INTERVAL,
    )
    alloc = TokenToKVPoolAllocator(size=512, dtype=torch.float32, device=device, kvcache=None, need_sort=False)
    pool, alloc = wrap(pool), wrap(alloc)
    cache = MambaRadixCache(
        CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=1,
                        enable_mamba_extra_buffer=extra, enable_mamba_extra_buffer_lazy=lazy),
        chunk_size=CHUNK, track_interval=INTERVAL)
    return cache, pool, alloc


def run_batch(mode: str, device: Any, guard: Callable[[], ContextManager] = contextlib.nullcontext,
              decode_steps: int = 9, wrap: Callable[[Any], Any] = lambda pool: pool) -> List[int]:
    """Two rounds of three requests (two sharing a prefix); each request of
    the second round extends one of the first, so it hits what that one
    cached.  Every drop-in call runs inside guard().
    Returns each request's cache hit (tokens matched at admission)."""
    cache, pool, alloc = make(mode, device, wrap)
    extra = MODES[mode][0]
    prompts = [[1] * 12 + [2] * 5, [1] * 12 + [3] * 6, [4] * 9]
    hits: List[int] = []
    rid = 0
    for _round in range(2):
        reqs = []
        for p in prompts:
            rid += 1
            reqs.append(Req(rid=rid, origin_input_ids=array("q", list(p) + [100 + rid]),
                            sampling_params=SamplingParams(max_new_tokens=decode_steps + 1)))
        with guard():
            for r in reqs:  # match (copy-on-write bookkeeping at a hit)
                r.init_next_round_input(cache)
            alloc_req_slots(pool, reqs, cache)  # admission
            for r in reqs:
                cache.inc_lock_ref(r.last_node)
        hits.extend(len(r.prefix_indices) for r in reqs)
        prompts = []
        for r in reqs:  # prefill: KV for the extend tokens, then the forward's state work
            P, n = len(r.prefix_indices), len(r.origin_input_ids)
            kv = alloc.alloc(n - P)
            pool.write((r.req_pool_idx, slice(0, P)), r.prefix_indices.to(torch.int32))
            pool.write((r.req_pool_idx, slice(P, n)), kv.to(torch.int32))
            r.set_extend_range(P, n)
            r.kv_committed_len = r.kv_allocated_len = n
            with guard():
                if r.mamba_cow_src_index is not None:
                    pool.mamba_pool.copy_from(r.mamba_cow_src_index, r.mamba_pool_idx.reshape(1))
                    r.mamba_cow_src_index = None
                elif r.mamba_needs_clear:
                    pool.mamba_pool.clear_slots(r.mamba_pool_idx.reshape(1))
                r.mamba_needs_clear = False
                if extra:
                    cache.prepare_extend_track(r, P, n - P)
        with guard():
            for r in reqs:
                r.output_ids.append(7)
                cache.cache_unfinished_req(r)
        for step in range(decode_steps):
            for r in reqs:
                r.output_ids.append(1000 + step)
                seq = len(r.origin_input_ids) + len(r.output_ids) - 1
                kv = alloc.alloc(1)
                pool.write((r.req_pool_idx, slice(seq - 1, seq)), kv.to(torch.int32))
                r.kv_committed_len = r.kv_allocated_len = seq
                last = step == decode_steps - 1
                with guard():
                    cache.decode_track(r, seq)
                    cache.decode_track_done(r, finished=last)
        with guard():
            for r in reqs:
                r.finished_reason = "length"
                release_kv_cache(r, cache)
                prompts.append(r.origin_input_ids + r.output_ids)
        cache.sanity_check()
        pool.mamba_allocator.check()
        alloc.check()
        pool.check()
    return hits
