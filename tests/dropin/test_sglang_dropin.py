"""SGLang v0.5.15's own unit-test flows (test_mamba_pool,
test_mamba_radix_cache_1, test_insert_prev_prefix_len) run through
mambaradix.sglang, with SGLang's numbers, in two set-ups:

- "own": mambaradix's pools (everything in C);
- "foreign": pools the cache does not recognise as its own (a delegating
  wrapper here; SGLang's real pools when the sglang wheel imports), so the
  cache frees through the pools' Python methods.
"""

from __future__ import annotations

import random
from array import array
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from mambaradix import _C  # noqa: E402
from seeds import seeds  # noqa: E402
from mambaradix.sglang import (  # noqa: E402
    CacheInitParams,
    EvictParams,
    HybridReqToTokenPool,
    InsertParams,
    Mamba2CacheParams,
    Mamba2StateDType,
    Mamba2StateShape,
    MambaRadixCache,
    MatchPrefixParams,
    RadixKey,
    Req,
    SamplingParams,
    TokenToKVPoolAllocator,
)

GLOBAL_INTERVAL = 4
NUM_LAYERS = 48
MAMBA_LAYERS = [i for i in range(NUM_LAYERS) if (i + 1) % GLOBAL_INTERVAL != 0]


class Foreign:
    """Delegates everything to a pool object but is not one of ours, so the
    cache takes its 'someone else's pools' path."""

    def __init__(self, inner: Any) -> None:
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)


def _cache_params(small: bool = True) -> Mamba2CacheParams:
    # SGLang's test uses intermediate 4096 / 32 heads x 128 x 128; the flows
    # count slots, so a small state keeps the pool tensors small.
    shape = Mamba2StateShape.create(
        tp_world_size=1,
        intermediate_size=64 if small else 4096,
        n_groups=2 if small else 16,
        num_heads=4 if small else 32,
        head_dim=8 if small else 128,
        state_size=8 if small else 128,
        conv_kernel=4,
    )
    return Mamba2CacheParams(shape=shape, layers=MAMBA_LAYERS,
                             dtype=Mamba2StateDType(conv=torch.bfloat16, temporal=torch.bfloat16))


