"""Lifecycle.insert over pools refuses KV indices that are not the caller's
(the house rule: nothing changes on refusal).  Reference: the ownership
rules written out by hand -- a tree-owned index is accepted only inside the
prefix the tree already has and the caller declared locked
(prev_prefix_len), a free or pending (freed in the open free group) index
never."""

from __future__ import annotations

import numpy as np
import pytest

from mambaradix import _C


def _setup():
    st, kv, rp = _C.SlotAllocator(8), _C.SlotAllocator(64), _C.ReqPool(2, 16, 2)
    lc = _C.Lifecycle(st, kv, rp)
    a = kv.alloc(4)
    lc.insert([1, 2, 3, 4], a, int(st.alloc(1)[0]))   # the tree owns a now
    return lc, st, kv, a


def _state(lc, st, kv):
    return lc.dump(), st.counts(), kv.counts()


def test_tree_owned_indices_only_inside_the_declared_locked_prefix() -> None:
    lc, st, kv, a = _setup()
    new = kv.alloc(2)
    s = int(st.alloc(1)[0])
    before = _state(lc, st, kv)
    # the tree's own a[0:4] under a locked prefix of 2: a[2] is past it
    with pytest.raises(_C.OwnershipError):
        lc.insert([1, 2, 3, 4, 5, 6], np.concatenate([a, new]), s, prev_prefix_len=2)
    assert _state(lc, st, kv) == before
    # a tree-owned index past the tree's prefix, even inside prev_prefix_len
    with pytest.raises(_C.OwnershipError):
        lc.insert([1, 2, 9, 9, 5, 6], np.concatenate([a, new]), s, prev_prefix_len=6)
    assert _state(lc, st, kv) == before
    lc.check()
    # the whole cached prefix declared locked: accepted, nothing freed twice
    pl, existed, _, _, _ = lc.insert([1, 2, 3, 4, 5, 6], np.concatenate([a, new]), s, prev_prefix_len=4)
    assert (pl, existed) == (4, False)
    assert kv.owner(int(new[0])) == "tree" and kv.counts()["held"] == 0
    lc.check()


def test_a_tree_owned_index_right_past_the_locked_prefix_is_refused() -> None:
    """The boundary: the one tree-owned index is value[prev_prefix_len],
    every other past it the caller's.  It would be freed as a duplicate
    while the tree keeps it (or stored twice): refused, naming it, nothing
    changed; one position further in (prev_prefix_len + 1) it is accepted."""
    lc, st, kv, a = _setup()
    new = kv.alloc(6)
    s = int(st.alloc(1)[0])
    before = _state(lc, st, kv)
    value = np.concatenate([a[:3], new[3:]])      # a[2] at position 2, then the caller's
    with pytest.raises(_C.OwnershipError, match=r"value\[2\]"):
        lc.insert([1, 2, 3, 4, 5, 6], value, s, prev_prefix_len=2)
    assert _state(lc, st, kv) == before
    lc.check()
    pl = lc.insert([1, 2, 3, 4, 5, 6], value, s, prev_prefix_len=3)[0]
    # value[3:4], the caller's, is the duplicate: freed; the tree keeps a
    assert pl == 4 and kv.owner(int(new[3])) == "free"
    assert [kv.owner(int(i)) for i in a] == ["tree"] * 4
    lc.check()


def test_a_repeat_is_looked_for_past_the_tree_prefix_only() -> None:
    """SGLang reads value[prev_prefix_len:] only (value[:prev_prefix_len]
    is the tree's own): a repeat inside the locked prefix is accepted; one
    past it is refused, naming its position in the whole value."""
    lc, st, kv, a = _setup()
    new = kv.alloc(2)
    s = int(st.alloc(1)[0])
    before = _state(lc, st, kv)
    with pytest.raises(ValueError, match=r"value\[5\] = %d is listed twice" % int(new[0])):
        lc.insert([1, 2, 3, 4, 5, 6], np.concatenate([a, [new[0], new[0]]]), s, prev_prefix_len=4)
    assert _state(lc, st, kv) == before
    # repeats on both sides: the one past the prefix is named
    with pytest.raises(ValueError, match=r"value\[5\] = %d is listed twice" % int(new[0])):
        lc.insert([1, 2, 3, 4, 5, 6], np.concatenate([[a[0], a[0]], a[2:], [new[0], new[0]]]), s, prev_prefix_len=4)
    assert _state(lc, st, kv) == before
    pl, existed = lc.insert([1, 2, 3, 4, 5, 6], np.concatenate([[a[0], a[0]], a[2:], new]), s,
                            prev_prefix_len=4)[:2]
    assert (pl, existed) == (4, False)
    assert [kv.owner(int(i)) for i in np.concatenate([a, new])] == ["tree"] * 6
    lc.check()


