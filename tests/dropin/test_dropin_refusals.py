"""Failed operations of the drop-in over its own pools, against SGLang
v0.5.15's MambaRadixCache (the wheel's file, over recording stand-in
allocators, test_sglang_oracle.SG):

- an insert whose value lists a KV index twice past the tree's own prefix
  (SGLang would free it twice, or store it twice) is refused before anything
  moves: the tree, both allocators (owners and free-list order) and the
  sizes are as before, and the same insert with a good value then gives
  SGLang's result, as if the refused one had never been made;
- a match with copy-on-write that fails after its running slot was taken
  (a MemoryError building the result) leaves the request holding that slot
  and its copy-on-write source, as SGLang's Req holds them when its
  torch.cat fails after the allocation: nothing leaks, every structure stays
  valid (our Req, and a request object that is not ours); Lifecycle.match
  without a record, whose result alone names the slot, gives it back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from array import array

import pytest

torch = pytest.importorskip("torch")

from test_sglang_oracle import SG, SKIP_REASON  # noqa: E402

from mambaradix import sglang as mrs  # noqa: E402
from sglang_wheel import wheel  # noqa: E402,F401  (a fixture)

needs_sglang = pytest.mark.skipif(SG is None, reason="SGLang oracle unavailable: %s" % SKIP_REASON)

KV = 64


def _own(page_size: int = 1):
    shape = mrs.Mamba2StateShape(conv=[(1,)], temporal=(1,), intermediate_size=1, conv_dim=1, ssm_state_size=1,
                             num_heads=1, head_dim=1, state_size=1, conv_kernel=2)
    params = mrs.Mamba2CacheParams(shape=shape, layers=[0], dtype=mrs.Mamba2StateDType(conv=torch.int64, temporal=torch.int64))
    pool = mrs.HybridReqToTokenPool(size=4, mamba_size=8, max_context_len=128, device="cpu", cache_params=params,
                                mamba_layer_ids=[0], enable_mamba_extra_buffer=page_size > 1)
    if page_size == 1:
        alloc = mrs.TokenToKVPoolAllocator(KV, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
    else:
        alloc = mrs.PagedTokenToKVPoolAllocator(KV, page_size, dtype=torch.bfloat16, device="cpu", kvcache=None,
                                            need_sort=False)
    cache = mrs.MambaRadixCache(mrs.CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc,
                                            page_size=page_size, enable_mamba_extra_buffer=page_size > 1),
                            chunk_size=64)
    return cache, pool, alloc


def _free_list(slots) -> list:
    """The free list in order (taken and given back: the same order)."""
    got = slots.alloc(slots.available_size())
    got = [] if got is None else got.tolist()
    if got:
        slots.free(got)
    return got


def _snapshot(cache, pool, alloc) -> tuple:
    kv, st = alloc._slots, pool.mamba_allocator._slots
    return (cache._lc.dump(), cache._lc.sizes(), cache._lc.lru(0), cache._lc.lru(1),
            kv.counts(), [kv.owner(i) for i in range(kv.size)], st.counts(),
            [st.owner(i) for i in range(st.size + 1)], _free_list(kv), _free_list(st))


def _ins(cache, key, value, slot, prev=0):
    return cache.insert(mrs.InsertParams(key=mrs.RadixKey(array("q", key)), value=torch.tensor(value, dtype=torch.int64),
                                     mamba_value=torch.tensor([slot]), prev_prefix_len=prev))


def _sg_ins(sg, key, value, slot, prev=0):
    return sg.insert(SG.InsertParams(key=SG.RadixKey(array("q", key), None), value=torch.tensor(value, dtype=torch.int64),
                                     mamba_value=torch.tensor([slot], dtype=torch.int64), prev_prefix_len=prev))


# (page_size, repeat: (position, copied from position), prev_prefix_len).  The
# tree holds the first page_size * 4 tokens; the new key is 1.5x longer.
CASES = {
    "in the duplicates": (1, (1, 0), 0),
    "duplicate and new": (1, (5, 0), 0),
    "in the new tokens": (1, (5, 4), 0),
    "new, past a locked prefix": (1, (5, 4), 4),
    "duplicate, past part of a locked prefix": (1, (3, 2), 2),
    "pages: duplicate page and new page": (4, (16, 0), 0),
    "pages: two new pages": (4, (20, 16), 0),
}


@needs_sglang
@pytest.mark.parametrize("case", sorted(CASES))
def test_insert_listing_a_kv_index_twice_is_refused_and_changes_nothing(case):
    ps, (at, src), prev = CASES[case]
    n_old, n_new = 4 * ps, 6 * ps
    cache, pool, alloc = _own(ps)
    old_kv = alloc.alloc(n_old).tolist()
    key = list(range(1, n_new + 1))
    _ins(cache, key[:n_old], old_kv, int(pool.mamba_allocator.alloc(1)[0]))
    new_kv = alloc.alloc(n_new).tolist()
    good = old_kv[:prev] + new_kv[prev:]      # the tree's own prefix, then the caller's indices
    bad = list(good)
    if ps == 1:
        bad[at] = bad[src]
    else:                                      # a whole page listed again in another block
        bad[at:at + ps] = bad[src:src + ps]
    slot = int(pool.mamba_allocator.alloc(1)[0])
    before = _snapshot(cache, pool, alloc)
    with pytest.raises(ValueError, match=r"insert\(\): value\[%d\] = %d is listed twice" % (at, bad[at])):
        _ins(cache, key, bad, slot, prev)
    assert _snapshot(cache, pool, alloc) == before
    cache.sanity_check()
    alloc.check()
    pool.mamba_allocator.check()
    # the good value then does what SGLang's cache does with it, as if the
    # refused insert had never been made
    sg, sg_kv, sg_slots = SG.make(page_size=ps)
    _sg_ins(sg, key[:n_old], old_kv, 1)
    sg_kv.take()
    want = _sg_ins(sg, key, good, 2, prev)
    got = _ins(cache, key, good, slot, prev)
    assert (got.prefix_len, got.mamba_exist) == (want.prefix_len, want.mamba_exist)
    freed = sg_kv.take()
    assert len(freed) == n_old - prev and all(alloc._slots.owner(i) == "free" for i in freed)
    m = cache.match_prefix(mrs.MatchPrefixParams(key=mrs.RadixKey(array("q", key))))
    w = sg.match_prefix(SG.MatchPrefixParams(key=SG.RadixKey(array("q", key), None)))
    assert m.device_indices.tolist() == w.device_indices.tolist()
    cache.sanity_check()
    alloc.check()


@needs_sglang
def test_insert_repeating_an_index_inside_the_locked_prefix_is_accepted_as_by_sglang():
    """SGLang ignores value[:prev_prefix_len] (the tree's own indices): a
    repeat there is no error for it, nor for the drop-in."""
    cache, pool, alloc = _own()
    old_kv = alloc.alloc(4).tolist()
    _ins(cache, [1, 2, 3, 4], old_kv, int(pool.mamba_allocator.alloc(1)[0]))
    value = [old_kv[0], old_kv[0], old_kv[2], old_kv[3]] + alloc.alloc(2).tolist()
    got = _ins(cache, [1, 2, 3, 4, 5, 6], value, int(pool.mamba_allocator.alloc(1)[0]), prev=4)
    sg, sg_kv, _ = SG.make()
    _sg_ins(sg, [1, 2, 3, 4], old_kv, 1)
    want = _sg_ins(sg, [1, 2, 3, 4, 5, 6], value, 2, prev=4)
    assert got.prefix_len == want.prefix_len == 4
    cache.sanity_check()
    alloc.check()


@pytest.mark.parametrize("ps", [1, 4])
def test_insert_of_an_index_freed_in_the_open_free_group_is_refused(ps):
    """Inside a free group (SGLang's scheduler frees finished requests'
    KV in one), an index the group freed is nobody's: SGLang's allocator
    hands it out again at the group's end, so a tree holding it would share
    it with the next request.  The drop-in refuses such an insert, naming
    the index, and nothing moves: once the group ends, the tree, both
    allocators (owners, free-list order) and the sizes are those of a twin
    that never tried the insert."""
    runs = []
    for attempt in (True, False):
        cache, pool, alloc = _own(ps)
        kv = alloc.alloc(4 * ps).tolist()
        slot = int(pool.mamba_allocator.alloc(1)[0])
        alloc.free_group_begin()
        alloc.free(kv[2 * ps:3 * ps])             # the third page, pending until the group's end
        if attempt:
            with pytest.raises(mrs.OwnershipError, match=r"insert\(\): value\[%d\]" % (2 * ps)):
                _ins(cache, list(range(1, 4 * ps + 1)), kv, slot)
        alloc.free_group_end()
        cache.sanity_check()
        alloc.check()
        runs.append(_snapshot(cache, pool, alloc))
    assert runs[0] == runs[1]


@pytest.mark.parametrize("ps", [1, 4])
def test_insert_of_a_tree_index_right_past_the_locked_prefix_is_refused(ps):
    """value[prev_prefix_len] (its page, paged) is the tree's own, the rest
    past it the caller's: SGLang would free it as a duplicate while its
    tree keeps it.  The drop-in refuses the insert, naming value[prev],
    and nothing moves (the tree, both allocators, their free lists)."""
    cache, pool, alloc = _own(ps)
    old_kv = alloc.alloc(4 * ps).tolist()
    key = list(range(1, 6 * ps + 1))
    _ins(cache, key[:4 * ps], old_kv, int(pool.mamba_allocator.alloc(1)[0]))
    new_kv = alloc.alloc(6 * ps).tolist()
    prev = 2 * ps
    value = old_kv[:prev + ps] + new_kv[prev + ps:]
    slot = int(pool.mamba_allocator.alloc(1)[0])
    before = _snapshot(cache, pool, alloc)
    with pytest.raises(mrs.OwnershipError, match=r"insert\(\): value\[%d\]" % prev):
        _ins(cache, key, value, slot, prev)
    assert _snapshot(cache, pool, alloc) == before
    cache.sanity_check()
    alloc.check()


# The drop-in's side of the failed match, in a child process: a long cached
# prefix, then the address space capped just above what the process uses, so
# that the match's result array (8 MiB of KV indices) cannot be allocated
# once its copy-on-write slot has been taken.  Large allocations are mmapped
# (a fixed M_MMAP_THRESHOLD), so none can reuse freed heap.
_CHILD = r"""
import ctypes, gc, json, resource, sys
from array import array
import torch
from mambaradix import sglang as mrs
libc = ctypes.CDLL(None)
libc.mallopt(-3, 128 * 1024)          # M_MMAP_THRESHOLD: large blocks mmapped, unmapped when freed
N = 1 << 20
shape = mrs.Mamba2StateShape(conv=[(1,)], temporal=(1,), intermediate_size=1, conv_dim=1, ssm_state_size=1,
                             num_heads=1, head_dim=1, state_size=1, conv_kernel=2)
params = mrs.Mamba2CacheParams(shape=shape, layers=[0], dtype=mrs.Mamba2StateDType(conv=torch.int64, temporal=torch.int64))
pool = mrs.HybridReqToTokenPool(size=2, mamba_size=4, max_context_len=16, device="cpu", cache_params=params,
                                mamba_layer_ids=[0], enable_mamba_extra_buffer=False)
alloc = mrs.TokenToKVPoolAllocator(N, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
cache = mrs.MambaRadixCache(mrs.CacheInitParams(disable=False, req_to_token_pool=pool,
                                                token_to_kv_pool_allocator=alloc, page_size=1), chunk_size=64)
L = N - 8
key = array("q", range(1, L + 1))
node_slot = int(pool.mamba_allocator.alloc(1)[0])
cache.insert(mrs.InsertParams(key=mrs.RadixKey(key), value=alloc.alloc(L), mamba_value=torch.tensor([node_slot])))
if sys.argv[1] in ("ours", "bare"):
    req = mrs.Req(rid="r", origin_input_ids=key + array("q", [7]))
else:   # a request object that is not ours: the cache writes its fields back
    import types
    req = types.SimpleNamespace(rid="r", mamba_pool_idx=None, mamba_ping_pong_track_buffer=None,
                                mamba_next_track_idx=None, mamba_last_track_seqlen=None,
                                mamba_branching_seqlen=None, mamba_cow_src_index=None, mamba_needs_clear=True,
                                mamba_lazy_is_insert=False, cache_protected_len=0, req_pool_idx=None)
mkey = mrs.RadixKey(key + array("q", [7]))
free0 = pool.mamba_allocator.available_size()
params = mrs.MatchPrefixParams(key=mkey, cow_mamba=True, req=req)
gc.collect()
libc.malloc_trim(0)
vm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:")][0] * 1024
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 20), hard))
try:
    if sys.argv[1] == "bare":   # Lifecycle.match without a record: the slot is only in the result
        cache._lc.match(mkey.token_ids, cow=True)
    else:
        cache.match_prefix(params)
    raised = None