def _setup(setup: str, *, extra_buffer: bool = False):
    pool = HybridReqToTokenPool(
        size=10,
        mamba_size=20,
        mamba_spec_state_size=10,
        max_context_len=128,
        device="cpu",
        enable_memory_saver=False,
        cache_params=_cache_params(),
        mamba_layer_ids=MAMBA_LAYERS,
        enable_mamba_extra_buffer=extra_buffer,
        speculative_num_draft_tokens=3,
    )
    alloc = TokenToKVPoolAllocator(size=128, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
    p, a = (pool, alloc) if setup == "own" else (Foreign(pool), Foreign(alloc))
    params = CacheInitParams(page_size=1, disable=False, req_to_token_pool=p, token_to_kv_pool_allocator=a,
                             enable_mamba_extra_buffer=extra_buffer)
    tree = MambaRadixCache(params, chunk_size=64)
    return tree, pool, alloc


def _check(tree: MambaRadixCache, pool: HybridReqToTokenPool, alloc: TokenToKVPoolAllocator) -> None:
    tree.sanity_check()
    pool.mamba_allocator.check()
    alloc.check()
    pool.check()


def _dummy_req(pool: HybridReqToTokenPool) -> Req:
    req = Req(rid=0, origin_input_text="", origin_input_ids=array("q"),
              sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
    pool.alloc([req])
    return req


def test_mamba_pool() -> None:
    """SGLang's test_mamba_pool, numbers included."""
    pool = HybridReqToTokenPool(
        size=10, mamba_size=20, mamba_spec_state_size=10, max_context_len=128, device="cpu",
        enable_memory_saver=False, cache_params=_cache_params(), mamba_layer_ids=MAMBA_LAYERS,
        enable_mamba_extra_buffer=False, speculative_num_draft_tokens=3,
    )
    assert pool.available_size() == 10
    assert pool.mamba_allocator.available_size() == 20
    req = Req(rid=0, origin_input_text="", origin_input_ids=[], sampling_params=SamplingParams())
    pool.alloc([req])
    assert (pool.available_size(), pool.mamba_allocator.available_size()) == (9, 19)
    assert req.mamba_needs_clear
    pool.free_mamba_cache(req)
    pool.free(req)
    assert (pool.available_size(), pool.mamba_allocator.available_size()) == (10, 20)
    req.mamba_pool_idx = None
    pool.alloc([req])
    pool.free(req)
    assert (pool.available_size(), pool.mamba_allocator.available_size()) == (10, 19)
    pool.alloc([req])
    assert (pool.available_size(), pool.mamba_allocator.available_size()) == (9, 19)
    # the slot is the request's, the mapping says so
    assert int(pool.req_index_to_mamba_index_mapping[req.req_pool_idx]) == int(req.mamba_pool_idx)
    assert pool.mamba_allocator._slots.owner(int(req.mamba_pool_idx)) == req.req_pool_idx
    pool.mamba_allocator.check()
    pool.check()


@pytest.mark.parametrize("setup", ["own", "foreign"])
def test_mamba_radix_cache_1(setup: str) -> None:
    """SGLang's test_mamba_radix_cache_1 flow and assertions."""
    tree, pool, alloc = _setup(setup)
    mamba_pool = pool.mamba_pool

    def ins(tokens, req):
        kv = alloc.alloc(len(tokens))
        r = tree.insert(InsertParams(key=RadixKey(array("q", tokens)), value=kv,
                                     mamba_value=req.mamba_pool_idx.unsqueeze(-1)))
        _check(tree, pool, alloc)
        return r

    req1 = _dummy_req(pool)
    assert ins([1, 2, 3], req1).prefix_len == 0
    req2 = _dummy_req(pool)
    r2 = ins([1, 2, 3, 4, 5, 6, 7], req2)
    assert r2.prefix_len == 3
    assert alloc.available_size() == 128 - 7   # the 3 duplicate indices came back
    req3 = _dummy_req(pool)
    assert ins([10, 11, 12], req3).prefix_len == 0
    req4 = _dummy_req(pool)
    assert ins([1, 2, 3, 4, 5, 60, 70], req4).prefix_len == 5
    assert tree.total_size() == (3 + 4 + 3 + 2, 4)

    r = tree.evict(EvictParams(num_tokens=1))
    assert r.num_tokens_evicted >= 1
    _check(tree, pool, alloc)
    r = tree.evict(EvictParams(num_tokens=0, mamba_num=1))
    assert r.mamba_num_evicted >= 1
    _check(tree, pool, alloc)

    m = tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3, 4, 5]))))
    assert len(m.device_indices) == 0
    m = tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3, 4, 5, 60, 70]))))
    assert len(m.device_indices) == 7 and len(m.last_device_node.key) == 2
    m = tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3, 4, 5, 6, 7]))))
    assert len(m.device_indices) == 7 and len(m.last_device_node.key) == 2

    r = tree.evict(EvictParams(num_tokens=0, mamba_num=1))
    assert r.mamba_num_evicted >= 1
    m = tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3, 4, 5, 60, 70]))))
    assert len(m.device_indices) == 0 and len(m.last_device_node.key) == 0
    assert m.last_device_node is tree.root_node

    req9 = _dummy_req(pool)  # (SGLang's make_dummy_req allocates a slot too)
    pool.free_mamba_cache(req9)
    assert req9.mamba_pool_idx is None
    m = tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3, 4, 5, 6, 7])), req=req9, cow_mamba=True))
    last = m.last_device_node
    assert req9.mamba_pool_idx is not None
    assert int(req9.mamba_cow_src_index[0]) == int(last.mamba_value[0])
    assert req9.mamba_needs_clear is False
    # the copy is deferred to the forward: do it as the model runner would,
    # from a source slot holding values the destination does not have
    src, dst = int(last.mamba_value[0]), int(req9.mamba_pool_idx)
    gen = torch.Generator().manual_seed(3)
    cache = mamba_pool.mamba_cache
    for t in list(cache.conv) + [cache.temporal]:
        t[:, src] = torch.rand(t[:, src].shape, generator=gen).to(t.dtype) + 1
        t[:, dst] = 0
    want = [t[:, src].clone() for t in list(cache.conv) + [cache.temporal]]
    mamba_pool.copy_from(req9.mamba_cow_src_index, req9.mamba_pool_idx.reshape(1))
    for t, w in zip(list(cache.conv) + [cache.temporal], want):
        assert torch.equal(t[:, dst], w)
        assert torch.equal(t[:, src], w)
    assert "Available full tokens" in tree.available_and_evictable_str()
    _check(tree, pool, alloc)
    # every state slot is free, a request's, or the tree's
    c = pool.mamba_allocator._slots.counts()
    assert c["free"] + c["held"] + c["req"] + c["tree"] == 20
    # req1..req4's slots went to the tree with their inserts; req9 holds the
    # copy-on-write destination only.  Over foreign pools the allocator does
    # not know the tree: its states count as the callers'.
    if setup == "own":
        assert c["held"] + c["req"] == 1
        assert c["tree"] == tree.total_size()[1]
    else:
        assert c["held"] + c["req"] == 1 + tree.total_size()[1] and c["tree"] == 0


