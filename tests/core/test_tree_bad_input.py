"""Bad input to the C tree: every case raises a Python exception that names
the argument, and leaves the tree exactly as it was (dump, sizes, LRU
orders, every node).  Also the accepted key / value input forms."""

import array
import gc
import sys

import numpy as np
import pytest

from tree_helpers import HAVE_C, RadixTree, StaleNodeError, ints, lru_paths, sizes, tree_snapshot

pytestmark = pytest.mark.skipif(not HAVE_C, reason="mambaradix._C.RadixTree is not built")


def populated(page_size=1, policy="consumed"):
    """A small tree with splits, tombstones, a lock and an extra_key."""
    t = RadixTree(page_size=page_size, chunk_size=max(4, page_size), lru_policy=policy)
    p = page_size

    def k(*pages):
        return [x for pg in pages for x in [pg] * p]

    t.insert(k(1, 2, 3, 4), list(range(100, 100 + 4 * p)), 1)
    t.insert(k(1, 2, 5), list(range(200, 200 + 3 * p)), 2)
    t.insert(k(7, 8), list(range(300, 300 + 2 * p)), 3, extra_key="lora")
    t.match_prefix(k(1, 9))  # splits off a tombstone [1]
    m = t.match_prefix(k(1, 2, 3, 4))
    t.inc_lock_ref(m.node)
    t.sanity_check()
    return t


def state_of(t):
    return (
        t.pretty_print(),
        sizes(t),
        lru_paths(t, "full"),
        lru_paths(t, "mamba"),
        tree_snapshot(t),
        t.memory_bytes(),
    )


def expect_unchanged(t, exc, words, fn, *args, **kwargs):
    before = state_of(t)
    with pytest.raises(exc) as ei:
        fn(*args, **kwargs)
    msg = str(ei.value)
    for w in words:
        assert w in msg, "%r not in %r" % (w, msg)
    assert state_of(t) == before
    t.sanity_check()
    return ei.value


# --------------------------------------------------------------------------
# Constructor


@pytest.mark.parametrize(
    "kwargs, exc, word",
    [
        (dict(page_size=0), ValueError, "page_size"),
        (dict(page_size=-1), ValueError, "page_size"),
        (dict(page_size=2**40), ValueError, "page_size"),
        (dict(page_size="1"), TypeError, "page_size"),
        (dict(page_size=1.0), TypeError, "page_size"),
        (dict(page_size=True), TypeError, "page_size"),
        (dict(page_size=None), TypeError, "page_size"),
        (dict(chunk_size=0), ValueError, "chunk_size"),
        (dict(chunk_size=-64), ValueError, "chunk_size"),
        (dict(chunk_size=2.5), TypeError, "chunk_size"),
        (dict(page_size=32, chunk_size=48), ValueError, "chunk_size"),
        (dict(page_size=48, chunk_size=32), ValueError, "page_size"),
        (dict(lru_policy="lru"), ValueError, "lru_policy"),
        (dict(lru_policy=""), ValueError, "lru_policy"),
        (dict(lru_policy=1), TypeError, ""),
        (dict(lru_policy=None), TypeError, ""),
        (dict(bogus=1), TypeError, "bogus"),
    ],
)
def test_constructor_rejects(kwargs, exc, word):
    with pytest.raises(exc) as ei:
        RadixTree(**kwargs)
    assert word in str(ei.value)


def test_constructor_defaults_and_chunk_rule():
    t = RadixTree()
    assert (t.page_size, t.chunk_size, t.lru_policy) == (1, 64, "consumed")
    t = RadixTree(page_size=128)
    assert t.chunk_size == 128
    t = RadixTree(page_size=16, chunk_size=8, lru_policy="sglang")
    assert (t.page_size, t.chunk_size, t.lru_policy) == (16, 8, "sglang")
    t = RadixTree(4, 64, "consumed")
    assert (t.page_size, t.chunk_size) == (4, 64)