except MemoryError:
    raised = "MemoryError"
finally:
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
out = {"raised": raised, "holds_slot": req.mamba_pool_idx is not None,
       "cow_src": None if req.mamba_cow_src_index is None else req.mamba_cow_src_index.tolist(),
       "node_slot": node_slot, "needs_clear": bool(req.mamba_needs_clear),
       "taken": free0 - pool.mamba_allocator.available_size()}
cache.sanity_check()
pool.mamba_allocator.check()
if req.mamba_pool_idx is not None:
    pool.free_mamba_cache(req)
out["taken_after_free"] = free0 - pool.mamba_allocator.available_size()
print(json.dumps(out))
"""


class _TorchCatFails:
    """torch for SGLang's cache module, whose torch.cat (building the
    match's indices, after the copy-on-write slot is taken) runs out of
    memory."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def cat(*args, **kwargs):
        raise MemoryError("torch.cat")


def _sglang_failed_match(wheel, monkeypatch) -> dict:
    """SGLang's cache over SGLang's pools: a copy-on-write match whose
    result cannot be built, and what the request and the pool are left with."""
    import types

    w, sg = wheel
    pool, alloc = w.make_pools(sg, size=2, mamba_size=4, max_context_len=16, kv_size=64, extra_buffer=False)
    cache = sg.MambaRadixCache(types.SimpleNamespace(
        req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=1, disable=False,
        enable_kv_cache_events=False, enable_mamba_extra_buffer=False, enable_mamba_extra_buffer_lazy=False,
        enable_metrics=False))
    key = list(range(1, 9))
    node_slot = pool.mamba_allocator.alloc(1)
    cache.insert(sg.InsertParams(key=sg.RadixKey(array("q", key), None), value=alloc.alloc(8), mamba_value=node_slot))
    req = types.SimpleNamespace(mamba_pool_idx=None, mamba_cow_src_index=None, mamba_needs_clear=True)
    free0 = pool.mamba_allocator.available_size()
    monkeypatch.setitem(type(cache)._match_post_processor.__globals__, "torch", _TorchCatFails())
    raised = None
    try:
        cache.match_prefix(sg.MatchPrefixParams(key=sg.RadixKey(array("q", key + [7]), None), cow_mamba=True, req=req))
    except MemoryError:
        raised = "MemoryError"
    monkeypatch.undo()
    out = {"raised": raised, "holds_slot": req.mamba_pool_idx is not None,
           "cow_src": None if req.mamba_cow_src_index is None else req.mamba_cow_src_index.reshape(-1).tolist(),
           "node_slot": int(node_slot[0]), "needs_clear": bool(req.mamba_needs_clear),
           "taken": free0 - pool.mamba_allocator.available_size()}
    if req.mamba_pool_idx is not None:   # the request's slot, freed as SGLang's free_mamba_cache does
        pool.mamba_allocator.free(req.mamba_pool_idx.reshape(1))
    out["taken_after_free"] = free0 - pool.mamba_allocator.available_size()
    return out