@pytest.mark.parametrize("setup", ["own", "foreign"])
def test_insert_prev_prefix_len(setup: str) -> None:
    """SGLang's test_insert_prev_prefix_len with its exact numbers."""
    tree, pool, alloc = _setup(setup)
    avail0 = alloc.available_size()

    def ins(tokens, prev):
        req = _dummy_req(pool)
        kv = alloc.alloc(len(tokens))
        r = tree.insert(InsertParams(key=RadixKey(array("q", tokens)), value=kv,
                                     mamba_value=req.mamba_pool_idx.unsqueeze(-1), prev_prefix_len=prev))
        _check(tree, pool, alloc)
        return r

    ins([1, 2, 3], 0)
    assert alloc.available_size() == avail0 - 3
    r = ins([1, 2, 3, 4, 5, 6, 7], 0)
    assert r.prefix_len == 3 and alloc.available_size() == avail0 - 7
    a = alloc.available_size()
    r = ins([1, 2, 3, 4, 5, 6, 7, 8], 2)
    assert r.prefix_len == 7 and alloc.available_size() == a - 3
    a = alloc.available_size()
    r = ins([1, 2, 3, 4, 5, 6, 7, 8, 9], 8)
    assert r.prefix_len == 8 and alloc.available_size() == a - 9


def test_extra_key_namespaces_and_root_identity() -> None:
    tree, pool, alloc = _setup("own")
    req = _dummy_req(pool)
    tree.insert(InsertParams(key=RadixKey(array("q", [1, 2, 3]), "lora-a"), value=alloc.alloc(3),
                             mamba_value=req.mamba_pool_idx.reshape(1)))
    miss = tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3, 4]))))
    hit = tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3, 4]), "lora-a")))
    assert miss.last_device_node is tree.root_node and len(miss.device_indices) == 0
    assert len(hit.device_indices) == 3 and hit.last_device_node.key.extra_key == "lora-a"
    assert hit.last_device_node.parent is tree.root_node
    assert list(tree.root_node.children.values()) == [hit.last_device_node]
    limited = tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3, 4]), "lora-a", limit=2)))
    assert len(limited.device_indices) == 0   # the cap cuts inside the node: split, no state
    _check(tree, pool, alloc)