# --------------------------------------------------------------------------
# Keys

BAD_KEYS = [
    ("str", "abc", TypeError, ["key"]),
    ("none", None, TypeError, ["key"]),
    ("int", 5, TypeError, ["key"]),
    ("str element", [1, "a", 3], TypeError, ["key[1]"]),
    ("float element", [1, 2.0], TypeError, ["key[1]"]),
    ("none element", [None], TypeError, ["key[0]"]),
    ("bool element", [1, True], TypeError, ["key[1]"]),
    ("float64 array", np.array([1.0, 2.0]), TypeError, ["key"]),
    ("float32 array", np.array([1.0, 2.0], dtype=np.float32), TypeError, ["key"]),
    ("complex array", np.array([1j]), TypeError, ["key"]),
    ("bool array", np.array([True, False]), TypeError, ["key"]),
    ("array('d')", array.array("d", [1.0]), TypeError, ["key"]),
    ("2-D int32", np.zeros((2, 2), dtype=np.int32), ValueError, ["key", "1-dimensional"]),
    ("2-D int64", np.ones((1, 3), dtype=np.int64), ValueError, ["key", "1-dimensional"]),
    ("0-D int32", np.array(3, dtype=np.int32), (TypeError, ValueError), ["key"]),
    ("int64 above int32", np.array([1, 2**31], dtype=np.int64), ValueError, ["key[1]"]),
    ("int64 below int32", np.array([-(2**31) - 1], dtype=np.int64), ValueError, ["key[0]"]),
    ("uint32 above int32", np.array([2**31 + 5], dtype=np.uint32), ValueError, ["key[0]"]),
    ("uint64 huge", np.array([2**64 - 1], dtype=np.uint64), ValueError, ["key[0]"]),
    ("list above int32", [0, 2**31], ValueError, ["key[1]"]),
    ("list below int32", [-(2**31) - 1], ValueError, ["key[0]"]),
    ("list huge int", [2**100], ValueError, ["key[0]"]),
    ("array('q') above int32", array.array("q", [2**40]), ValueError, ["key[0]"]),
]


@pytest.mark.parametrize("case", BAD_KEYS, ids=[c[0] for c in BAD_KEYS])
def test_match_prefix_bad_key(case):
    _, key, exc, words = case
    t = populated()
    expect_unchanged(t, exc, words, t.match_prefix, key)


@pytest.mark.parametrize("case", BAD_KEYS, ids=[c[0] for c in BAD_KEYS])
def test_insert_bad_key(case):
    _, key, exc, words = case
    t = populated()
    try:
        n = len(key)
    except TypeError:
        n = 1
    expect_unchanged(t, exc, words, t.insert, key, list(range(500, 500 + n)), 9)


def test_int32_extremes_are_valid_tokens():
    t = RadixTree()
    key = [-(2**31), 2**31 - 1, 0, -1]
    t.insert(key, [1, 2, 3, 4], 1)
    m = t.match_prefix(np.array(key, dtype=np.int64))
    assert ints(m.indices) == [1, 2, 3, 4]
    assert ints(m.node.key) == key
    t.sanity_check()


# --------------------------------------------------------------------------
# Values, state, prev_prefix_len, extra_key


