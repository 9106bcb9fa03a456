"""Bad input to the pools and the Lifecycle: refused with an error that names
the argument, before anything changes (no slot leaks, no slot with two owners)."""
from __future__ import annotations

import pytest

from mambaradix import _C


def _pools(n_state: int = 8, n_kv: int = 64, rows: int = 4, ctx: int = 64, **kw):
    sa, ka, rp = _C.SlotAllocator(n_state), _C.SlotAllocator(n_kv), _C.ReqPool(rows, ctx)
    return _C.Lifecycle(sa, ka, rp, **kw), sa, ka, rp


def _rs() -> _C.ReqState:
    """A prefilled request running on state slot 1 (tree-only Lifecycle)."""
    return _C.ReqState((1, -1, -1, -1, -1, -1, -1, 0, 1, 0, -1, 0, 0))


@pytest.mark.parametrize("call, exc, msg", [
    (lambda: _C.SlotAllocator(True), TypeError, r"SlotAllocator\(\): size must be an int, not bool"),
    (lambda: _C.SlotAllocator(8, True), TypeError, r"SlotAllocator\(\): page_size must be an int, not bool"),
    (lambda: _C.SlotAllocator(1.5), TypeError, r"SlotAllocator\(\): size must be an int, not float"),
    (lambda: _C.SlotAllocator("8"), TypeError, r"SlotAllocator\(\): size must be an int, not str"),
    (lambda: _C.SlotAllocator(None), TypeError, r"SlotAllocator\(\): size must be an int, not NoneType"),
    (lambda: _C.SlotAllocator(0), ValueError, r"SlotAllocator\(\): size must be in \[1, "),
    (lambda: _C.SlotAllocator(8, 0), ValueError, r"SlotAllocator\(\): page_size must be in \[1, "),
    (lambda: _C.ReqPool(True, 8), TypeError, r"ReqPool\(\): size must be an int, not bool"),
    (lambda: _C.ReqPool(4.5, 16), TypeError, r"ReqPool\(\): size must be an int, not float"),
    (lambda: _C.ReqPool(4, 16.0), TypeError, r"ReqPool\(\): max_context_len must be an int, not float"),
    (lambda: _C.ReqPool(4, 16, True), TypeError, r"ReqPool\(\): track_buffer_size must be an int, not bool"),
    (lambda: _C.ReqPool(0, 16), ValueError, r"ReqPool\(\): size must be in \[1, "),
    (lambda: _C.ReqPool(4, 0), ValueError, r"ReqPool\(\): max_context_len must be in \[1, "),
    (lambda: _C.ReqPool(4, 16, 3), ValueError, r"ReqPool\(\): track_buffer_size must be in \[1, 2\]"),
    (lambda: _C.ReqPool(2**31, 2**31), ValueError, r"ReqPool\(\): size must be in \[1, 2147483646\]"),
    (lambda: _C.ReqPool(2**30, 2**40), ValueError, r"ReqPool\(\): the table of \(size \+ 1\) x max_context_len"),
    (lambda: _C.Lifecycle(page_size=True), TypeError, r"Lifecycle\(\): page_size must be an int, not bool"),
    (lambda: _C.Lifecycle(chunk_size=64.0), TypeError, r"Lifecycle\(\): chunk_size must be an int, not float"),
    (lambda: _C.Lifecycle(track_buffer_size=True), TypeError,
     r"Lifecycle\(\): track_buffer_size must be an int, not bool"),
    (lambda: _C.Lifecycle(track_interval=1.0), TypeError, r"Lifecycle\(\): track_interval must be an int, not float"),
    (lambda: _C.Lifecycle(chunk_size=0), ValueError, r"Lifecycle\(\): chunk_size must be in \[1, 16777216\]"),
    (lambda: _C.Lifecycle(track_interval=0), ValueError, r"Lifecycle\(\): track_interval must be in \[1, "),
])
def test_constructor_ints_name_the_argument(call, exc, msg) -> None:
    with pytest.raises(exc, match=msg):
        call()


def test_one_allocator_for_states_and_kv_is_refused() -> None:
    a = _C.SlotAllocator(64)
    with pytest.raises(ValueError, match=r"state_allocator and kv_allocator must be different"):
        _C.Lifecycle(a, a, _C.ReqPool(4, 64))