def test_bad_input_gives_clear_errors_and_keeps_accounting() -> None:
    tree, pool, alloc = _setup("own")
    req = _dummy_req(pool)
    slot = req.mamba_pool_idx.reshape(1)
    kv = alloc.alloc(3)
    tree.insert(InsertParams(key=RadixKey(array("q", [1, 2, 3])), value=kv, mamba_value=slot))
    # the tree owns the slot and the KV now
    with pytest.raises(_C.OwnershipError, match="not owned by the caller"):
        pool.mamba_allocator.free(slot)
    with pytest.raises(_C.OwnershipError):
        alloc.free(kv)
    # a slot nobody holds cannot be inserted
    with pytest.raises(_C.OwnershipError):
        tree.insert(InsertParams(key=RadixKey(array("q", [5, 6])), value=alloc.alloc(2),
                                 mamba_value=torch.tensor([19])))
    # double free of a request's states / row
    req2 = _dummy_req(pool)
    pool.free_mamba_cache(req2)
    with pytest.raises(_C.OwnershipError, match="double free"):
        pool.free_mamba_cache(req2)
    pool.free(req2)
    with pytest.raises(ValueError, match="double free"):
        pool.free(req2)
    with pytest.raises(ValueError):
        pool._rp.free(11)   # row out of range
    with pytest.raises(ValueError, match="unlock|not locked"):
        tree.dec_lock_ref(tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3, 4])))).last_device_node)
    with pytest.raises(ValueError, match="mamba_value"):
        tree.insert(InsertParams(key=RadixKey(array("q", [7])), value=alloc.alloc(1), mamba_value=None))
    # a negative key limit (SGLang's RadixKey then has a negative length, and
    # its class raises on both calls): refused, nothing stored or freed
    sizes = (tree.full_evictable_size(), alloc.available_size(), pool.mamba_allocator.available_size())
    value = alloc.alloc(4)
    with pytest.raises(ValueError, match=r"insert\(\): key.limit must be >= 0, not -1"):
        tree.insert(InsertParams(key=RadixKey(array("q", [7, 8, 9, 10]), limit=-1), value=value, mamba_value=slot))
    with pytest.raises(ValueError, match=r"match_prefix\(\): key.limit must be >= 0, not -2"):
        tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3]), limit=-2)))
    alloc.free(value)
    assert (tree.full_evictable_size(), alloc.available_size(), pool.mamba_allocator.available_size()) == sizes
    _check(tree, pool, alloc)