@pytest.mark.parametrize(
    "value, exc, words",
    [
        ([1, 2], ValueError, ["value", "key"]),  # shorter than the key
        ([1, 2, 3, 4], ValueError, ["value"]),  # longer
        ([], ValueError, ["value"]),
        ([1, -2, 3], ValueError, ["value[1]"]),
        ([1, 2, 2**63], ValueError, ["value[2]"]),
        ([1, 2, "3"], TypeError, ["value[2]"]),
        ([1, 2, 3.0], TypeError, ["value[2]"]),
        (np.array([1.0, 2.0, 3.0]), TypeError, ["value"]),
        (np.zeros((3, 1), dtype=np.int64), ValueError, ["value"]),
        (np.array([1, -1, 2], dtype=np.int64), ValueError, ["value[1]"]),
        (np.array([1, 2, 2**64 - 1], dtype=np.uint64), ValueError, ["value[2]"]),
        (np.array([1, 2, -1], dtype=np.int32), ValueError, ["value[2] = -1"]),   # int32: widened in one pass
        (np.array([-2**31, 2, 3], dtype=np.int32), ValueError, ["value[0] = -2147483648"]),
        (None, TypeError, ["value"]),
        ("abc", TypeError, ["value"]),
    ],
)
def test_insert_bad_value(value, exc, words):
    t = populated()
    expect_unchanged(t, exc, words, t.insert, [1, 2, 6], value, 9)


@pytest.mark.parametrize(
    "state, exc",
    [(-1, ValueError), (-(2**70), ValueError), (2**64, ValueError), ("1", TypeError), (1.0, TypeError), (None, TypeError), (True, TypeError)],
)
def test_insert_bad_state(state, exc):
    t = populated()
    expect_unchanged(t, exc, ["state"], t.insert, [1, 2, 6], [1, 2, 3], state)


@pytest.mark.parametrize("prev, exc", [(-1, ValueError), (2**64, ValueError), ("0", TypeError), (0.0, TypeError), (None, TypeError)])
def test_insert_bad_prev_prefix_len(prev, exc):
    t = populated()
    expect_unchanged(t, exc, ["prev_prefix_len"], t.insert, [1, 2, 6], [1, 2, 3], 9, prev_prefix_len=prev)


@pytest.mark.parametrize("extra", [1, b"lora", ["lora"], 1.5])
def test_bad_extra_key(extra):
    t = populated()
    expect_unchanged(t, TypeError, ["extra_key"], t.insert, [1, 2, 6], [1, 2, 3], 9, extra_key=extra)
    expect_unchanged(t, TypeError, ["extra_key"], t.match_prefix, [1, 2, 6], extra_key=extra)
    expect_unchanged(t, TypeError, ["extra_key"], t.match_prefix, [1, 2, 6], extra)


def test_unknown_extra_key_matches_nothing_and_creates_nothing():
    t = populated()
    before = state_of(t)
    m = t.match_prefix([7, 8], extra_key="unknown")
    assert m.node.is_root and len(m.indices) == 0 and m.kv_matched_len == 0
    assert state_of(t) == before
    m = t.match_prefix([7, 8])  # the [7, 8] entry lives in "lora" only
    assert m.node.is_root and m.kv_matched_len == 0
    m = t.match_prefix([7, 8], extra_key="lora")
    assert ints(m.indices) == [300, 301] and m.node.extra_key == "lora"


def test_a_refused_insert_names_no_namespace():
    # ids are handed out in the order names first come (1, 2, ...): a name
    # that only a refused insert brought must not take one
    t = RadixTree(page_size=2, chunk_size=4, check_ownership=True)
    t.insert([1, 2], [10, 11], 1, extra_key="kept")
    refusals = [
        (ValueError, lambda: t.insert([1, 2, 3], [20, 21, 22], 2, extra_key="gone")),   # not whole pages
        (ValueError, lambda: t.insert([5, 6], [20], 2, extra_key="gone")),              # value too short
        (TypeError, lambda: t.insert([5, 6], [20, "x"], 2, extra_key="gone")),          # a bad index
        (Exception, lambda: t.insert([5, 6], [10, 30], 2, extra_key="gone")),           # the tree's index 10
    ]
    for exc, call in refusals:
        with pytest.raises(exc):
            call()
        assert t.namespace_name(2) is None
    assert t.namespace("next") == 2 and t.namespace_name(1) == "kept"
    t.insert([5, 6], [20, 21], 2, extra_key="gone")
    assert t.namespace("gone") == 3 and t.match_prefix([5, 6], extra_key="gone").kv_matched_len == 2


