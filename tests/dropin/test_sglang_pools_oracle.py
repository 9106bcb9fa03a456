"""The drop-in under SGLang v0.5.15's own scheduler admission, over both pool
sets, against SGLang's own classes, with a small state pool.

Three set-ups run the same requests through the reference driver, whose
admission is SGLang's own ``alloc_req_slots`` (read from the wheel's
common.py: it reads ``mamba_allocator.schedulable_available_size()``, calls
``tree_cache.evict(mamba_num=...)``, then ``req_to_token_pool.alloc``):

- "sglang": SGLang's MambaRadixCache over SGLang's HybridReqToTokenPool,
  MambaSlotAllocator and TokenToKVPoolAllocator (all from the wheel's files);
- "dropin-sglang-pools": mambaradix.sglang's MambaRadixCache over those same
  SGLang pools;
- "dropin-own-pools": mambaradix.sglang's MambaRadixCache over its own pools.

After every scheduler step the free rows, free state slots, free KV tokens,
and the cache's evictable and protected sizes must equal SGLang's, every
state slot and KV index must be exactly one of free, cached or a live
request's (over SGLang's pools; the drop-in's own pools check their owners
themselves), and every request must get the same prefix.  The state pool is small enough that the
headroom eviction runs.  SGLang's function checks
``isinstance(pool, HybridReqToTokenPool)`` against its own class, so over
mambaradix's pools it skips that eviction; the drop-in's pool takes the same
headroom itself.  (With small pools SGLang's own classes often stop on an
assertion of theirs -- a slot for cache_unfinished_req, a track buffer at
admission; the configurations below are ones they run through.)  Needs torch
and the sglang 0.5.15 wheel.
"""

from __future__ import annotations

import random
import types
from array import array

import pytest

torch = pytest.importorskip("torch")

from test_sglang_oracle import SG, SKIP_REASON, _SERVER_ARGS  # noqa: E402

pytestmark = pytest.mark.skipif(SG is None, reason="SGLang oracle unavailable: %s" % SKIP_REASON)

from mambaradix import sglang as mrs  # noqa: E402
from mambaradix.driver import DriverConfig, DriverRequest, SchedulerDriver, api_from_module  # noqa: E402
from sglang_wheel import wheel  # noqa: E402,F401  (a fixture)

CHUNK = 64
CTX = 4096


def _sglang_cache(sg, pool, alloc, cfg, page_size=1):
    _SERVER_ARGS.mamba_cache_chunk_size = CHUNK
    params = types.SimpleNamespace(
        req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=page_size, disable=False,
        enable_kv_cache_events=False, enable_mamba_extra_buffer=cfg.extra_buffer,
        enable_mamba_extra_buffer_lazy=cfg.lazy, enable_metrics=False)
    return sg.MambaRadixCache(params)


def _dropin_cache(pool, alloc, cfg, page_size=1):
    init = mrs.CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc,
                               page_size=page_size, enable_mamba_extra_buffer=cfg.extra_buffer,
                               enable_mamba_extra_buffer_lazy=cfg.lazy)
    return mrs.MambaRadixCache(init, chunk_size=CHUNK, track_interval=cfg.track_interval)