def test_paged_allocator_extend_and_decode() -> None:
    """PagedTokenToKVPoolAllocator: alloc_extend fills each request's last
    partial page first, then whole new pages; alloc_decode opens a page
    only at a page boundary."""
    from mambaradix.sglang import PagedTokenToKVPoolAllocator

    ps = 4
    a = PagedTokenToKVPoolAllocator(size=64, page_size=ps, dtype=torch.float32, device="cpu", kvcache=None,
                                    need_sort=False)
    first = a.alloc(8)                     # request 0 owns pages of tokens first[0:8]
    assert first.tolist() == list(range(4, 12))
    prefix = torch.tensor([6, 0])          # request 0 has 6 tokens, request 1 none
    seq = torch.tensor([13, 5])
    last = torch.tensor([int(first[5]), -1])
    out = a.alloc_extend(prefix, prefix, seq, seq, last, int((seq - prefix).sum()))
    got = out.tolist()
    # request 0: tokens 6, 7 go to its page (10, 11), then a new page
    assert got[:2] == [10, 11]
    assert all(t // ps == got[2] // ps for t in got[2:6]) and got[6] // ps != got[2] // ps
    # request 1: 5 tokens = one whole page + 1 token of another
    assert len(got) == 7 + 5
    r1 = got[7:]
    assert r1[0] % ps == 0 and r1[:4] == list(range(r1[0], r1[0] + 4))   # one whole page
    assert r1[4] % ps == 0 and r1[4] // ps not in {t // ps for t in got[:7]}  # + 1 token of a fresh page
    pages_used = {t // ps for t in got[2:]}
    assert a.available_size() == 64 - 8 - len(pages_used) * ps
    # decode: request 1 is at 5 tokens (its page has room), request 0 at 13 (room too)
    dec = a.alloc_decode(torch.tensor([6, 14]), torch.tensor([6, 14]), torch.tensor([got[-1], got[6]]))
    assert dec.tolist() == [got[-1] + 1, got[6] + 1]
    # a boundary opens a new page
    dec = a.alloc_decode(torch.tensor([9]), torch.tensor([9]), torch.tensor([got[-1] + 3]))
    assert int(dec[0]) % ps == 0
    a.check()


def test_paged_extra_buffer_cache() -> None:
    """page_size 4 with extra_buffer: inserted keys are page aligned, matches
    are truncated to pages, accounting holds."""
    from mambaradix.sglang import PagedTokenToKVPoolAllocator

    pool = HybridReqToTokenPool(size=4, mamba_size=12, max_context_len=64, device="cpu",
                                cache_params=_cache_params(), mamba_layer_ids=MAMBA_LAYERS,
                                enable_mamba_extra_buffer=True)
    alloc = PagedTokenToKVPoolAllocator(size=128, page_size=4, dtype=torch.float32, device="cpu", kvcache=None,
                                        need_sort=False)
    tree = MambaRadixCache(CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc,
                                           page_size=4, enable_mamba_extra_buffer=True), chunk_size=64)
    req = _dummy_req(pool)
    slot = req.mamba_ping_pong_track_buffer[0].reshape(1)
    r = tree.insert(InsertParams(key=RadixKey(array("q", range(1, 9))), value=alloc.alloc(8), mamba_value=slot))
    assert r.prefix_len == 0
    with pytest.raises(ValueError, match="page_size"):
        tree.insert(InsertParams(key=RadixKey(array("q", range(1, 4))), value=alloc.alloc(4)[:3],
                                 mamba_value=req.mamba_ping_pong_track_buffer[1].reshape(1)))
    m = tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", list(range(1, 9)) + [50, 51, 52]))))
    assert len(m.device_indices) == 8
    m = tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", list(range(1, 7))))))
    assert len(m.device_indices) == 0   # 6 tokens -> one page matched, split: no state there
    tree.sanity_check()
    alloc.check()


def _sglang():
    """SGLang's classes from the wheel (tests/dropin/sglang_isolated.py), or skip
    naming the cause."""
    import sglang_isolated

    try:
        return sglang_isolated.load()
    except ImportError as e:
        pytest.skip(str(e))


@pytest.fixture
def sglang_pools():
    """SGLang's own HybridReqToTokenPool and TokenToKVPoolAllocator (the
    fixture of its test_mamba_unittest.py, without the speculative-decoding
    buffers, which SGLang allocates on "cuda"), loaded from the wheel
    (tests/dropin/sglang_isolated.py); skips naming the cause when they do not
    load."""
    import sglang_isolated

    sg = _sglang()
    sglang_isolated.configure(sg, chunk_size=64, strategy="no_buffer")
    with sg.active():
        shape = sg.Mamba2StateShape.create(tp_world_size=1, intermediate_size=64, n_groups=2, num_heads=4,
                                           head_dim=8, state_size=8, conv_kernel=4)
        pool = sg.HybridReqToTokenPool(size=10, mamba_size=20, mamba_spec_state_size=10, max_context_len=128,
                                       device="cpu", enable_memory_saver=False,
                                       cache_params=sg.Mamba2CacheParams(shape=shape, layers=MAMBA_LAYERS),
                                       mamba_layer_ids=MAMBA_LAYERS, enable_mamba_extra_buffer=False,
                                       speculative_num_draft_tokens=None)
        alloc = sg.TokenToKVPoolAllocator(size=128, dtype=torch.bfloat16, device="cpu", kvcache=None,
                                          need_sort=False)
        assert type(pool).__module__ == "sglang.srt.mem_cache.memory_pool"
        yield pool, alloc


def test_mamba_radix_cache_1_with_sglang_pools(sglang_pools) -> None:
    """test_mamba_radix_cache_1 inside SGLang's own pools: the native tree
    frees through their Python methods."""
    pool, alloc = sglang_pools
    tree = MambaRadixCache(CacheInitParams(page_size=1, disable=False, req_to_token_pool=pool,
                                           token_to_kv_pool_allocator=alloc))

    def req():
        r = Req(rid=0, origin_input_text="", origin_input_ids=array("q"), sampling_params=SamplingParams())
        pool.alloc([r])
        return r

    def ins(tokens):
        r = req()
        return tree.insert(InsertParams(key=RadixKey(array("q", tokens)), value=alloc.alloc(len(tokens)),
                                        mamba_value=r.mamba_pool_idx.unsqueeze(-1)))

    ins([1, 2, 3])
    assert ins([1, 2, 3, 4, 5, 6, 7]).prefix_len == 3
    assert alloc.available_size() == 128 - 7
    ins([10, 11, 12])
    ins([1, 2, 3, 4, 5, 60, 70])
    assert tree.evict(EvictParams(num_tokens=1)).num_tokens_evicted >= 1
    assert tree.evict(EvictParams(mamba_num=1)).mamba_num_evicted >= 1
    assert len(tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3, 4, 5])))).device_indices) == 0
    m = tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3, 4, 5, 60, 70]))))
    assert len(m.device_indices) == 7 and len(m.last_device_node.key) == 2
    tree.sanity_check()
    # SGLang's idle check: every state slot is free or the tree's (the four
    # inserting requests handed theirs to the tree)
    assert pool.mamba_allocator.available_size() + tree.mamba_evictable_size() + tree.mamba_protected_size() == 20