def _child(kind: str) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", _CHILD, kind], cwd=root, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS and /proc")
@pytest.mark.skipif(os.environ.get("MAMBARADIX_UNDER_ASAN") == "1",
                    reason="ASan aborts when an allocation fails instead of returning NULL")
@pytest.mark.parametrize("req_kind", ["ours", "plain"])
def test_copy_on_write_match_that_fails_leaves_the_request_as_sglang_does(wheel, monkeypatch, req_kind):
    want = _sglang_failed_match(wheel, monkeypatch)
    assert want["raised"] == "MemoryError" and want["holds_slot"] and want["taken"] == 1
    got = _child(req_kind)
    for out in (got, want):   # the copy-on-write source is the matched node's state
        out["cow_src"] = out["cow_src"] == [out.pop("node_slot")]
    assert got == want


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS and /proc")
@pytest.mark.skipif(os.environ.get("MAMBARADIX_UNDER_ASAN") == "1",
                    reason="ASan aborts when an allocation fails instead of returning NULL")
def test_bare_copy_on_write_match_that_fails_gives_its_slot_back():
    """Lifecycle.match(cow=True) without a record hands the slot out only in
    its result: when that cannot be built, the slot goes back."""
    got = _child("bare")
    assert got["raised"] == "MemoryError" and got["taken"] == 0


