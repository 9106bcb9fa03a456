"""Node handles of the C tree: identity across splits, staleness after
eviction and reset, foreign handles, and reference counts / lifetimes."""

import gc
import sys
import weakref

import numpy as np
import pytest

from tree_helpers import HAVE_C, RadixTree, StaleNodeError, ints

pytestmark = pytest.mark.skipif(not HAVE_C, reason="mambaradix._C.RadixTree is not built")

NODE_PROPS = ["key", "value", "state", "parent", "children", "full_lock_ref", "state_lock_ref", "prefix_len", "extra_key", "is_root"]


def test_root_handle():
    t = RadixTree()
    r = t.root
    assert r.is_root and r.valid and r.parent is None and r.children == []
    assert len(r) == 0 and r.prefix_len == 0 and r.state is None and r.extra_key is None
    assert r.key.dtype == np.int32 and len(r.key) == 0
    assert r.value.dtype == np.int64 and len(r.value) == 0
    assert r == t.root and hash(r) == hash(t.root)
    assert "root" in repr(r)
    with pytest.raises(TypeError):
        type(r)()


def test_handles_compare_by_node():
    t = RadixTree()
    a = t.insert([1, 2, 3], [1, 2, 3], 7).node
    b = t.match_prefix([1, 2, 3]).node
    assert a == b and not (a != b) and hash(a) == hash(b) and a is not b
    assert {a: 1}[b] == 1
    assert a.parent == t.root
    assert t.lru_order("full") == [a] and t.lru_order("mamba") == [a]
    assert a != t.root and a != "a" and a != None  # noqa: E711


def test_handle_follows_the_lower_half_of_a_split():
    """As SGLang's node object: after a split the handle still names the
    node that ends where it ended (with its state and locks)."""
    t = RadixTree()
    a = t.insert([1, 2, 3, 4], [10, 11, 12, 13], 7).node
    t.inc_lock_ref(a)
    t.match_prefix([1, 2, 9])  # split after 2 tokens
    assert a.valid and a.prefix_len == 4 and a.state == 7
    assert ints(a.key) == [3, 4] and ints(a.value) == [12, 13]
    assert (a.full_lock_ref, a.state_lock_ref) == (1, 1)
    up = a.parent
    assert not up.is_root and up != a and up.state is None
    assert ints(up.key) == [1, 2] and up.full_lock_ref == 1 and up.state_lock_ref == 0
    assert up.children == [a]
    t.dec_lock_ref(a)
    assert (a.full_lock_ref, up.full_lock_ref) == (0, 0)
    t.sanity_check()


def test_stale_after_eviction():
    t = RadixTree()
    a = t.insert([1, 2], [1, 2], 1).node
    b = t.insert([1, 2, 3], [1, 2, 3], 2).node  # below a
    keep = t.insert([5], [5], 3).node
    t.match_prefix([5])
    assert t.evict_full(1).tokens_evicted == 1  # b, the LRU leaf
    assert not b.valid and a.valid and keep.valid
    for prop in NODE_PROPS:
        with pytest.raises(StaleNodeError):
            getattr(b, prop)
    with pytest.raises(StaleNodeError):
        len(b)
    assert "removed" in repr(b)
    assert b != a
    hash(b)  # still hashable
    assert isinstance(b.id, int)
    # a tombstoned internal node stays valid; a removed leaf does not
    t.insert([1, 2, 7], [1, 2, 7], 4)
    t.match_prefix([1, 2, 7])
    ev = t.evict_mamba(1)
    assert ints(ev.state_slots) == [1] and a.valid and a.state is None


def test_reused_ids_do_not_revive_old_handles():
    t = RadixTree()
    old = []
    for i in range(50):
        n = t.insert([i, i], [1, 2], i).node
        old.append(n)
        t.evict_full(2)
        assert not n.valid
    new = [t.insert([1000 + i], [3], i).node for i in range(50)]
    # ids may be reused (the generation tells the handles apart)
    for n in old:
        assert not n.valid
        assert all(n != m for m in new)
        with pytest.raises(StaleNodeError):
            t.inc_lock_ref(n)
    t.sanity_check()


def test_reset_makes_handles_stale_but_root():
    t = RadixTree()
    a = t.insert([1, 2], [1, 2], 1).node
    t.inc_lock_ref(a)
    r = t.root
    t.reset()
    assert not a.valid and r.valid and r == t.root and r.children == []
    assert t.total_size() == (0, 0) and t.node_count() == 0
    assert t.full_protected_size() == 0 and t.mamba_protected_size() == 0
    with pytest.raises(StaleNodeError):
        t.dec_lock_ref(a)
    t.inc_lock_ref(r)  # no-op
    b = t.insert([1, 2], [1, 2], 1).node
    assert b != a and b.valid
    t.sanity_check()


