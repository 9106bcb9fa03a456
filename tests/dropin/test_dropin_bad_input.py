"""Bad arguments to the v0.5.15 drop-in (MambaRadixCache, its pools and
allocators, Req) raise TypeError / ValueError naming the argument, before
anything changes: the tree, both allocators (owners and free lists), the
request rows and their records, the state tensors and the sizes are as
before the call, and the cache keeps working.  These are what a float
index tensor, a float slot, a bool for an int, a negative count, an int
extra_key, a None node or a 2-D index tensor used to become silently (a
truncated index, slot 3 for 3.5, a no-op, a namespace, a lock of nothing).

Where SGLang's own class is the reference (which inputs it takes at all),
it runs from the wheel's files: its lock calls take no None node, its
evict skips a count <= 0, which no SGLang caller passes (each computes a
shortfall only when there is one).  An integer tensor as a RadixKey's
token ids is read as its ints (SGLang's RadixKey types them as an array of
ints; the C tree reads any integer buffer).
"""

from __future__ import annotations

import types
from array import array

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_sglang_oracle import SG, SKIP_REASON  # noqa: E402

from mambaradix import sglang as mrs  # noqa: E402
from sglang_wheel import wheel  # noqa: E402,F401  (a fixture)
from test_dropin_refusals import _free_list  # noqa: E402
from test_sglang_pools_oracle import _dropin_cache, _own_pools  # noqa: E402

needs_sglang = pytest.mark.skipif(SG is None, reason="SGLang oracle unavailable: %s" % SKIP_REASON)

KV, SLOTS, ROWS = 64, 12, 4


def _cfg(extra_buffer: bool) -> types.SimpleNamespace:
    return types.SimpleNamespace(extra_buffer=extra_buffer, lazy=False, track_interval=64, overlap=True)


def _pools(extra_buffer: bool = True, page_size: int = 1):
    return _own_pools(_cfg(extra_buffer), ROWS, SLOTS, KV, page_size)


def _cache(pool, alloc, extra_buffer: bool = True, page_size: int = 1):
    return _dropin_cache(pool, alloc, _cfg(extra_buffer), page_size)


def _key(tokens, extra=None, limit=None):
    return mrs.RadixKey(tokens if isinstance(tokens, torch.Tensor) else array("q", tokens), extra, limit=limit)


def _ins(cache, tokens, value, slot, **kw):
    return cache.insert(mrs.InsertParams(key=_key(tokens), value=value, mamba_value=slot, **kw))


class Ctx:
    """A cache over its own pools (extra_buffer) with a cached, locked
    prefix, a request holding a row and its slots, and KV indices and a
    state slot the caller holds."""

    def __init__(self):
        self.pool, self.alloc = _pools()
        self.cache = _cache(self.pool, self.alloc)
        self.slots = self.pool.mamba_allocator
        _ins(self.cache, [1, 2, 3, 4], self.alloc.alloc(4), self.slots.alloc(1))
        _ins(self.cache, [1, 2, 5, 6], self.alloc.alloc(4), self.slots.alloc(1), prev_prefix_len=0)
        self.node = self.cache.match_prefix(mrs.MatchPrefixParams(key=_key([1, 2, 3, 4]))).last_device_node
        self.cache.inc_lock_ref(self.node)
        self.req = mrs.Req("r", origin_input_ids=[1, 2, 3, 4, 9])
        self.req.init_next_round_input(self.cache)
        self.pool.alloc([self.req])
        self.v = self.alloc.alloc(2)          # the caller's KV indices
        self.slot = self.slots.alloc(1)       # the caller's state slot

    def snapshot(self) -> tuple:
        kv, st, rp = self.alloc._slots, self.slots._slots, self.pool._rp
        state = self.pool.mamba_pool.mamba_cache
        return (self.cache._lc.dump(), self.cache._lc.sizes(), self.cache._lc.lru(0), self.cache._lc.lru(1),
                kv.counts(), [kv.owner(i) for i in range(kv.size)], st.counts(),
                [st.owner(i) for i in range(st.size + 1)], _free_list(kv), _free_list(st),
                rp.available_size(), rp.table.tolist(), rp.state_map.tolist(), rp.track_map.tolist(),
                self.req._rs.astuple(), [c.tolist() for c in state.conv], state.temporal.tolist())

    def works(self) -> None:
        """The cache still serves a match, an insert and an eviction."""
        self.cache.sanity_check()
        v = self.alloc.alloc(2)
        _ins(self.cache, [7, 8], v, self.slots.alloc(1))
        m = self.cache.match_prefix(mrs.MatchPrefixParams(key=_key([7, 8, 9])))
        assert m.device_indices.tolist() == v.tolist()
        self.cache.sanity_check()
        self.alloc.check()
        self.slots.check()