def test_bad_call_shapes():
    t = populated()
    expect_unchanged(t, TypeError, [], t.match_prefix)
    expect_unchanged(t, TypeError, [], t.match_prefix, [1], None, None)
    expect_unchanged(t, TypeError, ["bogus"], t.match_prefix, [1], bogus=1)
    expect_unchanged(t, TypeError, [], t.insert, [1], [1])
    expect_unchanged(t, TypeError, [], t.insert, [1], [1], 1, None)  # extra_key is keyword-only
    expect_unchanged(t, TypeError, ["bogus"], t.insert, [1], [1], 1, bogus=2)
    expect_unchanged(t, TypeError, [], t.evict_full)
    expect_unchanged(t, TypeError, [], t.inc_lock_ref)


# --------------------------------------------------------------------------
# page_size > 1


def test_insert_requires_whole_pages():
    t = populated(page_size=4)
    expect_unchanged(t, ValueError, ["page_size"], t.insert, [1] * 6, list(range(6)), 9)
    expect_unchanged(t, ValueError, ["page_size"], t.insert, [1] * 3, list(range(3)), 9)
    # the value-length check still names value
    expect_unchanged(t, ValueError, ["value"], t.insert, [1] * 8, list(range(7)), 9)


def test_match_truncates_to_whole_pages():
    t = RadixTree(page_size=4, chunk_size=4)
    t.insert([1, 1, 1, 1, 2, 2, 2, 2], list(range(8)), 1)
    before = state_of(t)
    m = t.match_prefix([1, 1, 1])  # under one page: nothing
    assert m.node.is_root and m.kv_matched_len == 0
    assert state_of(t)[4] == before[4]  # no split
    m = t.match_prefix([1, 1, 1, 1, 2, 2, 2, 2, 3, 3])
    assert ints(m.indices) == list(range(8)) and m.kv_matched_len == 8
    # a mismatch inside the second page: the match stops at page 1 (split)
    m = t.match_prefix([1, 1, 1, 1, 2, 2, 9, 2])
    assert m.kv_matched_len == 4 and m.node.is_root and m.branching_seqlen == 4
    assert t.node_count() == 2
    t.sanity_check()


# --------------------------------------------------------------------------
# Evictions, locks, lru_order


@pytest.mark.parametrize("arg, exc", [(-1, ValueError), (2**64, ValueError), ("1", TypeError), (1.5, TypeError), (None, TypeError), (True, TypeError)])
def test_evict_bad_counts(arg, exc):
    t = populated()
    expect_unchanged(t, exc, ["num_tokens"], t.evict_full, arg)
    expect_unchanged(t, exc, ["num_states"], t.evict_mamba, arg)


def test_lock_bad_nodes():
    t = populated()
    for bad in (None, 1, "node", [t.root]):
        expect_unchanged(t, TypeError, ["node"], t.inc_lock_ref, bad)
        expect_unchanged(t, TypeError, ["node"], t.dec_lock_ref, bad)


def test_unlock_of_unlocked_node_raises_and_changes_nothing():
    t = populated()
    for node in t.lru_order("full"):
        if node.state_lock_ref == 0 and node.full_lock_ref == 0:
            expect_unchanged(t, ValueError, ["not locked"], t.dec_lock_ref, node)
    # the parent of a locked node is locked only through its child
    locked = [n for n in t.lru_order("full") if n.state_lock_ref > 0][0]
    parent = locked.parent
    assert parent.full_lock_ref == 1 and not parent.is_root
    expect_unchanged(t, ValueError, ["not locked"], t.dec_lock_ref, parent)
    # the root: a no-op either way
    before = state_of(t)
    t.dec_lock_ref(t.root)
    t.inc_lock_ref(t.root)
    t.dec_lock_ref(t.root)
    t.dec_lock_ref(t.root)
    assert state_of(t) == before