def test_cow_and_insert_over_sglang_pools_follow_sglangs_rules(sglang_pools) -> None:
    """Over SGLang's own pools, SGLang's rules written out by hand:

    - match_prefix(cow_mamba=True) for a request without a slot, the state
      pool empty: the matched node is locked while one state is evicted, so
      with every other state locked nothing goes (the drop-in raises, the
      matched state stays); once another state is unlocked, that one goes,
      its slot is the request's and the matched state the copy's source;
    - insert frees value[prev_prefix_len:prefix_len] (the caller's
      duplicates) through SGLang's allocator, never the tree's own prefix."""
    pool, alloc = sglang_pools
    tree = MambaRadixCache(CacheInitParams(page_size=1, disable=False, req_to_token_pool=pool,
                                           token_to_kv_pool_allocator=alloc))
    ma = pool.mamba_allocator
    keys = [[100 * (k + 1) + j for j in range(8)] for k in range(3)]
    slots, values = [], []
    for key in keys:
        slot, value = ma.alloc(1), alloc.alloc(8)
        slots.append(int(slot[0]))
        values.append(value.tolist())
        tree.insert(InsertParams(key=RadixKey(array("q", key)), value=value, mamba_value=slot))
    rest = ma.alloc(ma.available_size())       # the state pool is empty now
    assert ma.available_size() == 0

    def match(k, req=None):
        return tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", keys[k] + [7])), req=req,
                                                   cow_mamba=req is not None))

    held = [match(k).last_device_node for k in (1, 2)]
    for node in held:
        tree.inc_lock_ref(node)
    req = Req("r", "", array("q", keys[0] + [7]), SamplingParams())
    with pytest.raises(RuntimeError):
        match(0, req)
    assert match(0).device_indices.tolist() == values[0]        # its state stayed
    tree.dec_lock_ref(held[1])
    m = match(0, req)
    assert m.device_indices.tolist() == values[0]
    assert int(req.mamba_pool_idx) == slots[2] and int(req.mamba_cow_src_index[0]) == slots[0]
    assert len(match(2).device_indices) == 0                    # key 2's state went
    tree.dec_lock_ref(held[0])
    tree.sanity_check()
    # insert with a locked prefix of 4 over key 1 (cached, 8 tokens long)
    fresh = alloc.alloc(12)
    alloc.free(fresh[:4])
    before = alloc.available_size()
    value = torch.tensor(values[1][:4] + fresh[4:].tolist(), dtype=torch.int64)
    r = tree.insert(InsertParams(key=RadixKey(array("q", keys[1] + [1, 2, 3, 4])), value=value,
                                 mamba_value=rest[:1], prev_prefix_len=4))
    assert r.prefix_len == 8
    assert alloc.available_size() == before + 4                 # value[4:8], the caller's
    free = set(alloc.free_pages.tolist())
    assert not free & set(values[1]) and set(fresh[4:8].tolist()) <= free
    tree.sanity_check()