@needs_sglang
@pytest.mark.parametrize("ps", [1, 4])
def test_insert_ignores_what_the_locked_prefix_holds_as_sglang_does(ps):
    """SGLang reads nothing of value[:prev_prefix_len] inside the tree's
    own prefix: a free index, one out of the pool's range and a negative one
    there are no error for it, nor for the drop-in, which neither checks
    nor reads that part (nothing of it is stored or freed).  Right past it
    (value[prev_prefix_len], the first index the insert frees) a free index
    is still refused, naming it, with nothing changed."""
    cache, pool, alloc = _own(ps)
    old_kv = alloc.alloc(4 * ps).tolist()
    key = list(range(1, 6 * ps + 1))
    _ins(cache, key[:4 * ps], old_kv, int(pool.mamba_allocator.alloc(1)[0]))
    new_kv = alloc.alloc(2 * ps).tolist()
    freed = alloc.alloc(ps).tolist()
    alloc.free(torch.tensor(freed))             # free again: nobody's
    prev = 4 * ps
    junk = freed + [10 ** 9] * ps + [-5] * ps + old_kv[3 * ps:]
    slot = int(pool.mamba_allocator.alloc(1)[0])
    # a free index right past the locked prefix: refused, nothing moves
    before = _snapshot(cache, pool, alloc)
    with pytest.raises(mrs.OwnershipError, match=r"value\[%d\] = %d is free" % (prev, freed[0])):
        _ins(cache, key, junk + freed + new_kv[ps:], slot, prev)
    assert _snapshot(cache, pool, alloc) == before
    # a repeat inside the prefix is ignored, one past it named
    twice = junk[:ps] + junk[:ps] + junk[2 * ps:] + new_kv[:ps] + new_kv[:ps]
    with pytest.raises(ValueError, match=r"value\[%d\] = %d is listed twice" % (5 * ps, new_kv[0])):
        _ins(cache, key, twice, slot, prev)
    assert _snapshot(cache, pool, alloc) == before
    got = _ins(cache, key, junk + new_kv, slot, prev)
    sg, sg_kv, _ = SG.make(page_size=ps)
    _sg_ins(sg, key[:4 * ps], old_kv, 1)
    sg_kv.take()
    want = _sg_ins(sg, key, junk + new_kv, 2, prev)
    assert (got.prefix_len, got.mamba_exist) == (want.prefix_len, want.mamba_exist) == (4 * ps, False)
    assert sg_kv.take() == []                  # SGLang frees nothing of it either
    m = cache.match_prefix(mrs.MatchPrefixParams(key=mrs.RadixKey(array("q", key))))
    w = sg.match_prefix(SG.MatchPrefixParams(key=SG.RadixKey(array("q", key), None)))
    assert m.device_indices.tolist() == w.device_indices.tolist() == old_kv + new_kv
    assert all(alloc._slots.owner(i) == "free" for i in freed)
    cache.sanity_check()
    alloc.check()
    pool.mamba_allocator.check()