def test_stale_and_foreign_handles():
    t = populated()
    other = populated()
    foreign = other.lru_order("full")[0]
    e = expect_unchanged(t, StaleNodeError, ["another tree"], t.inc_lock_ref, foreign)
    assert isinstance(e, ValueError)
    expect_unchanged(t, StaleNodeError, ["another tree"], t.dec_lock_ref, foreign)
    expect_unchanged(t, StaleNodeError, ["another tree"], t.inc_lock_ref, other.root)
    leaf = t.insert([5, 5], [1, 2], 50).node
    t.evict_full(10**6)  # everything unlocked goes, the leaf too
    assert not leaf.valid
    expect_unchanged(t, StaleNodeError, ["stale"], t.inc_lock_ref, leaf)
    expect_unchanged(t, StaleNodeError, ["stale"], t.dec_lock_ref, leaf)


def test_lru_order_bad_which():
    t = populated()
    expect_unchanged(t, ValueError, ["which"], t.lru_order, "states")
    expect_unchanged(t, TypeError, ["which"], t.lru_order, 1)


# --------------------------------------------------------------------------
# Accepted input forms; results are numpy int64


def _key_forms(key):
    base32 = np.asarray(key, dtype=np.int32)
    wide = np.zeros(3 * len(key), dtype=np.int64)
    wide[::3] = key
    rev = np.asarray(key[::-1], dtype=np.int32)
    return {
        "list": list(key),
        "tuple": tuple(key),
        "range": range(key[0], key[0] + len(key)) if key == list(range(key[0], key[0] + len(key))) else list(key),
        "array_q": array.array("q", key),
        "array_i": array.array("i", key),
        "array_l": array.array("l", key),
        "array_h": array.array("h", key),
        "np_int32": base32,
        "np_int64": np.asarray(key, dtype=np.int64),
        "np_int16": np.asarray(key, dtype=np.int16),
        "np_uint32": np.asarray(key, dtype=np.uint32),
        "np_int32_strided": np.repeat(base32, 2)[::2],
        "np_int64_strided": wide[::3],
        "np_int32_reversed": rev[::-1],
        "np_int32_fortran_1d": np.asfortranarray(base32),
        "np_int32_readonly": np.frombuffer(base32.tobytes(), dtype=np.int32),
        "np_scalars_list": [np.int64(x) for x in key],
        "memoryview": memoryview(array.array("i", key)),
    }


FORMS = list(_key_forms([1, 2, 3]).keys())


@pytest.mark.parametrize("form", FORMS)
def test_key_input_forms(form):
    key = [3, 4, 5, 6, 7, 8]
    ref = RadixTree()
    ref.insert(key, [10, 11, 12, 13, 14, 15], 1)
    t = RadixTree()
    r = t.insert(_key_forms(key)[form], _key_forms([10, 11, 12, 13, 14, 15])[form], 1)
    assert r.prefix_len == 0 and ints(r.node.key) == key
    assert ints(r.node.value) == [10, 11, 12, 13, 14, 15]
    assert tree_snapshot(t) == tree_snapshot(ref)
    m = t.match_prefix(_key_forms(key)[form])
    assert isinstance(m.indices, np.ndarray) and m.indices.dtype == np.int64 and m.indices.ndim == 1
    assert ints(m.indices) == [10, 11, 12, 13, 14, 15]
    r = t.insert(_key_forms(key)[form], _key_forms([20, 21, 22, 23, 24, 25])[form], 2)
    assert r.duplicates.dtype == np.int64 and ints(r.duplicates) == [20, 21, 22, 23, 24, 25]
    t.sanity_check()