def test_foreign_handles():
    t1, t2 = RadixTree(), RadixTree()
    a1 = t1.insert([1], [1], 1).node
    a2 = t2.insert([1], [1], 1).node
    assert a1.id == a2.id and a1 != a2  # same id, other tree
    assert t1.root != t2.root
    for fn in (t2.inc_lock_ref, t2.dec_lock_ref):
        with pytest.raises(StaleNodeError, match="another tree"):
            fn(a1)
    with pytest.raises(StaleNodeError):
        t2.dec_lock_ref(t1.root)
    assert (a1.full_lock_ref, a2.full_lock_ref) == (0, 0)
    t1.sanity_check()
    t2.sanity_check()


def test_children_sorted_by_namespace_then_first_token():
    t = RadixTree()
    for tok in (5, 1, 3):
        t.insert([tok, 9], [tok, 9], tok)
    t.insert([2], [2], 20, extra_key="b")
    t.insert([0], [0], 21, extra_key="a")
    kids = t.root.children
    plain = [int(k.key[0]) for k in kids if k.extra_key is None]
    assert plain == [1, 3, 5]
    assert [k.extra_key for k in kids][:3] == [None, None, None]
    assert sorted(k.extra_key for k in kids[3:]) == ["a", "b"]
    for k in kids:
        assert k.parent == t.root


# --------------------------------------------------------------------------
# Reference counts and lifetimes


def test_handles_keep_their_tree_alive():
    t = RadixTree()
    w = weakref.ref(t)
    n = t.insert([1, 2, 3], [4, 5, 6], 1).node
    m = t.match_prefix([1, 2, 3])
    del t
    gc.collect()
    assert w() is not None
    assert ints(n.key) == [1, 2, 3] and n.valid
    del n
    gc.collect()
    assert w() is not None  # m.node still refers to it
    del m
    gc.collect()
    assert w() is None


def test_tree_is_freed_without_handles():
    t = RadixTree()
    for i in range(100):
        t.insert([i % 7, i], [i, i], i)
    w = weakref.ref(t)
    del t
    assert w() is None  # no cycle: freed by reference counting alone


def test_no_reference_leaks_in_calls():
    t = RadixTree(page_size=1, chunk_size=4)
    key = [1, 2, 3, 4, 5, 6]
    val = [11, 12, 13, 14, 15, 16]
    arr_key = np.array(key, dtype=np.int32)
    extra = "ns-" + str(id(t))
    objs = [t, key, val, arr_key, extra, key[0], val[0]]

    def cycle():
        r = t.insert(key, val, 5, extra_key=extra, prev_prefix_len=2)
        m = t.match_prefix(arr_key, extra)
        t.inc_lock_ref(m.node)
        t.dec_lock_ref(m.node)
        m.node.key, m.node.value, m.node.parent, m.node.children, m.node.extra_key
        t.lru_order("full"), t.lru_order("mamba"), t.pretty_print(), t.total_size()
        t.match_prefix(key[:3])
        e = t.evict_mamba(1)
        e2 = t.evict_full(100)
        del r, m, e, e2

    for _ in range(5):
        cycle()
    gc.collect()
    before = [sys.getrefcount(o) for o in objs]
    for _ in range(2000):
        cycle()
    gc.collect()
    after = [sys.getrefcount(o) for o in objs]
    assert after == before


def test_node_handles_hold_exactly_one_tree_reference():
    t = RadixTree()
    t.insert([1, 2], [1, 2], 1)
    base = sys.getrefcount(t)
    handles = [t.match_prefix([1, 2]).node for _ in range(10)]
    assert sys.getrefcount(t) == base + 10
    handles += t.lru_order("full") + t.root.children
    assert sys.getrefcount(t) == base + 12
    del handles
    assert sys.getrefcount(t) == base


def test_memory_returns_after_evicting_everything():
    t = RadixTree()
    base = t.memory_bytes()
    assert base > 0
    rng = np.random.default_rng(3)
    for rnd in range(3):
        for i in range(2000):
            k = rng.integers(0, 4, size=int(rng.integers(1, 40))).astype(np.int32)
            t.insert(k, np.arange(len(k), dtype=np.int64) + 1, i)
            if i % 3 == 0:
                t.match_prefix(rng.integers(0, 4, size=20))
        assert t.memory_bytes() > base
        t.evict_full(10**9)
        assert t.total_size() == (0, 0) and t.node_count() == 0
        # bookkeeping tables may keep their capacity, node memory must go
        after = t.memory_bytes()
        if rnd == 0:
            first = after
        assert after <= first + 4096  # no growth from round to round
        t.sanity_check()
    t.reset()
    assert t.memory_bytes() <= first