def test_free_or_pending_indices_are_refused() -> None:
    lc, st, kv, a = _setup()
    new = kv.alloc(4)
    s = int(st.alloc(1)[0])
    kv.free_group_begin()
    kv.free(new[3:])                       # pending until the group's end
    before = _state(lc, st, kv)
    with pytest.raises(_C.OwnershipError):
        lc.insert([5, 6, 7, 8], new, s)
    assert _state(lc, st, kv) == before
    kv.free_group_end()
    with pytest.raises(_C.OwnershipError):
        lc.insert([5, 6, 7, 8], new, s)    # now free
    lc.check()


def test_an_index_an_open_alloc_group_has_not_handed_out_is_refused() -> None:
    """alloc_group_begin(n) takes n units for the group's next alloc(1)
    calls: HELD, yet no caller has them.  An insert naming one would give
    the tree a unit the group still hands out: refused, nothing changed;
    the one the group handed out is the caller's and accepted."""
    st, kv, rp = _C.SlotAllocator(8), _C.SlotAllocator(64), _C.ReqPool(2, 16, 2)
    lc = _C.Lifecycle(st, kv, rp)
    kv.alloc_group_begin(3)                      # units 1, 2, 3 for the next alloc(1) calls
    got = int(kv.alloc(1)[0])
    assert got == 1
    s = int(st.alloc(1)[0])
    before = _state(lc, st, kv)
    with pytest.raises(_C.OwnershipError, match=r"value\[1\]"):
        lc.insert([5, 6], np.array([got, 2]), s)
    assert _state(lc, st, kv) == before
    kv.alloc_group_end()                         # 2 and 3 go back to the free list
    lc.insert([5, 6], np.array([got] + kv.alloc(1).tolist()), s)
    assert kv.counts()["tree"] == 2 and kv.counts()["held"] == 0
    lc.check()


def test_owner_counts_after_inserts_of_allocator_held_values() -> None:
    """Values straight from kv.alloc (HELD) with prev_prefix_len 0: SGLang
    stores value[prefix_len:] and frees value[:prefix_len].  Reference: each
    index's owner and the class counts written out from the insert's
    prefix length; keys share random prefixes so that the duplicates are
    sometimes the longer part, sometimes the shorter; half the inserts run
    inside a free group (their duplicates pending until its end)."""
    rng = np.random.default_rng(5)
    st, kv, rp = _C.SlotAllocator(512), _C.SlotAllocator(20_000), _C.ReqPool(2, 64, 2)
    lc = _C.Lifecycle(st, kv, rp)
    keys: list = []
    owner: dict = {}
    for i in range(200):
        if keys and rng.random() < 0.8:
            base = keys[rng.integers(len(keys))]
            key = base[: rng.integers(1, len(base) + 1)] + rng.integers(1, 9, size=rng.integers(0, 40)).tolist()
        else:
            key = rng.integers(1, 9, size=rng.integers(1, 40)).tolist()
        keys.append(key)
        value = kv.alloc(len(key))
        grouped = i % 2 == 1
        if grouped:
            kv.free_group_begin()
        pl = lc.insert(key, value, int(st.alloc(1)[0]))[0]
        for j, u in enumerate(value.tolist()):
            owner[u] = "tree" if j >= pl else ("pending" if grouped else "free")
        assert [kv.owner(u) for u in value.tolist()] == [owner[u] for u in value.tolist()], i
        c = kv.counts()
        assert c["held"] == 0 and c["req"] == 0, i
        assert c["tree"] == sum(o == "tree" for o in owner.values()), i
        assert c["pending"] == (pl if grouped else 0), i
        if grouped:
            kv.free_group_end()
            owner.update((u, "free") for u, o in owner.items() if o == "pending")
        lc.check()
        kv.check()
    # the tree holds one index per cached token
    assert kv.counts()["tree"] == lc.sizes()[0] + lc.sizes()[1]