@pytest.mark.parametrize(
    "make",
    [lambda k: np.array(k, dtype=object), lambda k: np.asarray(k, dtype=">i8"), lambda k: np.asarray(k, dtype=">i4")],
    ids=["object", "int64-big-endian", "int32-big-endian"],
)
def test_unusual_arrays_are_read_right_or_rejected(make):
    """Arrays the API does not promise to read: either the right tokens, or
    a TypeError naming the key, and the tree unchanged."""
    t = populated()
    before = state_of(t)
    key = [1, 2, 3, 4]
    try:
        m = t.match_prefix(make(key))
    except TypeError as e:
        assert "key" in str(e)
        assert state_of(t) == before
        return
    assert ints(m.indices) == [100, 101, 102, 103] and m.kv_matched_len == 4


def test_result_types():
    t = RadixTree()
    r = t.insert([1, 2], [5, 6], 3)
    assert isinstance(r.duplicates, np.ndarray) and r.duplicates.dtype == np.int64 and len(r.duplicates) == 0
    assert r.node.key.dtype == np.int32 and r.node.value.dtype == np.int64
    m = t.match_prefix([])
    assert m.indices.dtype == np.int64 and len(m.indices) == 0 and m.node.is_root
    assert (m.state, m.kv_matched_len, m.branching_seqlen) == (None, 0, None)
    e = t.evict_full(1)
    for arr in (e.kv_indices, e.state_slots):
        assert isinstance(arr, np.ndarray) and arr.dtype == np.int64
    assert ints(e.kv_indices) == [5, 6] and ints(e.state_slots) == [3]
    e = t.evict_mamba(1)
    assert e.kv_indices.dtype == np.int64 and len(e.kv_indices) == 0 and len(e.state_slots) == 0
    # the result arrays are the caller's: writable, not views of the tree
    m2 = t.insert([4], [9], 1)
    m = t.match_prefix([4])
    m.indices[0] = 77
    assert ints(t.match_prefix([4]).indices) == [9]
    assert m2.node.value.flags.writeable


def test_empty_key_inserts_nothing():
    t = populated()
    before = state_of(t)
    r = t.insert([], [], 5)
    assert (r.prefix_len, bool(r.state_existed)) == (0, True) and r.node.is_root
    assert len(r.duplicates) == 0
    r = t.insert(np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64), 5, prev_prefix_len=3)
    assert r.node.is_root
    assert state_of(t) == before


def test_input_buffer_not_retained_or_modified():
    t = RadixTree()
    key = np.array([1, 2, 3, 4], dtype=np.int32)
    val = np.array([7, 8, 9, 10], dtype=np.int64)
    rk, rv = sys.getrefcount(key), sys.getrefcount(val)
    t.insert(key, val, 1)
    t.match_prefix(key)
    assert (sys.getrefcount(key), sys.getrefcount(val)) == (rk, rv)
    key[:] = 0  # the tree copied the key and values
    val[:] = 0
    m = t.match_prefix([1, 2, 3, 4])
    assert ints(m.indices) == [7, 8, 9, 10]
    assert list(key) == [0, 0, 0, 0]


class _Reentrant:
    """An int-like whose __index__ first calls back into the tree with a
    long key (which reuses and grows any scratch buffer of the tree)."""

    def __init__(self, tree, v):
        self.tree = tree
        self.v = v

    def __index__(self):
        self.tree.match_prefix(list(range(100, 100 + 4096)))
        return self.v


def test_reentrant_index_in_match_key():
    t = RadixTree()
    t.insert([1, 2, 3, 4], [1, 2, 3, 4], 1)
    m = t.match_prefix([1, 2, _Reentrant(t, 3), 4])
    assert ints(m.indices) == [1, 2, 3, 4] and m.kv_matched_len == 4
    t.sanity_check()


def test_reentrant_index_in_insert_key():
    t = RadixTree()
    t.insert([1, 2, 3, 4], [1, 2, 3, 4], 1)
    r = t.insert([1, 2, 3, 4, _Reentrant(t, 5)], [1, 2, 3, 4, 5], 2)
    assert r.prefix_len == 4 and ints(r.node.key) == [5]
    t.sanity_check()


