"""The integer reader (py_ints.c over csrc/core/ints.c) on every buffer form
it converts: each integer dtype, signed and unsigned, contiguous, strided and
reversed.  Reference: numpy's own tolist() of the same view, and the first
out-of-range element found by a plain Python scan."""

from __future__ import annotations

import numpy as np
import pytest

from mambaradix import _C

DTYPES = ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"]
VIEWS = [slice(None), slice(None, None, 2), slice(None, None, -1), slice(1, None, 3)]
I32 = (-2**31, 2**31 - 1)


def _values(dtype: str, n: int, rng) -> np.ndarray:
    info = np.iinfo(dtype)
    lo, hi = max(int(info.min), -2**31), min(int(info.max), 2**31 - 1)
    return rng.integers(lo, hi, size=n, endpoint=True).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("view", range(len(VIEWS)))
def test_values_read_as_numpy_reads_them(dtype, view):
    rng = np.random.default_rng(7)
    pool = _C.ReqPool(2, 64)
    arr = _values(dtype, 40, rng)[VIEWS[view]]
    pool.write(1, 3, arr)
    want = arr.tolist()
    assert pool.table[1, 3:3 + len(want)].tolist() == want


@pytest.mark.parametrize("dtype", ["i8", "u4", "u8"])
@pytest.mark.parametrize("view", range(len(VIEWS)))
def test_first_value_out_of_int32_is_named(dtype, view):
    rng = np.random.default_rng(11)
    tree = _C.RadixTree()
    for trial in range(6):
        base = rng.integers(0, 1000, size=30).astype(dtype)
        at = sorted(rng.choice(30, size=2, replace=False).tolist())
        for i in at:
            base[i] = np.iinfo(dtype).max - trial if trial % 2 else 2**31 + trial
        arr = base[VIEWS[view]]
        vals = arr.tolist()
        bad = [i for i, v in enumerate(vals) if not I32[0] <= v <= I32[1]]
        if not bad:
            tree.match_prefix(arr)
            continue
        i, v = bad[0], vals[bad[0]]
        want = (f"key[{i}] = {v} is out of range [{I32[0]}, {I32[1]}]" if v <= 2**63 - 1
                else f"key[{i}] is out of range [{I32[0]}, {I32[1]}]")
        with pytest.raises(ValueError) as e:
            tree.match_prefix(arr)
        assert str(e.value) == want


def test_negative_index_is_named_at_its_place():
    alloc = _C.SlotAllocator(16)
    with pytest.raises(ValueError, match=r"^alloc\(\): n must be in \[0, "):
        alloc.alloc(-1)
    pool = _C.ReqPool(2, 8)
    for dtype in ("i2", "i4"):
        arr = np.array([5, 4, -3, 2, -1], dtype)[::-1]    # reversed: -1 comes first
        tree = _C.RadixTree()
        tree.insert([1, 2], [3, 4], 1)
        assert tree.match_prefix(arr).kv_matched_len == 0
        pool.write(1, 0, arr)
        assert pool.table[1, :5].tolist() == [-1, 2, -3, 4, 5]


@pytest.mark.parametrize("view", range(len(VIEWS)))
def test_negative_int32_value_is_refused_where_values_are_indices(view):
    vals = np.array([4, 9, 5, 6, 7, 8], np.int32)
    vals[4] = -7
    arr = vals[VIEWS[view]]
    i = arr.tolist().index(-7)
    tree = _C.RadixTree()
    with pytest.raises(ValueError) as e:
        tree.insert(list(range(1, len(arr) + 1)), arr, 1)
    assert str(e.value) == f"value[{i}] = -7 is out of range [0, {2**63 - 1}]"
    assert tree.total_size() == (0, 0)