def _other_cache_node():
    pool, alloc = _pools()
    cache = _cache(pool, alloc)
    _ins(cache, [1, 2], alloc.alloc(2), pool.mamba_allocator.alloc(1))
    return cache.match_prefix(mrs.MatchPrefixParams(key=_key([1, 2]))).last_device_node


def _ip(c, **kw):
    """An InsertParams of a new key with the caller's KV and slot, kw replacing fields."""
    args = dict(key=_key([11, 12]), value=c.v, mamba_value=c.slot)
    args.update(kw)
    return mrs.InsertParams(**args)


MATCH = "match_prefix"
# (call, exception, message): each a bad argument of one public method
CASES = {
    # MambaRadixCache.insert: every tensor argument, every count, the key's fields
    "insert: float value": (lambda c: c.cache.insert(_ip(c, value=c.v.float() + 0.7)), TypeError,
                            r"insert\(\): params\.value must be an integer tensor, not torch\.float32"),
    "insert: bool value": (lambda c: c.cache.insert(_ip(c, value=c.v > 0)), TypeError, r"params\.value .*torch\.bool"),
    "insert: 2-D value": (lambda c: c.cache.insert(_ip(c, value=c.v.reshape(1, 2))), ValueError,
                          r"params\.value must be 1-dimensional, not 2-dimensional"),
    "insert: meta value": (lambda c: c.cache.insert(_ip(c, value=c.v.to("meta"))), ValueError, r"params\.value is a meta"),
    "insert: value of floats": (lambda c: c.cache.insert(_ip(c, value=[x + 0.5 for x in c.v.tolist()])), TypeError,
                                r"params\.value must hold integers, not float64"),
    "insert: float numpy value": (lambda c: c.cache.insert(_ip(c, value=c.v.numpy().astype(np.float32))), TypeError,
                                  r"params\.value must hold integers"),
    "insert: mamba_value 3.5": (lambda c: c.cache.insert(_ip(c, mamba_value=3.5)), TypeError,
                                r"insert\(\): params\.mamba_value must be an int or a one-element integer tensor, not float"),
    "insert: float mamba_value": (lambda c: c.cache.insert(_ip(c, mamba_value=c.slot.double() + 0.5)), TypeError,
                                  r"params\.mamba_value must be an integer tensor, not torch\.float64"),
    "insert: bool mamba_value": (lambda c: c.cache.insert(_ip(c, mamba_value=torch.tensor([True]))), TypeError,
                                 r"params\.mamba_value .*torch\.bool"),
    "insert: mamba_value True": (lambda c: c.cache.insert(_ip(c, mamba_value=True)), TypeError,
                                 r"params\.mamba_value .*not bool"),
    "insert: two mamba_values": (lambda c: c.cache.insert(_ip(c, mamba_value=torch.cat([c.slot, c.slot]))), ValueError,
                                 r"params\.mamba_value must hold one index, not 2"),
    "insert: prev_prefix_len -1": (lambda c: c.cache.insert(_ip(c, prev_prefix_len=-1)), ValueError,
                                   r"params\.prev_prefix_len must be >= 0, not -1"),
    "insert: prev_prefix_len 1.0": (lambda c: c.cache.insert(_ip(c, prev_prefix_len=1.0)), TypeError,
                                    r"params\.prev_prefix_len must be an int, not float"),
    "insert: prev_prefix_len True": (lambda c: c.cache.insert(_ip(c, prev_prefix_len=True)), TypeError,
                                     r"params\.prev_prefix_len must be an int, not bool"),
    "insert: int extra_key": (lambda c: c.cache.insert(_ip(c, key=_key([11, 12], extra=5))), TypeError,
                              r"insert\(\): key\.extra_key must be a str or None, not int"),
    "insert: key.limit -1": (lambda c: c.cache.insert(_ip(c, key=_key([11, 12], limit=-1))), ValueError,
                             r"key\.limit must be >= 0, not -1"),
    "insert: key.limit 1.5": (lambda c: c.cache.insert(_ip(c, key=_key([11, 12], limit=1.5))), TypeError,
                              r"key\.limit must be an int, not float"),
    "insert: float tensor key": (lambda c: c.cache.insert(_ip(c, key=_key(torch.tensor([11.0, 12.0])))), TypeError,
                                 r"insert\(\): key\.token_ids must be an integer tensor, not torch\.float32"),
    "insert: 2-D tensor key": (lambda c: c.cache.insert(_ip(c, key=_key(torch.tensor([[11, 12]])))), ValueError,
                               r"key\.token_ids must be 1-dimensional"),
    "insert: key None": (lambda c: c.cache.insert(_ip(c, key=None)), TypeError,
                         r"insert\(\): params\.key must be a RadixKey, not NoneType"),
    "insert: params None": (lambda c: c.cache.insert(None), TypeError, r"insert\(\): params must be an InsertParams"),
    # match_prefix
    "match: int extra_key": (lambda c: c.cache.match_prefix(mrs.MatchPrefixParams(key=_key([1, 2], extra=5))),
                             TypeError, r"match_prefix\(\): key\.extra_key must be a str or None, not int"),
    "match: request's int extra_key": (lambda c: mrs.Req("e", origin_input_ids=[1, 2, 3], extra_key=7)
                                       .init_next_round_input(c.cache), TypeError, r"key\.extra_key .*not int"),
    "match: key.limit -1": (lambda c: c.cache.match_prefix(mrs.MatchPrefixParams(key=_key([1, 2], limit=-1))),
                            ValueError, r"match_prefix\(\): key\.limit must be >= 0, not -1"),
    "match: key.limit True": (lambda c: c.cache.match_prefix(mrs.MatchPrefixParams(key=_key([1, 2], limit=True))),
                              TypeError, r"key\.limit must be an int, not bool"),
    "match: float tensor key": (lambda c: c.cache.match_prefix(mrs.MatchPrefixParams(key=_key(torch.tensor([1.0, 2.0])))),
                                TypeError, r"match_prefix\(\): key\.token_ids must be an integer tensor"),
    "match: token_ids None": (lambda c: c.cache.match_prefix(mrs.MatchPrefixParams(key=mrs.RadixKey(None))),
                              TypeError, r"key\.token_ids must be a sequence of ints, not NoneType"),
    "match: key a list": (lambda c: c.cache.match_prefix(mrs.MatchPrefixParams(key=[1, 2])), TypeError,
                          r"match_prefix\(\): params\.key must be a RadixKey, not list"),
    "match: params None": (lambda c: c.cache.match_prefix(None), TypeError,
                           r"match_prefix\(\): params must be a MatchPrefixParams, not NoneType"),
    # evict and its two halves
    "evict: num_tokens -5": (lambda c: c.cache.evict(mrs.EvictParams(num_tokens=-5)), ValueError,
                             r"evict\(\): params\.num_tokens must be >= 0, not -5"),
    "evict: num_tokens 2.0": (lambda c: c.cache.evict(mrs.EvictParams(num_tokens=2.0)), TypeError,
                              r"params\.num_tokens must be an int, not float"),
    "evict: num_tokens True": (lambda c: c.cache.evict(mrs.EvictParams(num_tokens=True)), TypeError,
                               r"params\.num_tokens must be an int, not bool"),
    "evict: num_tokens huge": (lambda c: c.cache.evict(mrs.EvictParams(num_tokens=10**30)), ValueError, r"num_tokens"),
    "evict: mamba_num -1": (lambda c: c.cache.evict(mrs.EvictParams(mamba_num=-1)), ValueError,
                            r"params\.mamba_num must be >= 0"),
    "evict: swa_num_tokens None": (lambda c: c.cache.evict(mrs.EvictParams(swa_num_tokens=None)), TypeError,
                                   r"params\.swa_num_tokens must be an int, not NoneType"),
    "evict: params None": (lambda c: c.cache.evict(None), TypeError, r"evict\(\): params must be an EvictParams"),
    "evict: num_tokens 1.5": (lambda c: c.cache.evict(mrs.EvictParams(num_tokens=1.5)), TypeError,
                              r"params\.num_tokens must be an int, not float"),
    "evict: mamba_num 0.5": (lambda c: c.cache.evict(mrs.EvictParams(num_tokens=0, mamba_num=0.5)), TypeError,
                             r"params\.mamba_num must be an int, not float"),
    "evict_full: -1": (lambda c: c.cache.evict_full(-1), ValueError, r"evict_full\(\): full_num_tokens must be >= 0"),
    "evict_mamba: 1.5": (lambda c: c.cache.evict_mamba(1.5), TypeError, r"evict_mamba\(\): mamba_num must be an int"),
    # locks
    "inc_lock_ref(None)": (lambda c: c.cache.inc_lock_ref(None), TypeError,
                           r"inc_lock_ref\(\): node must be a TreeNode, not NoneType"),
    "dec_lock_ref(None)": (lambda c: c.cache.dec_lock_ref(None), TypeError,
                           r"dec_lock_ref\(\): node must be a TreeNode, not NoneType"),
    "inc_lock_ref(node id)": (lambda c: c.cache.inc_lock_ref(c.node.id), TypeError, r"node must be a TreeNode, not int"),
    "dec_lock_ref(another cache's node)": (lambda c: c.cache.dec_lock_ref(_other_cache_node()), ValueError,
                                           r"dec_lock_ref\(\): node \d+ is a node of another cache"),
    # caching a request, the tracking helpers
    "cache_finished_req(None)": (lambda c: c.cache.cache_finished_req(None), TypeError,
                                 r"cache_finished_req\(\): req must be a Req, not NoneType"),
    "cache_finished_req: kv_len_to_handle -1": (lambda c: c.cache.cache_finished_req(c.req, kv_len_to_handle=-1),
                                                ValueError, r"kv_len_to_handle must be >= 0"),
    "cache_finished_req: last_node not a node of ours": (
        lambda c: (setattr(c, "_node", c.req.last_node), setattr(c.req, "last_node", object()),
                   _restore_after(c, lambda: c.cache.cache_finished_req(c.req))),
        TypeError, r"req\.last_node of request .* must be a TreeNode of this cache, not object"),
    "cache_finished_req: int extra_key": (lambda c: (setattr(c.req, "extra_key", 3), c.cache.cache_finished_req(c.req)),
                                          TypeError, r"cache_finished_req\(\): req\.extra_key must be a str or None"),
    "cache_unfinished_req(1)": (lambda c: c.cache.cache_unfinished_req(1), TypeError, r"req must be a Req, not int"),
    "prepare_extend_track: prefix_len -1": (lambda c: c.cache.prepare_extend_track(c.req, -1, 4), ValueError,
                                            r"prepare_extend_track\(\): prefix_len must be >= 0"),
    "decode_track: seq_len 5.0": (lambda c: c.cache.decode_track(c.req, 5.0), TypeError,
                                  r"decode_track\(\): seq_len must be an int, not float"),
    # the allocators
    "alloc.alloc(-1)": (lambda c: c.alloc.alloc(-1), ValueError, r"need_size must be >= 0, not -1"),
    "alloc.alloc(2.0)": (lambda c: c.alloc.alloc(2.0), TypeError, r"need_size must be an int, not float"),
    "alloc.alloc(True)": (lambda c: c.alloc.alloc(True), TypeError, r"need_size must be an int, not bool"),
    "alloc.free(float tensor)": (lambda c: c.alloc.free(c.v.float()), TypeError,
                                 r"free_index must be an integer tensor, not torch\.float32"),
    "alloc.free(2-D tensor)": (lambda c: c.alloc.free(c.v.reshape(2, 1)), ValueError, r"free_index must be 1-dimensional"),
    "alloc.free(None)": (lambda c: c.alloc.free(None), TypeError, r"free_index must be a tensor or a sequence of ints"),
    "mamba_allocator.free(floats)": (lambda c: c.slots.free([float(c.slot[0])]), TypeError,
                                     r"free_index must hold integers, not float64"),
    "mamba_allocator.alloc(None)": (lambda c: c.slots.alloc(None), TypeError, r"need_size must be an int, not NoneType"),
    "alloc_group_begin(-1)": (lambda c: c.slots.alloc_group_begin(-1), ValueError, r"num_reqs must be >= 0"),
    "free_group_end() without a group": (lambda c: c.alloc.free_group_end(), RuntimeError,
                                         r"free_group_end\(\): no free group is open"),
    # the request pool
    "pool.alloc(None)": (lambda c: c.pool.alloc(None), TypeError, r"alloc\(\): reqs must be a list of Req, not NoneType"),
    "pool.alloc([None])": (lambda c: c.pool.alloc([mrs.Req("n"), None]), TypeError,
                           r"alloc\(\): reqs\[1\] must be a Req, not NoneType"),
    "pool.free(None)": (lambda c: c.pool.free(None), TypeError, r"free\(\): req must be a Req, not NoneType"),
    "pool.alloc([r, r])": (lambda c: (lambda r: c.pool.alloc([mrs.Req("n"), r, r]))(mrs.Req("twice")), ValueError,
                           r"alloc\(\): reqs\[2\] is reqs\[1\] \(a request listed twice\)"),
    "MambaRadixCache(None)": (lambda c: mrs.MambaRadixCache(None), TypeError,
                              r"MambaRadixCache\(\): params must be a CacheInitParams .*not NoneType"),
    "get_mamba_indices(float)": (lambda c: c.pool.get_mamba_indices(torch.tensor([1.0])), TypeError,
                                 r"req_indices must be an integer tensor"),
    "mamba2_layer_cache(0.0)": (lambda c: c.pool.mamba2_layer_cache(0.0), TypeError, r"layer_id must be an int, not float"),
    "mamba2_layer_cache(False)": (lambda c: c.pool.mamba2_layer_cache(False), TypeError,
                                  r"layer_id must be an int, not bool"),
    "get_mamba_ping_pong_other_idx(1.0)": (lambda c: c.pool.get_mamba_ping_pong_other_idx(1.0), TypeError,
                                           r"mamba_next_track_idx must be an int, not float"),
    "set_mamba_ping_pong_slot: idx 2": (lambda c: c.pool.set_mamba_ping_pong_slot(c.req, 2, c.slot), ValueError,
                                        r"idx must be in \[0, 1\], not 2"),
    "set_mamba_ping_pong_slot: idx True": (lambda c: c.pool.set_mamba_ping_pong_slot(c.req, True, c.slot), TypeError,
                                           r"idx must be an int, not bool"),
    "set_mamba_ping_pong_slot: value 1.5": (lambda c: c.pool.set_mamba_ping_pong_slot(c.req, 0, 1.5), TypeError,
                                            r"value must be an int or a one-element integer tensor, not float"),
    "set_mamba_ping_pong_slot: value -2": (lambda c: c.pool.set_mamba_ping_pong_slot(c.req, 0, -2), ValueError,
                                           r"value must be a state slot or -1, not -2"),
    "donate_mamba_ping_pong_slot: float": (lambda c: c.pool.donate_mamba_ping_pong_slot(c.req, c.slot.float()),
                                           TypeError, r"new_slot must be an integer tensor"),
    "free_mamba_cache: keep True": (lambda c: c.pool.free_mamba_cache(c.req, True), ValueError,
                                    r"mamba_ping_pong_track_buffer_to_keep must be 0 or 1, not True"),
    "write: float values": (lambda c: c.pool.write((c.req.req_pool_idx, slice(0, 2)), c.v.float() + 0.7), TypeError,
                            r"write\(\): values must be an integer tensor"),
    "write: bool row": (lambda c: c.pool.write((True, slice(0, 2)), 5), TypeError, r"write\(\): indices"),
    # the state pool
    "clear_slots(float)": (lambda c: c.pool.mamba_pool.clear_slots(c.slot.float()), TypeError,
                           r"indices must be an integer tensor"),
    "clear_slots(list)": (lambda c: c.pool.mamba_pool.clear_slots([1]), TypeError, r"indices must be a tensor, not list"),
    "copy_from(float src)": (lambda c: c.pool.mamba_pool.copy_from(c.slot.float(), c.slot), TypeError,
                             r"src_indices must be an integer tensor"),
    "copy_from(2-D dst)": (lambda c: c.pool.mamba_pool.copy_from(c.slot, c.slot.reshape(1, 1)), ValueError,
                           r"dst_indices must be 1-dimensional"),
    # Req
    "Req(float ids)": (lambda c: mrs.Req("f", origin_input_ids=[1.5, 2.0]), TypeError,
                       r"origin_input_ids must hold integers, not float64"),
    "Req(float tensor ids)": (lambda c: mrs.Req("f", origin_input_ids=torch.tensor([1.5])), TypeError,
                              r"origin_input_ids must be an integer tensor"),
    "Req(one int)": (lambda c: mrs.Req("f", origin_input_ids=5), TypeError,
                     r"origin_input_ids must be a sequence of ints, not int"),
    "req.mamba_pool_idx = 3.5": (lambda c: setattr(c.req, "mamba_pool_idx", 3.5), TypeError,
                                 r"mamba_pool_idx must be an int or a one-element integer tensor, not float"),
    "req.mamba_pool_idx = -2": (lambda c: setattr(c.req, "mamba_pool_idx", -2), ValueError,
                                r"mamba_pool_idx must be a state slot \(>= 0\) or None"),
    "req.cache_protected_len = -1": (lambda c: setattr(c.req, "cache_protected_len", -1), ValueError,
                                     r"cache_protected_len must be >= 0"),
    "req.mamba_next_track_idx = 0.0": (lambda c: setattr(c.req, "mamba_next_track_idx", 0.0), TypeError,
                                       r"mamba_next_track_idx must be an int, not float"),
    "req.mamba_ping_pong_track_buffer = floats": (lambda c: setattr(c.req, "mamba_ping_pong_track_buffer", [1.5, 2.5]),
                                                  TypeError, r"mamba_ping_pong_track_buffer must hold integers"),
}