def test_reentrant_index_in_insert_value():
    """The key was read first; a callback while the values are read must not
    change (or free) it."""
    t = RadixTree()
    r = t.insert([9, 9], [_Reentrant(t, 8), 9], 3)
    assert ints(r.node.key) == [9, 9] and ints(r.node.value) == [8, 9]
    assert ints(t.match_prefix([9, 9]).indices) == [8, 9]
    t.sanity_check()


def test_failed_calls_do_not_leak_references():
    t = populated()
    other = populated()
    key_bad = [1, 2, "x"]
    val = [1, 2, 3]
    arr2d = np.zeros((2, 3), dtype=np.int32)
    arr_big = np.array([1, 2**40], dtype=np.int64)
    extra = "ns-leak"
    stale = t.insert([42], [42], 42).node
    t.evict_full(10**6)
    foreign = other.root.children[0]
    objs = [t, other, key_bad, val, arr2d, arr_big, extra, key_bad[2], stale, foreign]

    def failing_calls():
        with pytest.raises(TypeError):
            t.insert(key_bad, val, 1)
        with pytest.raises(TypeError):
            t.match_prefix(key_bad, extra)
        with pytest.raises(ValueError):
            t.insert([1, 2], val, 1, extra_key=extra)
        with pytest.raises(ValueError):
            t.match_prefix(arr2d)
        with pytest.raises(ValueError):
            t.insert(arr_big, val[:2], 1)
        with pytest.raises(ValueError):
            t.insert([1, 2, 3], arr_big, 1)
        with pytest.raises(StaleNodeError):
            t.inc_lock_ref(stale)
        with pytest.raises(StaleNodeError):
            t.dec_lock_ref(foreign)
        with pytest.raises(ValueError):
            t.evict_full(-1)
        with pytest.raises(ValueError):
            t.dec_lock_ref(t.insert([77], [77], 77).node)  # an unlocked node

    for _ in range(3):  # warm up caches
        failing_calls()
    gc.collect()
    r0 = [sys.getrefcount(o) for o in objs]
    for _ in range(1000):
        failing_calls()
    gc.collect()
    assert [sys.getrefcount(o) for o in objs] == r0
    t.sanity_check()


@pytest.mark.parametrize("semantics", ["v0.5.15", "v0.5.23"])
def test_unlock_refusals_name_what_the_node_holds(semantics):
    """A refused unlock says which kind of lock the node holds instead.  The
    parent of a locked node has no lock of its own: dec_lock_ref says it is
    not locked, while dec_kv_lock says the KV it protects is held by a lock
    of inc_lock_ref.  Two inc_kv_lock locks on a node are counted by
    dec_lock_ref.  Nothing changes on a refusal."""
    t = RadixTree(chunk_size=4, semantics=semantics)
    t.insert([1, 2, 3, 4], [10, 11, 12, 13], 1)
    child = t.insert([1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15], 2).node
    parent = child.parent
    assert list(parent.key) == [1, 2, 3, 4]
    t.inc_lock_ref(child)
    before = tree_snapshot(t)
    with pytest.raises(ValueError, match=r"^dec_lock_ref\(\): node is not locked$"):
        t.dec_lock_ref(parent)
    with pytest.raises(ValueError, match=r"^dec_kv_lock\(\): node holds no lock of inc_kv_lock \(a lock of "
                                         r"inc_lock_ref is undone by dec_lock_ref\)$"):
        t.dec_kv_lock(parent)
    assert tree_snapshot(t) == before
    t.dec_lock_ref(child)
    t.inc_kv_lock(parent)
    t.inc_kv_lock(parent)
    with pytest.raises(ValueError, match=r"^dec_lock_ref\(\): node holds no lock of inc_lock_ref, only 2 of "
                                         r"inc_kv_lock \(undo those with dec_kv_lock\)$"):
        t.dec_lock_ref(parent)
    t.sanity_check()
