"""The request's req_to_token row after cache_unfinished_req.

SGLang's cache_unfinished_req inserts the request's prefix, frees the KV
indices the tree already had (duplicates) and writes the tree's indices
into the request's row, so the next chunk's attention reads the KV the
tree keeps.  Here two requests with the same prompt run in one batch (no
hit for either): the first caches its prefix, the second's copy of it
becomes duplicates, and its row must then hold the first request's indices
over the cached length, with none of its own freed ones left in it.
Checked over mambaradix's own pools and over pools the cache treats as
someone else's (wrapped, as SGLang's are), in both buffer modes.
"""

from __future__ import annotations

from array import array

import pytest

torch = pytest.importorskip("torch")

from dropin_batch import CHUNK, make  # noqa: E402
from test_sglang_dropin import Foreign  # noqa: E402

from mambaradix.sglang import Req, SamplingParams  # noqa: E402
from mambaradix.sglang.scheduling import alloc_req_slots  # noqa: E402


@pytest.mark.parametrize("mode", ["no_buffer", "extra_buffer"])
@pytest.mark.parametrize("pools", ["own", "foreign"])
def test_second_copy_of_a_prefix_points_at_the_tree(mode: str, pools: str) -> None:
    cache, pool, alloc = make(mode, "cpu", Foreign) if pools == "foreign" else make(mode, "cpu")
    assert cache._native == (pools == "own")
    prompt = list(range(1, 4 * CHUNK + 3))          # 4 whole chunks and a partial one
    reqs = [Req(rid=i, origin_input_ids=array("q", prompt), sampling_params=SamplingParams(max_new_tokens=4))
            for i in (1, 2)]
    for r in reqs:
        r.init_next_round_input(cache)
        assert len(r.prefix_indices) == 0
    alloc_req_slots(pool, reqs, cache)
    own = {}
    n = len(prompt)
    for r in reqs:
        cache.inc_lock_ref(r.last_node)
        kv = alloc.alloc(n)
        own[r.rid] = kv.tolist()
        pool.write((r.req_pool_idx, slice(0, n)), kv.to(torch.int32))
        r.set_extend_range(0, n)
        r.kv_committed_len = r.kv_allocated_len = n
        r.mamba_needs_clear = False
        if mode == "extra_buffer":
            cache.prepare_extend_track(r, 0, n)
    for r in reqs:
        r.output_ids.append(7)
        cache.cache_unfinished_req(r)
    first, second = reqs
    cached = 4 * CHUNK if mode == "extra_buffer" else n   # the tracked length, or the whole fill
    assert second.cache_protected_len == cached
    row = pool.req_to_token[second.req_pool_idx, :n].tolist()
    # the cached part is the first request's KV; past it, the second's own
    assert row[:cached] == own[1][:cached]
    assert row[cached:] == own[2][cached:]
    assert second.prefix_indices.tolist()[:cached] == own[1][:cached]
    # the first request's row is untouched (the tree took its indices)
    assert pool.req_to_token[first.req_pool_idx, :n].tolist() == own[1]
    # the second's copies went back to the allocator, and none is in a row
    freed = set(own[2][:cached])
    live = set(pool.req_to_token[first.req_pool_idx, :n].tolist()) | set(row)
    assert not freed & live
    cache.sanity_check()