def _own_pools(cfg, rows, slots, kv, page_size=1):
    shape = mrs.Mamba2StateShape(conv=[(1,)], temporal=(1,), intermediate_size=1, conv_dim=1,
                                 ssm_state_size=1, num_heads=1, head_dim=1, state_size=1, conv_kernel=2)
    params = mrs.Mamba2CacheParams(shape=shape, layers=[0],
                                   dtype=mrs.Mamba2StateDType(conv=torch.int64, temporal=torch.int64))
    pool = mrs.HybridReqToTokenPool(
        size=rows, mamba_size=slots, mamba_spec_state_size=0, max_context_len=CTX, device="cpu",
        enable_memory_saver=False, cache_params=params, mamba_layer_ids=[0],
        enable_mamba_extra_buffer=cfg.extra_buffer, enable_mamba_extra_buffer_lazy=cfg.lazy,
        enable_overlap_schedule=cfg.overlap, mamba_cache_chunk_size=CHUNK,
        mamba_track_interval=cfg.track_interval)
    if page_size == 1:
        alloc = mrs.TokenToKVPoolAllocator(kv, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
    else:
        alloc = mrs.PagedTokenToKVPoolAllocator(kv, page_size, dtype=torch.bfloat16, device="cpu", kvcache=None,
                                                need_sort=False)
    return pool, alloc


def _sizes(d):
    return _sizes_of(d.tree_cache, d.req_to_token_pool, d.allocator)


def _sizes_of(cache, pool, alloc):
    return (pool.available_size(), pool.mamba_allocator.available_size(), alloc.available_size(),
            cache.full_evictable_size(), cache.full_protected_size(), cache.mamba_evictable_size(),
            cache.mamba_protected_size())


def _partition(d, name):
    """Over SGLang's pools (no ownership records there): every state slot is
    exactly one of free, the tree's, or a live request's (running or track
    buffer), and every KV page (token at page size 1) one of free, the
    tree's (the tree holds whole pages), or a live request's own (the pages
    of its table positions from cache_protected_len to kv_allocated_len)."""
    pool, cache, alloc = d.req_to_token_pool, d.tree_cache, d.allocator
    page = int(getattr(alloc, "page_size", 1))
    slots = pool.mamba_allocator.free_slots.tolist() + cache.all_mamba_values_flatten().tolist()
    tree = sorted(int(x) for x in cache.all_values_flatten().tolist())
    tree_pages = sorted({t // page for t in tree})
    assert tree == [p * page + k for p in tree_pages for k in range(page)], (name, "the tree's KV is not whole pages")
    pages = alloc.free_pages.tolist() + tree_pages
    for req in d.live_requests():
        if req.mamba_pool_idx is not None:
            slots.append(int(req.mamba_pool_idx))
        if req.mamba_ping_pong_track_buffer is not None:
            slots += [int(x) for x in req.mamba_ping_pong_track_buffer.tolist() if int(x) != -1]
        if req.req_pool_idx is not None:
            own = [int(x) for x in pool.req_to_token[req.req_pool_idx, req.cache_protected_len:req.kv_allocated_len]]
            assert len(set(own)) == len(own), (name, req.rid, "a KV index twice in a row")
            pages += sorted({t // page for t in own})
    assert sorted(int(x) for x in slots) == list(range(1, pool.mamba_allocator.size + 1)), (name, "state slots")
    assert sorted(int(x) for x in pages) == list(range(1, alloc.size // page + 1)), (name, "KV pages")


SIZE_NAMES = ("free rows", "free state slots", "free KV", "full evictable", "full protected",
              "state evictable", "state protected")


def _workload(seed, n):
    rng = random.Random(seed)
    stems = [[rng.randrange(1, 5000) for _ in range(rng.randrange(64, 400))] for _ in range(4)]
    out = []
    for i in range(n):
        s = rng.choice(stems)
        prompt = s[: rng.randrange(1, len(s))] + [rng.randrange(1, 5000) for _ in range(rng.randrange(1, 160))]
        out.append((i * 2 // 3, DriverRequest(f"r{i}", prompt, rng.randrange(1, 40))))
    return out


CONFIGS = [("pp2", 12, 2, 1, None), ("pp2", 12, 2, 1, 128), ("pp2", 12, 2, 2, None), ("pp1", 12, 2, 1, None),
           ("pp1", 9, 2, 1, None), ("lazy", 12, 3, 1, None), ("lazy", 9, 2, 1, 128), ("no_buffer", 12, 3, 1, 128),
           ("no_buffer", 9, 2, 1, 128)]


def _run_three(w, sg, cfg, rows, slots, kv, arrivals, compare_rows=False):
    """The three set-ups (module docstring) over the same arrivals
    [(step, DriverRequest)], compared after every step; returns the drivers
    and what SGLang's cache evicted: .headroom, the states its admission
    evicted at each of its calls; .kv, the KV tokens of each evict_full.
    compare_rows: every live request's KV table row must hold the same
    indices in all three as well (the KV allocators hand out the same
    indices when the caches free the same ones in the same order)."""
    page = cfg.page_size
    sg_api = types.SimpleNamespace(RadixKey=sg.RadixKey, MatchPrefixParams=sg.MatchPrefixParams,
                                   EvictParams=sg.EvictParams, Req=mrs.Req, SamplingParams=mrs.SamplingParams)
    ours_api = api_from_module(mrs)
    drivers = {}
    evicted = types.SimpleNamespace(headroom=[], kv=[])
    for name in ("sglang", "dropin-sglang-pools", "dropin-own-pools"):
        if name == "dropin-own-pools":
            pool, alloc = _own_pools(cfg, rows, slots, kv, page)
        else:
            pool, alloc = w.make_pools(sg, size=rows, mamba_size=slots, max_context_len=CTX, kv_size=kv,
                                       extra_buffer=cfg.extra_buffer, lazy=cfg.lazy, overlap=cfg.overlap,
                                       page_size=page)
        if name == "sglang":
            cache, api, evict = _sglang_cache(sg, pool, alloc, cfg, page), sg_api, sg.EvictParams
        else:
            cache, api, evict = _dropin_cache(pool, alloc, cfg, page), ours_api, mrs.EvictParams
        admit = w.alloc_req_slots_for(sg, evict)
        if name == "sglang":
            def admit(pool, reqs, cache, _admit=admit):
                before = cache.mamba_evictable_size()
                out = _admit(pool, reqs, cache)
                evicted.headroom.append(before - cache.mamba_evictable_size())
                return out

            def evict_full(n, _evict_full=cache.evict_full):
                out = _evict_full(n)
                evicted.kv.append(out)
                return out
            cache.evict_full = evict_full
        drivers[name] = SchedulerDriver(cfg, cache, pool, alloc, api=api, alloc_req_slots=admit)
    step = 0
    while step < 5000:
        for _, d in drivers.items():
            for at, req in arrivals:
                if at == step:
                    d.submit(DriverRequest(req.rid, list(req.input_ids), req.output_len))
        if step > arrivals[-1][0] and all(d.idle for d in drivers.values()):
            break
        for d in drivers.values():
            d.step()
        want = _sizes(drivers["sglang"])
        for name in ("sglang", "dropin-sglang-pools"):
            _partition(drivers[name], name)
        drivers["dropin-own-pools"].tree_cache.sanity_check()
        for name, d in drivers.items():
            got = _sizes(d)
            assert got == want, "step %d, %s: %s" % (
                step, name, {n: (g, x) for n, g, x in zip(SIZE_NAMES, got, want) if g != x})
        if compare_rows:
            rows_of = {name: _live_rows(d) for name, d in drivers.items()}
            for name in ("dropin-sglang-pools", "dropin-own-pools"):
                assert rows_of[name] == rows_of["sglang"], "step %d, %s: KV rows differ" % (step, name)
        step += 1
    assert all(d.idle for d in drivers.values())
    prefixes = {name: [d.records[r.rid].prefix_len for _, r in arrivals] for name, d in drivers.items()}
    assert prefixes["dropin-sglang-pools"] == prefixes["sglang"]
    assert prefixes["dropin-own-pools"] == prefixes["sglang"]
    for d in drivers.values():
        d.tree_cache.sanity_check()
    return drivers, evicted


def _live_rows(d):
    table = d.req_to_token_pool.req_to_token
    return {r.rid: table[r.req_pool_idx, :r.kv_allocated_len].tolist() for r in d.live_requests()
            if r.req_pool_idx is not None}


@pytest.mark.parametrize("mode,slots,max_running,seed,chunked", CONFIGS)
def test_state_pool_pressure_matches_sglang(wheel, mode, slots, max_running, seed, chunked):
    w, sg = wheel
    cfg = DriverConfig(mode=mode, chunk_size=CHUNK, track_interval=32, max_running=max_running,
                       chunked_prefill_size=chunked, new_token_ratio=1.0)
    _, evicted = _run_three(w, sg, cfg, 6, slots, 20000, _workload(seed, 14), compare_rows=True)
    assert any(evicted.headroom), "the state pool was never short at admission"


@pytest.mark.parametrize("mode,slots,max_running,seed,chunked", [("pp2", 12, 2, 2, None), ("pp1", 9, 2, 1, None),
                                                                 ("lazy", 9, 2, 1, 128)])
def test_kv_pool_pressure_matches_sglang(wheel, mode, slots, max_running, seed, chunked):
    """The same with a KV pool small enough that freed indices come back
    soon (and the tree's KV is evicted): every live request's KV row holds
    the same indices in all three, so the caches freed the same indices in
    the same order (a finished request's tail before its duplicates, as
    SGLang's cache_finished_req)."""
    w, sg = wheel
    cfg = DriverConfig(mode=mode, chunk_size=CHUNK, track_interval=32, max_running=max_running,
                       chunked_prefill_size=chunked, new_token_ratio=1.0)
    _, evicted = _run_three(w, sg, cfg, 6, slots, 800, _workload(seed, 14), compare_rows=True)
    assert sum(evicted.kv) > 0, "the tree's KV was never evicted"


def _three_caches(w, sg, cfg, page):
    """(name, pool, KV allocator, cache, api) of SGLang's cache over its
    pools, the drop-in over SGLang's pools and the drop-in over its own, in
    extra_buffer mode: 4 rows, 16 state slots, 1024 KV tokens in pages of
    `page`; one at a time (the next is built when the caller asks)."""
    for name in ("sglang", "dropin", "dropin-own-pools"):
        if name == "dropin-own-pools":
            pool, alloc = _own_pools(cfg, 4, 16, 1024, page)
        else:
            pool, alloc = w.make_pools(sg, size=4, mamba_size=16, max_context_len=CTX, kv_size=1024,
                                       extra_buffer=True, page_size=page)
        if name == "sglang":
            yield name, pool, alloc, _sglang_cache(sg, pool, alloc, cfg, page), sg
        else:
            yield name, pool, alloc, _dropin_cache(pool, alloc, cfg, page), mrs


@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("grouped", [False, True])
def test_insert_frees_the_same_duplicates_as_sglang(wheel, grouped, page):
    """Direct inserts over SGLang's own pools and over ours, with protected
    lengths that leave no, one, some and all of the cached tokens as
    duplicates, some across several nodes (and values that are views into
    a larger tensor, as a request's row is): the KV allocator must have the
    same number of free indices after every insert (inside a free group:
    the duplicates wait for its end) and end with the same free list, in
    the same order, under the drop-in as under SGLang's class.  With pages
    SGLang frees the duplicates node by node, each call's pages going,
    sorted, to the head of its free list."""
    sglang_wheel, sg = wheel
    cfg = types.SimpleNamespace(extra_buffer=True, lazy=False, track_interval=CHUNK, overlap=True)
    rng = random.Random(3)
    stem = [rng.randrange(1, 5000) for _ in range(96)]
    if page == 1:
        keys = [stem[:40], stem[:64], stem[:64] + [7, 8], stem[:80], stem, stem[:41] + [9] * 5]
        prevs = [0, 39, 65, 0, 79, 41]
    else:   # whole pages; prev_prefix_len a page multiple (a protected length)
        keys = [stem[:40], stem[:64], stem[:64] + [7, 8, 9, 10], stem[:80], stem, stem[:44] + [9] * 4, stem,
                stem[:88]]
        prevs = [0, 36, 64, 0, 0, 40, 48, 8]
    pad = 1 if page == 1 else page
    runs = {}
    for name, pool, alloc, cache, api in _three_caches(sglang_wheel, sg, cfg, page):
        if grouped:
            alloc.free_group_begin()
        sizes = []
        for key, prev in zip(keys, prevs):
            row = alloc.alloc(len(key) + 2 * pad)    # the value is a view, as req_to_token's row is
            slot = pool.mamba_allocator.alloc(1)
            r = cache.insert(api.InsertParams(key=api.RadixKey(array("q", key), None),
                                              value=row[pad:pad + len(key)], mamba_value=slot, prev_prefix_len=prev))
            sizes.append(alloc.available_size())
            alloc.free(row[:pad])
            alloc.free(row[pad + len(key):])
            if r.mamba_exist:
                pool.mamba_allocator.free(slot)
        if grouped:
            alloc.free_group_end()
        runs[name] = (sizes, alloc.available_size(), cache.full_evictable_size(),
                      sorted(cache.all_values_flatten().tolist()), alloc.alloc(alloc.available_size()).tolist())
    assert runs["dropin"] == runs["sglang"]
    assert runs["dropin-own-pools"] == runs["sglang"]


def test_paged_evict_frees_node_by_node_as_sglang(wheel):
    """Page size 4: keys that share prefixes (nodes of several pages,
    split by later keys), then evictions of a few tokens, of states, and of
    everything, over SGLang's paged allocator (SGLang's cache and the
    drop-in) and over ours: SGLang frees each evicted node's KV with a call
    of its own, each call's pages going, sorted, to the head of the free
    list, so the free list must be the same after every step."""
    w, sg = wheel
    page = 4
    cfg = types.SimpleNamespace(extra_buffer=True, lazy=False, track_interval=CHUNK, overlap=True)
    rng = random.Random(5)
    stems = [[rng.randrange(1, 5000) for _ in range(96)] for _ in range(2)]
    keys = [stems[0][:32], stems[0][:64], stems[1][:48], stems[0][:48] + [7] * 8, stems[1], stems[0][:16] + [8] * 12,
            stems[0]]
    runs = {}
    for name, pool, alloc, cache, api in _three_caches(w, sg, cfg, page):
        for key in keys:
            # what the tree has already comes back as duplicates (node by node)
            cache.insert(api.InsertParams(key=api.RadixKey(array("q", key), None), value=alloc.alloc(len(key)),
                                          mamba_value=pool.mamba_allocator.alloc(1)))
        seen = []
        for tokens, states in ((8, 0), (0, 2), (40, 0), (0, 1), (10 ** 6, 0)):
            cache.evict(api.EvictParams(num_tokens=tokens, mamba_num=states))
            seen.append((alloc.available_size(), alloc.free_pages.tolist() if name != "dropin-own-pools" else None,
                         cache.full_evictable_size(), cache.mamba_evictable_size()))
        runs[name] = (seen, alloc.alloc(alloc.available_size()).tolist())
    assert runs["dropin"] == runs["sglang"]
    own = runs["dropin-own-pools"]
    assert [s[:1] + s[2:] for s in own[0]] == [s[:1] + s[2:] for s in runs["sglang"][0]]
    assert own[1] == runs["sglang"][1]


@pytest.mark.parametrize("mode", ["pp2", "no_buffer"])
def test_copy_on_write_with_no_free_slot_keeps_the_matched_state(wheel, mode):
    """match_prefix(cow_mamba=True) for a request without a slot, the state
    pool full: SGLang locks the matched node, evicts one state, unlocks and
    allocates again.  With every other cached state locked by running
    requests there is nothing to evict: no slot, and the matched state stays
    (SGLang stops on its assertion, the drop-in raises RuntimeError).  Once
    one other state is unlocked, that one goes and the request gets its
    slot; the matched state stays the copy's source.  Over both pool sets."""
    w, sg = wheel
    cfg = DriverConfig(mode=mode, chunk_size=CHUNK, track_interval=32)
    L = 2 * CHUNK
    keys = [[1000 * (k + 1) + j for j in range(L)] for k in range(3)]
    got = {}
    for name in ("sglang", "dropin-sglang-pools", "dropin-own-pools"):
        if name == "dropin-own-pools":
            pool, alloc = _own_pools(cfg, 4, len(keys), 4096)
            api = mrs
        else:
            pool, alloc = w.make_pools(sg, size=4, mamba_size=len(keys), max_context_len=CTX, kv_size=4096,
                                       extra_buffer=cfg.extra_buffer, lazy=cfg.lazy, overlap=cfg.overlap)
            api = sg if name == "sglang" else mrs
        cache = _sglang_cache(sg, pool, alloc, cfg) if name == "sglang" else _dropin_cache(pool, alloc, cfg)
        slots = []
        for key in keys:   # every slot of the pool cached
            slot = pool.mamba_allocator.alloc(1)
            slots.append(int(slot[0]))
            cache.insert(api.InsertParams(key=api.RadixKey(array("q", key), None), value=alloc.alloc(L),
                                          mamba_value=slot))
        assert pool.mamba_allocator.available_size() == 0

        def match(k, req=None):
            return cache.match_prefix(api.MatchPrefixParams(
                key=api.RadixKey(array("q", keys[k] + [7, 8]), None), req=req, cow_mamba=req is not None))

        held = [match(k).last_device_node for k in (1, 2)]
        for node in held:            # running requests' locks on the other two states
            cache.inc_lock_ref(node)
        req = mrs.Req("r", "", keys[0] + [7, 8], mrs.SamplingParams())
        with pytest.raises(AssertionError if name == "sglang" else RuntimeError):
            match(0, req)
        steps = [(_sizes_of(cache, pool, alloc), req.mamba_pool_idx)]
        cache.dec_lock_ref(held[1])  # key 2's state may go now (it is the only one)
        m = match(0, req)
        steps.append((_sizes_of(cache, pool, alloc), int(req.mamba_pool_idx), int(req.mamba_cow_src_index[0]),
                      len(m.device_indices)))
        cache.dec_lock_ref(held[0])
        cache.sanity_check()
        got[name] = (slots, steps)
    want = got["sglang"]
    # nothing evicted while there was nothing but the matched state: it stays
    assert want[1][0] == ((4, 0, 4096 - 3 * L, L, 2 * L, 1, 2), None)
    # then key 2's slot is the request's, key 0's state the copy's source
    assert want[1][1] == ((4, 0, 4096 - 2 * L, L, L, 1, 1), want[0][2], want[0][0], L)
    for name in ("dropin-sglang-pools", "dropin-own-pools"):
        assert got[name] == want, name


def _free_group_walk(theirs, ours, rng, alloc_sizes, split_in_group):
    """600 random steps on two allocators, SGLang's and ours: allocs (sizes
    from alloc_sizes), frees of what both hold (inside a group, split in
    two frees when split_in_group), group begins (with a group open too:
    SGLang resets its list there, so the open group's frees never come back,
    a leak; ours keeps them pending, so SGLang's list gets them back) and
    ends.  Every alloc returns the same indices, available_size() agrees
    after every step, ours stays accounted.  Ends any open group; returns
    (held index lists, nested begins, frees inside a group)."""
    held = []
    nested = grouped_frees = 0
    for step in range(600):
        op = rng.random()
        in_group = not theirs.is_not_in_free_group
        if op < 0.35:
            n = rng.choice(alloc_sizes)
            a, b = theirs.alloc(n), ours.alloc(n)
            assert (a is None) == (b is None), step
            if a is not None:
                assert b.tolist() == a.tolist(), step
                held.append(a.tolist())
        elif op < 0.65 and held:
            idx = held.pop(rng.randrange(len(held)))
            parts = [idx]
            if split_in_group and in_group and len(idx) > 1:   # the group sees a page twice
                rng.shuffle(idx)
                cut = rng.randrange(1, len(idx))
                parts = [idx[:cut], idx[cut:]]
            for part in parts:
                theirs.free(torch.tensor(part, dtype=torch.int64))
                ours.free(torch.tensor(part, dtype=torch.int64))
            grouped_frees += in_group
        elif op < 0.85:
            kept = list(theirs.free_group) if in_group else []
            nested += bool(kept)
            theirs.free_group_begin()
            theirs.free_group.extend(kept)   # what SGLang's reset would lose
            ours.free_group_begin()
        elif in_group:
            theirs.free_group_end()
            ours.free_group_end()
        assert ours.is_not_in_free_group == theirs.is_not_in_free_group, step
        assert ours.available_size() == theirs.available_size(), step
        ours.check()
    if not theirs.is_not_in_free_group:
        theirs.free_group_end()
        ours.free_group_end()
    return held, nested, grouped_frees


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_free_groups_match_sglang_allocator(wheel, seed):
    """TokenToKVPoolAllocator's free groups against SGLang's (the wheel's
    allocator/base.py and token.py), free_group_begin called while a group
    is open too (see _free_group_walk)."""
    _, sg = wheel
    theirs = sg.TokenToKVPoolAllocator(size=64, dtype=torch.bfloat16, device="cpu", kvcache=None,
                                       need_sort=False)
    ours = mrs.TokenToKVPoolAllocator(64, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
    held, nested, _ = _free_group_walk(theirs, ours, random.Random(seed), range(1, 7), False)
    assert nested > 3, "free_group_begin never ran with an open group's frees pending"
    # nothing leaked: every index not held is free, and both hand out the same ones
    assert ours.available_size() == 64 - sum(map(len, held))
    n = theirs.available_size()
    assert ours.alloc(n).tolist() == theirs.alloc(n).tolist()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_paged_free_groups_match_sglang_allocator(wheel, seed):
    """PagedTokenToKVPoolAllocator's free groups against SGLang's (the
    wheel's allocator/paged.py), inside a group a page's tokens split over
    two frees as well: a free, and a group's end, put the pages sorted at
    the head of the free list, so every alloc returns the same indices."""
    w, sg = wheel
    ps, size = 4, 128
    theirs = w.paged_allocator_class(sg)(size=size, page_size=ps, dtype=torch.bfloat16, device="cpu",
                                         kvcache=None, need_sort=False)
    ours = mrs.PagedTokenToKVPoolAllocator(size, ps, dtype=torch.bfloat16, device="cpu", kvcache=None,
                                           need_sort=False)
    held, nested, grouped = _free_group_walk(theirs, ours, random.Random(seed), [ps, 2 * ps, 3 * ps, 4 * ps], True)
    assert nested > 3 and grouped > 10
    assert ours.available_size() == size - sum(map(len, held))
    n = theirs.available_size()
    assert ours.alloc(n).tolist() == theirs.alloc(n).tolist()


def test_int64_key_tokens_past_int32_match_as_sglang(wheel):
    """match_prefix with array('q') keys (SGLang's token ids) holding a token
    outside int32 -- some equal to the cached token modulo 2**32 -- inside
    an edge compared block by block: SGLang's cache compares Python ints, so
    such a token matches nothing; the drop-in must return the same indices
    (the longest cached state's prefix before it) and the same KV split."""
    sglang_wheel, sg = wheel
    cfg = types.SimpleNamespace(extra_buffer=True, lazy=False, track_interval=CHUNK)
    rng = random.Random(11)
    stem = [rng.randrange(0, 2**31) for _ in range(256)]
    probes = []
    for _ in range(40):
        k = list(stem[:rng.randrange(40, 257)])
        at = rng.randrange(len(k))
        k[at] = rng.choice([k[at] + 2**32, k[at] - 2**32, k[at] + 2**40, 2**31, -(2**31) - 1])
        probes.append(k)
    got = {}
    for name in ("sglang", "dropin"):
        pool, alloc = sglang_wheel.make_pools(sg, size=4, mamba_size=16, max_context_len=CTX, kv_size=1024,
                                              extra_buffer=True)
        cache = _sglang_cache(sg, pool, alloc, cfg) if name == "sglang" else _dropin_cache(pool, alloc, cfg)
        api = sg if name == "sglang" else mrs
        value = alloc.alloc(len(stem))
        for n in (32, 96, 160, 256):   # a state every few blocks of 32
            cache.insert(api.InsertParams(key=api.RadixKey(array("q", stem[:n]), None), value=value[:n],
                                          mamba_value=pool.mamba_allocator.alloc(1), prev_prefix_len=n))
        out = []
        for k in probes:
            m = cache.match_prefix(api.MatchPrefixParams(key=api.RadixKey(array("q", k), None)))
            out.append((m.device_indices.tolist(), cache.full_evictable_size()))
        got[name] = (out, sorted(cache.all_values_flatten().tolist()))
    assert got["dropin"] == got["sglang"]
    assert any(len(ind) >= 96 for ind, _ in got["sglang"][0])