def test_plain_match_and_insert_over_sglang_pools_follow_sglangs_rules(sglang_pools) -> None:
    """match_prefix without copy-on-write and insert over SGLang's own pools,
    SGLang's rules written out by hand: insert hands the allocator
    value[prev_prefix_len:prefix_len], a slice of the caller's tensor in its
    own dtype, reports mamba_exist when the key's end has a state already,
    and reads only the tokens the key's limit leaves; a match honours the
    key's limit; a namespace never inserted and an empty key (one token as
    bigrams too) match nothing (the root).
    A node made after an eviction has a handle of its own."""
    pool, alloc = sglang_pools
    tree = MambaRadixCache(CacheInitParams(page_size=1, disable=False, req_to_token_pool=pool,
                                           token_to_kv_pool_allocator=alloc))
    from sglang_wheel import recording_frees

    freed = recording_frees(alloc)

    def ins(tokens, value, extra=None, limit=None, prev=0):
        del freed[:]
        return tree.insert(InsertParams(key=RadixKey(array("q", tokens), extra, limit=limit), value=value,
                                        mamba_value=pool.mamba_allocator.alloc(1), prev_prefix_len=prev))

    def match(tokens, extra=None, limit=None):
        return tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens), extra, limit=limit)))

    key = list(range(10, 18))
    v1, v2 = alloc.alloc(8), alloc.alloc(8)
    r = ins(key, v1)
    assert (r.prefix_len, r.mamba_exist, freed) == (0, False, [])
    r = ins(key, v2, prev=2)             # cached, with its state: v2[2:8] are the caller's duplicates
    assert (r.prefix_len, r.mamba_exist, freed) == (8, True, [(torch.int64, v2[2:].tolist())])
    v3 = alloc.alloc(10).to(torch.int32)
    r = ins(key + [1, 2], v3, prev=3)    # an int32 value: its own slice, int32
    assert (r.prefix_len, r.mamba_exist, freed) == (8, False, [(torch.int32, v3[3:8].tolist())])
    # the key's limit: 4 of the 6 tokens are inserted (4 values)
    v4 = alloc.alloc(4)
    r = ins([40, 41, 42, 43, 44, 45], v4, limit=4)
    assert (r.prefix_len, r.mamba_exist, freed) == (0, False, [])
    assert match([40, 41, 42, 43, 44, 45]).device_indices.tolist() == v4.tolist()
    # a match's limit: 9 tokens end inside the last edge, where no state is
    assert match(key + [1, 2], limit=9).device_indices.tolist() == v1.tolist()
    assert match(key + [1, 2], limit=10).device_indices.tolist() == v1.tolist() + v3[8:].tolist()
    # namespaces: the same tokens in the default one and in "a"; "b" was never inserted
    v5, v6 = alloc.alloc(3), alloc.alloc(3)
    ins([7, 8, 9], v5)
    ins([7, 8, 9], v6, extra="a")
    assert match([7, 8, 9]).device_indices.tolist() == v5.tolist()
    assert match([7, 8, 9], extra="a").device_indices.tolist() == v6.tolist()
    m = match([7, 8, 9], extra="b")
    assert len(m.device_indices) == 0 and m.last_device_node is tree.root_node
    # empty keys: no tokens, or one token as bigrams (none), though [7] is cached with a state
    ins([7], alloc.alloc(1))               # a state where [7, 8, 9]'s edge splits
    assert match([7]).device_indices.tolist() == v5[:1].tolist()
    # (an empty tensor too: SGLang asks len(key) first, so any empty sequence is a miss)
    for k in (RadixKey(array("q")), RadixKey(array("q", [7]), is_bigram=True),
              RadixKey(torch.tensor([], dtype=torch.int64))):
        m = tree.match_prefix(MatchPrefixParams(key=k))
        assert m.device_indices.shape == (0,) and m.device_indices.dtype == torch.int64
        assert m.last_device_node is tree.root_node and m.mamba_branching_seqlen is None
    # a node made after an eviction (under a node id the tree reuses) gets its own handle
    held = [match(k).last_device_node for k in (key, [40, 41, 42, 43], [7, 8, 9])]
    assert tree.evict(EvictParams(num_tokens=10**6)).num_tokens_evicted == 20 and tree.total_size() == (0, 0)
    ins([90, 91], alloc.alloc(2))
    ins([90, 91, 92], alloc.alloc(3))
    for k in ([90, 91], [90, 91, 92]):
        node = match(k).last_device_node
        assert node.valid and list(node.key) == k[len(k) - len(node):]
    assert not any(h.valid for h in held)
    tree.sanity_check()


def test_register_with_sglang() -> None:
    """register() against SGLang's own registry module (from the wheel)."""
    import mambaradix.sglang as mrs

    sg = _sglang()
    if sg.isolated:
        assert mrs.register() is False   # SGLang as installed does not import: nothing to register with
    with sg.active():
        from sglang.srt.mem_cache import registry  # type: ignore

        assert registry.__file__.endswith("registry.py")
        assert mrs.register() is True
        assert registry.get_radix_cache_factory("mambaradix") is mrs._factory
        assert mrs.register() is True   # idempotent