def _restore_after(c, call):
    """Runs call; the request's last_node (set aside in c._node) goes back
    afterwards, refused or not, so the snapshot compares the rest."""
    try:
        call()
    finally:
        c.req.last_node = c._node


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_argument_is_named_and_changes_nothing(case):
    call, exc, message = CASES[case]
    c = Ctx()
    before = c.snapshot()
    with pytest.raises(exc, match=message):
        call(c)
    c.req.extra_key = None      # a case may set it, to reach the check
    assert c.snapshot() == before
    c.works()


def _shape(**kw):
    args = dict(tp_world_size=1, intermediate_size=8, n_groups=1, num_heads=2, head_dim=4, state_size=4, conv_kernel=4)
    args.update(kw)
    return mrs.Mamba2StateShape.create(**args)


def _hybrid(**kw):
    args = dict(size=4, mamba_size=8, max_context_len=16, device="cpu", mamba_layer_ids=[0],
                cache_params=mrs.Mamba2CacheParams(shape=_shape(), layers=[0]), enable_mamba_extra_buffer=False)
    args.update(kw)
    return mrs.HybridReqToTokenPool(**args)


def _kv(size, page_size=None):
    kw = dict(dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
    if page_size is None:
        return mrs.TokenToKVPoolAllocator(size, **kw)
    return mrs.PagedTokenToKVPoolAllocator(size, page_size, **kw)


# (construction, exception, message): a pool with no usable slot, row or layer, a size
# torch or the C pools would refuse without naming it, a state of width <= 0
CTOR_CASES = {
    "pool size 0": (lambda: _hybrid(size=0), ValueError, r"HybridReqToTokenPool\(\): size must be >= 1, not 0"),
    "pool size 4.5": (lambda: _hybrid(size=4.5), TypeError, r"HybridReqToTokenPool\(\): size must be an int, not float"),
    "pool mamba_size 0": (lambda: _hybrid(mamba_size=0), ValueError,
                          r"HybridReqToTokenPool\(\): mamba_size must be >= 1, not 0"),
    "pool mamba_size -3": (lambda: _hybrid(mamba_size=-3), ValueError, r"mamba_size must be >= 1, not -3"),
    "pool mamba_size True": (lambda: _hybrid(mamba_size=True), TypeError, r"mamba_size must be an int, not bool"),
    "pool max_context_len 0": (lambda: _hybrid(max_context_len=0), ValueError, r"max_context_len must be >= 1, not 0"),
    "pool no layer": (lambda: _hybrid(mamba_layer_ids=[]), ValueError,
                      r"HybridReqToTokenPool\(\): mamba_layer_ids is empty"),
    "pool layer twice": (lambda: _hybrid(mamba_layer_ids=[0, 1, 0]), ValueError, r"mamba_layer_ids lists layer 0 twice"),
    "pool layer -1": (lambda: _hybrid(mamba_layer_ids=[-1]), ValueError, r"mamba_layer_ids\[0\] must be >= 0, not -1"),
    "pool layer 1.0": (lambda: _hybrid(mamba_layer_ids=[0, 1.0]), TypeError,
                       r"mamba_layer_ids\[1\] must be an int, not float"),
    "pool layers an int": (lambda: _hybrid(mamba_layer_ids=3), TypeError, r"mamba_layer_ids must be a list of ints"),
    "ReqToTokenPool size 0": (lambda: mrs.ReqToTokenPool(0, 16, "cpu"), ValueError,
                              r"ReqToTokenPool\(\): size must be >= 1, not 0"),
    "MambaPool size 0": (lambda: mrs.MambaPool(size=0, cache_params=mrs.Mamba2CacheParams(shape=_shape(), layers=[0]),
                                               mamba_layer_ids=[0], device="cpu"), ValueError,
                         r"MambaPool\(\): size must be >= 1, not 0"),
    "MambaSlotAllocator size 0": (lambda: mrs.MambaSlotAllocator(0, "cpu"), ValueError,
                                  r"MambaSlotAllocator\(\): size must be >= 1, not 0"),
    "KV allocator size 0": (lambda: _kv(0), ValueError, r"TokenToKVPoolAllocator\(\): size must be >= 1, not 0"),
    "KV allocator size 64.5": (lambda: _kv(64.5), TypeError, r"TokenToKVPoolAllocator\(\): size must be an int"),
    "paged KV allocator under a page": (lambda: _kv(3, 4), ValueError,
                                        r"PagedTokenToKVPoolAllocator\(\): size must be >= page_size \(4\)"),
    "paged KV allocator page_size 0": (lambda: _kv(64, 0), ValueError, r"page_size must be >= 1, not 0"),
    "shape conv_kernel 1": (lambda: _shape(conv_kernel=1), ValueError,
                            r"Mamba2StateShape\.create\(\): conv_kernel must be >= 2, not 1"),
    "shape intermediate_size -8": (lambda: _shape(intermediate_size=-8), ValueError,
                                   r"intermediate_size must be >= 1, not -8"),
    "shape num_heads 0": (lambda: _shape(num_heads=0), ValueError, r"num_heads must be >= 1, not 0"),
    "shape head_dim 4.0": (lambda: _shape(head_dim=4.0), TypeError, r"head_dim must be an int, not float"),
    "shape tp_world_size 0": (lambda: _shape(tp_world_size=0), ValueError, r"tp_world_size must be >= 1, not 0"),
}


@pytest.mark.parametrize("case", list(CTOR_CASES))
def test_a_pool_or_shape_that_holds_nothing_is_refused_at_construction(case):
    make, exc, message = CTOR_CASES[case]
    with pytest.raises(exc, match=message):
        make()


def test_the_smallest_pools_work():
    """One row, one state slot, one KV token (one page): each is handed
    out, and the next request finds the pool full."""
    pool = _hybrid(size=1, mamba_size=1, mamba_layer_ids=[3])
    assert pool.alloc([mrs.Req("a")]) == [1] and pool.alloc([mrs.Req("b")]) is None
    assert pool.mamba2_layer_cache(3).temporal.shape == (2, 2, 4, 4)   # slot 0 (the dummy) and slot 1
    assert _kv(1).alloc(1).tolist() == [1]
    assert _kv(4, 4).alloc(4).tolist() == [4, 5, 6, 7]   # page 0 is the padding page
    assert _shape(conv_kernel=2).conv == [(16, 1)]


@pytest.mark.parametrize("hybrid", [False, True])
def test_a_request_listed_twice_takes_no_row(hybrid):
    """SGLang's ReqToTokenPool.alloc([r, r]) takes two rows and gives r
    one: the other is held by nobody.  Both pools refuse the batch, name
    the request's place in it and take nothing."""
    pool = _hybrid() if hybrid else mrs.ReqToTokenPool(4, 16, "cpu")
    r = mrs.Req("twice")
    with pytest.raises(ValueError, match=r"alloc\(\): reqs\[1\] is reqs\[0\] \(a request listed twice\)"):
        pool.alloc([r, r])
    assert pool.available_size() == 4 and r.req_pool_idx is None
    pool.check()
    assert pool.alloc([r]) == [1]


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_paged_allocators_per_request_tensors_are_checked(page_size):
    pool, alloc = _pools(page_size=page_size)
    lens = torch.tensor([0, page_size]), torch.tensor([page_size + 1, 2 * page_size + 1])
    last = torch.tensor([-1, page_size - 1])
    if page_size == 1:
        with pytest.raises(NotImplementedError):   # only the paged allocator extends
            alloc.alloc_extend(lens[0], lens[0], lens[1], lens[1], last, 3)
        return
    before = (alloc._slots.counts(), _free_list(alloc._slots))
    for args, exc, message in [
        ((lens[0], lens[0].float(), lens[1], lens[1], last, 3), TypeError, r"prefix_lens_cpu must be an integer tensor"),
        ((lens[0], lens[0], lens[1], lens[1][:1], last, 3), ValueError, r"seq_lens_cpu has 1 elements, prefix_lens_cpu 2"),
        ((lens[0], [0, 4], lens[1], lens[1], last, 3), TypeError, r"prefix_lens_cpu must be a tensor, not list"),
    ]:
        with pytest.raises(exc, match=message):
            alloc.alloc_extend(*args)
    with pytest.raises(ValueError, match=r"seq_lens_cpu must be 1-dimensional"):
        alloc.alloc_decode(lens[1], lens[1].reshape(1, 2), last)
    with pytest.raises(TypeError, match=r"last_loc must be an integer tensor"):
        alloc.alloc_decode(lens[1], lens[1], last.double())
    assert (alloc._slots.counts(), _free_list(alloc._slots)) == before
    # the good call: each request's 5 new tokens on two new pages (page 0 is padding; the
    # second request's last page is full), the unused rest of a last page left with it
    got = alloc.alloc_extend(lens[0], lens[0], lens[1], lens[1], last, 10)
    assert got.tolist() == [4, 5, 6, 7, 8, 12, 13, 14, 15, 16]


def test_the_issue_reproducers():
    """Each was accepted silently: a float value stored truncated ([7, 8]
    for [6.7, 7.7] and the like), slot 3 for 3.5, a negative eviction as
    none, an int namespace, a lock of None."""
    pool, alloc = _pools()
    cache = _cache(pool, alloc)
    slot = pool.mamba_allocator.alloc(1)
    value = alloc.alloc(2)
    with pytest.raises(TypeError, match=r"params\.value"):
        _ins(cache, [1, 2], value.float() + 0.7, slot)
    with pytest.raises(TypeError, match=r"params\.mamba_value"):
        _ins(cache, [1, 2], value, 3.5)
    assert cache.match_prefix(mrs.MatchPrefixParams(key=_key([1, 2, 3]))).device_indices.tolist() == []
    assert cache.total_size() == (0, 0)
    _ins(cache, [1, 2], value, slot)
    with pytest.raises(ValueError, match=r"num_tokens"):
        cache.evict(mrs.EvictParams(num_tokens=-2))
    other, other_slot = alloc.alloc(2), pool.mamba_allocator.alloc(1)
    with pytest.raises(TypeError, match=r"extra_key"):
        cache.insert(mrs.InsertParams(key=_key([1, 2], extra=1), value=other, mamba_value=other_slot))
    for lock in (cache.inc_lock_ref, cache.dec_lock_ref):
        with pytest.raises(TypeError, match=r"node"):
            lock(None)
    assert cache.total_size() == (2, 1) and cache.full_protected_size() == 0
    cache.sanity_check()


@pytest.mark.parametrize("kind", ["int64", "int32", "strided"])
def test_an_integer_tensor_key_is_read_as_its_tokens(kind):
    """A 1-D integer tensor of token ids (any integer dtype, any stride) is
    the key of its ints: inserts and matches give what the same key as
    SGLang's array('q') gives on a twin cache."""
    def tensor(tokens):
        if kind == "strided":
            return torch.tensor([t for t in tokens for _ in (0, 1)], dtype=torch.int64)[::2]
        return torch.tensor(tokens, dtype=getattr(torch, kind))

    out = []
    for as_tensor in (True, False):
        pool, alloc = _pools()
        cache = _cache(pool, alloc)
        key = (lambda t: mrs.RadixKey(tensor(t))) if as_tensor else (lambda t: mrs.RadixKey(array("q", t)))
        kv = alloc.alloc(6)
        r1 = cache.insert(mrs.InsertParams(key=key([5, 6, 7, 8]), value=kv[:4], mamba_value=pool.mamba_allocator.alloc(1)))
        r2 = cache.insert(mrs.InsertParams(key=key([5, 6, 9, 10]), value=torch.cat([kv[:2], kv[4:]]),
                                           mamba_value=pool.mamba_allocator.alloc(1), prev_prefix_len=2))
        hit = cache.match_prefix(mrs.MatchPrefixParams(key=key([5, 6, 9, 10, 11])))
        limited = cache.match_prefix(mrs.MatchPrefixParams(key=mrs.RadixKey(tensor([5, 6, 7, 8]) if as_tensor
                                                                            else array("q", [5, 6, 7, 8]), limit=3)))
        out.append(((r1.prefix_len, r2.prefix_len), hit.device_indices.tolist(), limited.device_indices.tolist(),
                    cache.total_size()))
        cache.sanity_check()
    assert out[0] == out[1]
    assert out[0][1] == [1, 2, 5, 6] and out[0][0] == (0, 2)   # the hand-computed answer


@needs_sglang
def test_sglang_takes_no_none_node_and_skips_a_negative_count():
    """The reference for what is valid: SGLang's cache reads a lock call's
    node (None raises AttributeError in it; ours says which argument) and
    evicts nothing for a count <= 0 (zero is valid for both; ours refuses
    a negative one, which no SGLang caller computes)."""
    sg, sg_kv, _ = SG.make()
    sg.insert(SG.InsertParams(key=SG.RadixKey(array("q", [1, 2, 3]), None), value=torch.tensor([4, 5, 6]),
                              mamba_value=torch.tensor([1], dtype=torch.int64)))
    for lock in (sg.inc_lock_ref, sg.dec_lock_ref):
        with pytest.raises(AttributeError):
            lock(None)
    assert sg.evict(SG.EvictParams(num_tokens=-3)).num_tokens_evicted == 0
    pool, alloc = _pools(extra_buffer=False)
    cache = _cache(pool, alloc, extra_buffer=False)
    _ins(cache, [1, 2, 3], alloc.alloc(3), pool.mamba_allocator.alloc(1))
    for lock in (cache.inc_lock_ref, cache.dec_lock_ref):
        with pytest.raises(TypeError, match="node must be a TreeNode"):
            lock(None)
    with pytest.raises(ValueError, match="num_tokens must be >= 0"):
        cache.evict(mrs.EvictParams(num_tokens=-3))
    for n in (0, 2):
        want = sg.evict(SG.EvictParams(num_tokens=n)).num_tokens_evicted
        assert cache.evict(mrs.EvictParams(num_tokens=n)).num_tokens_evicted == want
    assert cache.full_evictable_size() == sg.full_evictable_size() == 0


def test_over_sglangs_pools_a_float_value_or_slot_is_refused(wheel):
    """Over SGLang's own pools (the drop-in frees through their Python
    methods) the same refusals, before the tree or SGLang's allocators
    change."""
    w, sg = wheel
    pool, alloc = w.make_pools(sg, size=2, mamba_size=4, max_context_len=16, kv_size=32, extra_buffer=False)
    cache = mrs.MambaRadixCache(mrs.CacheInitParams(disable=False, req_to_token_pool=pool,
                                                    token_to_kv_pool_allocator=alloc, page_size=1), chunk_size=64)
    value, slot = alloc.alloc(3), pool.mamba_allocator.alloc(1)
    free = (alloc.available_size(), pool.mamba_allocator.available_size())
    for bad, exc, message in [(dict(value=value.float() + 0.7), TypeError, r"params\.value must be an integer tensor"),
                              (dict(value=value.reshape(3, 1)), ValueError, r"params\.value must be 1-dimensional"),
                              (dict(mamba_value=slot.float()), TypeError, r"params\.mamba_value"),
                              (dict(mamba_value=3.5), TypeError, r"params\.mamba_value")]:
        args = dict(key=_key([1, 2, 3]), value=value, mamba_value=slot)
        args.update(bad)
        with pytest.raises(exc, match=message):
            cache.insert(mrs.InsertParams(**args))
        assert cache.total_size() == (0, 0)
        assert (alloc.available_size(), pool.mamba_allocator.available_size()) == free
    cache.insert(mrs.InsertParams(key=_key([1, 2, 3]), value=value, mamba_value=slot))
    m = cache.match_prefix(mrs.MatchPrefixParams(key=_key([1, 2, 3, 4])))
    assert m.device_indices.tolist() == value.tolist()
    cache.sanity_check()