def test_admit_refuses_a_row_listed_twice() -> None:
    lc, sa, ka, rp = _pools(chunk_size=1)
    row = int(rp.alloc(1)[0])
    a, b = _C.ReqState(), _C.ReqState()
    with pytest.raises(ValueError, match=rf"admit\(\): rows\[1\] = {row} is rows\[0\] too"):
        lc.admit([row, row], [a, b])
    # nothing taken: every state slot free, the row empty, the records unbound
    assert sa.counts()["free"] == 8
    assert a.running == -1 and b.running == -1
    lc.check()
    rows, _ = lc.admit([row], [a])
    assert rows == [row] and a.running == 1 and sa.counts()["free"] == 7


def test_alloc_state_owner_must_be_a_row_of_the_pool() -> None:
    lc, sa, ka, rp = _pools(chunk_size=1)
    for bad in (999, 5, 0, -1):
        with pytest.raises(ValueError, match=rf"alloc_state\(\): owner must be -2 \(held\) or a request row in "
                                             rf"\[1, 4\], not {bad}"):
            lc.alloc_state(owner=bad)
    assert sa.counts()["free"] == 8
    assert lc.alloc_state(owner=4) == 1 and sa.owner(1) == 4


def test_cache_unfinished_refuses_the_running_slot_as_fresh() -> None:
    lc = _C.Lifecycle(chunk_size=1)
    with pytest.raises(_C.OwnershipError, match=r"fresh is one of the request's own state slots"):
        lc.cache_unfinished(_rs(), [1, 2, 3], [5, 6, 7], 1)
    assert lc.sizes()[:2] == (0, 0)   # the tree took nothing
    # a slot of its own is taken
    out = lc.cache_unfinished(_rs(), [1, 2, 3], [5, 6, 7], 2)
    assert out[0].running == 1 and lc.match([1, 2, 3])[0].tolist() == [5, 6, 7]


@pytest.mark.parametrize("name", ["cache_finished", "cache_unfinished"])
def test_foreign_calls_refuse_negative_kv(name: str) -> None:
    lc = _C.Lifecycle(chunk_size=1)
    args = (_rs(), [1, 2, 3], [5, 6, -7]) + ((2,) if name == "cache_unfinished" else ())
    with pytest.raises(ValueError, match=rf"{name}\(\): kv\[2\] = -7 is out of range \[0, "):
        getattr(lc, name)(*args)
    assert lc.match([1, 2, 3])[0].tolist() == []


@pytest.mark.parametrize("key", [{1: 2}, {1, 2}, frozenset((1, 2))])
def test_unordered_keys_are_refused(key) -> None:
    import mambaradix as m

    t = m.RadixTree(chunk_size=1)
    t.insert([1, 2, 3], [10, 11, 12], 5)
    with pytest.raises(TypeError, match=r"key must be a sequence or buffer of ints, not (dict|set|frozenset)"):
        t.match_prefix(key)
    lc = _C.Lifecycle(chunk_size=1)
    with pytest.raises(TypeError, match=r"must be a sequence or buffer of ints, not (dict|set|frozenset)"):
        lc.match(key)
    # a sequence with the same tokens is a key
    assert t.match_prefix((1, 2, 3)).indices.tolist() == [10, 11, 12]


def test_refused_inserts_leave_the_namespace_table_as_it_was() -> None:
    # a tree hands out namespace ids 1, 2, ... as names first come; an
    # insert refused for its KV (an index the tree already holds, with the
    # ownership check on) must not have taken one for its new extra_key
    t = _C.RadixTree(page_size=1, chunk_size=4, check_ownership=True)
    t.insert([1, 2, 3], [7, 8, 9], 1)
    for name in ("x", "y"):
        with pytest.raises(Exception):
            t.insert([4, 5], [9, 10], 2, extra_key=name)
    assert t.namespace("z") == 1
    t.insert([4, 5], [10, 11], 2, extra_key="x")
    assert (t.namespace("x"), t.namespace_name(1), t.namespace_name(2)) == (2, "z", "x")