def test_admission_rejects_slots_the_request_does_not_own() -> None:
    tree, pool, alloc = _setup("own")
    req = _dummy_req(pool)
    slot = req.mamba_pool_idx
    tree.insert(InsertParams(key=RadixKey(array("q", [1, 2])), value=alloc.alloc(2), mamba_value=slot.reshape(1)))
    other = Req(rid=1, origin_input_ids=array("q", [5]))
    other.mamba_pool_idx = slot                      # the tree's slot now
    with pytest.raises(_C.OwnershipError, match="owned by the tree"):
        pool.alloc([other])
    other.mamba_pool_idx = torch.tensor(17)          # a free slot
    with pytest.raises(_C.OwnershipError, match="free"):
        pool.alloc([other])
    assert other.req_pool_idx is None
    _check(tree, pool, alloc)


@pytest.mark.parametrize("seed", seeds(2))
def test_paged_allocator_order_matches_sglangs(seed) -> None:
    """The same random allocs and frees (several pages at a time) through our
    PagedTokenToKVPoolAllocator and SGLang's own (from the wheel): the same
    indices, in the same order, every time."""
    import random

    from mambaradix.sglang import PagedTokenToKVPoolAllocator

    sg = _sglang()
    rng = random.Random(seed)
    ps = 4
    with sg.active():
        theirs = sg.PagedTokenToKVPoolAllocator(size=128, page_size=ps, dtype=torch.float32, device="cpu",
                                                kvcache=None, need_sort=False)
        ours = PagedTokenToKVPoolAllocator(size=128, page_size=ps, dtype=torch.float32, device="cpu",
                                           kvcache=None, need_sort=False)
        held = []
        for step in range(400):
            if held and rng.random() < 0.45:
                k = min(len(held), rng.randint(1, 3))       # free several allocations at once
                pick = [held.pop(rng.randrange(len(held))) for _ in range(k)]
                theirs.free(torch.cat([p[0] for p in pick]))
                ours.free(torch.cat([p[1] for p in pick]))
            else:
                n = ps * rng.randint(1, 3)
                a, b = theirs.alloc(n), ours.alloc(n)
                assert (a is None) == (b is None), step
                if a is not None:
                    assert b.tolist() == a.tolist(), step
                    held.append((a, b))
            assert ours.available_size() == theirs.available_size(), step


@pytest.mark.parametrize("setup", ["own", "foreign"])
def test_insert_duplicates_inside_a_free_group_come_back_at_its_end(setup: str) -> None:
    """An insert frees the caller's KV indices the tree already had; inside
    the allocator's free group (SGLang's scheduler opens one around a
    batch's results) they come back at the group's end, as SGLang's
    allocator does, and a second free of one of them fails at once."""
    tree, pool, alloc = _setup(setup)
    a_kv = alloc.alloc(6)
    tree.insert(InsertParams(key=RadixKey(array("q", [1, 2, 3, 4, 5, 6])), value=a_kv,
                             mamba_value=pool.mamba_allocator.alloc(1)))
    b_kv = alloc.alloc(8)
    free0 = alloc.available_size()
    alloc.free_group_begin()
    r = tree.insert(InsertParams(key=RadixKey(array("q", [1, 2, 3, 4, 5, 6, 7, 8])), value=b_kv,
                                 mamba_value=pool.mamba_allocator.alloc(1)))
    assert r.prefix_len == 6
    assert alloc.available_size() == free0          # the 6 duplicates wait for the group's end
    _check(tree, pool, alloc)
    with pytest.raises(_C.OwnershipError, match="double free"):
        alloc.free(b_kv[:1])                        # freed by the insert already
    _check(tree, pool, alloc)
    alloc.free_group_end()
    assert alloc.available_size() == free0 + 6
    assert sorted(alloc.alloc(alloc.available_size()).tolist()[-6:]) == b_kv[:6].tolist()
    _check(tree, pool, alloc)
