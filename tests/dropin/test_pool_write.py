"""ReqToTokenPool.write on CPU: the (row, slice) fast path into the C table
against a plain torch int32 tensor doing the same assignment (torch's
semantics are SGLang's: its req_to_token is such a tensor)."""

from __future__ import annotations

import random
from array import array

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mambaradix.sglang import ReqToTokenPool  # noqa: E402

ROWS, CTX = 6, 40


def _pair():
    pool = ReqToTokenPool(ROWS, CTX, device="cpu")
    ref = torch.zeros((ROWS + 1, CTX), dtype=torch.int32)
    return pool, ref


def _same(pool, ref):
    assert torch.equal(pool.req_to_token, ref)


def _values(kind, vals):
    if kind == "i32":
        return torch.tensor(vals, dtype=torch.int32)
    if kind == "i64":
        return torch.tensor(vals, dtype=torch.int64)
    if kind == "np32":
        return np.array(vals, dtype=np.int32)
    if kind == "np64":
        return np.array(vals, dtype=np.int64)
    if kind == "np64_strided":   # every other element of a longer array
        return np.repeat(np.array(vals, dtype=np.int64), 2)[::2]
    if kind == "np32_reversed":
        return np.array(vals[::-1], dtype=np.int32)[::-1]
    if kind == "i64_noncontig":
        return torch.tensor(vals, dtype=torch.int64).repeat_interleave(2)[::2]
    raise AssertionError(kind)


KINDS = ["i32", "i64", "np32", "np64", "np64_strided", "np32_reversed", "i64_noncontig"]


def test_write_matches_torch_assignment():
    rng = random.Random(0)
    pool, ref = _pair()
    for _ in range(600):
        row = rng.randrange(-(ROWS + 1), ROWS + 1)
        step = rng.choice([None, 1, 1, 2, 3, 7])
        start = rng.choice([None, rng.randrange(-CTX, CTX)])
        stop = rng.choice([None, rng.randrange(-CTX, CTX + 5)])
        sl = slice(start, stop, step)
        n = len(range(*sl.indices(CTX)))
        vals = [rng.randrange(-(2**31), 2**31) for _ in range(n)]
        kind = rng.choice(KINDS)
        pool.write((row, sl), _values(kind, vals))
        ref[row, sl] = torch.tensor(vals, dtype=torch.int32)
        _same(pool, ref)


@pytest.mark.parametrize("value", [7, torch.tensor(9, dtype=torch.int64), torch.tensor([5], dtype=torch.int32),
                                   np.array(11, dtype=np.int64), np.array([13], dtype=np.int32)])
def test_one_value_broadcasts_as_torch_does(value):
    pool, ref = _pair()
    pool.write((2, slice(3, 9)), value)
    ref[2, 3:9] = torch.as_tensor(value)
    _same(pool, ref)
    assert (pool.req_to_token[2, 3:9] != 0).all()


def test_other_cases_are_torchs_assignment():
    """Indices or values outside the fast path (tensor rows, an int column,
    2-D values, values that are a view of the table) behave exactly as the
    torch assignment."""
    pool, ref = _pair()
    cases = [
        ((torch.tensor([1, 3]), torch.tensor([4, 5])), torch.tensor([21, 22], dtype=torch.int32)),
        ((4, 7), 33),
        ((1, slice(0, 3)), torch.tensor([[1, 2, 3]], dtype=torch.int64)),
        ((2,), torch.full((CTX,), 8, dtype=torch.int32)),
    ]
    for ix, v in cases:
        pool.write(ix, v)
        ref[ix] = torch.as_tensor(v)
        _same(pool, ref)
    # values that are the table's own memory (another row, then the same row shifted)
    pool.write((6, slice(0, 10)), pool.req_to_token[2, 0:10])
    ref[6, 0:10] = ref[2, 0:10]
    _same(pool, ref)
    pool.write((2, slice(5, 15)), pool.req_to_token[6, 0:10])
    ref[2, 5:15] = ref[6, 0:10].clone()
    _same(pool, ref)


def test_a_list_is_refused_as_torch_refuses_it():
    """torch takes no list, nor a numpy array other than the int32/int64
    ones the fast path reads (SGLang's writes pass tensors)."""
    pool, ref = _pair()
    for v in ([1, 2, 3], np.array([1, 2, 3], dtype=np.int16)):
        with pytest.raises(TypeError):
            ref[1, 0:3] = v
        _refused(pool, (1, slice(0, 3)), v, TypeError, [])


def test_what_torch_would_truncate_or_spread_is_refused():
    """torch's assignment truncates float values, takes a bool as 0 / 1,
    reads a bool row as a mask over every row and None as a new axis (the
    whole table).  SGLang writes KV indices to one row at a time: each of
    these raises TypeError naming the argument, the table unchanged."""
    pool, ref = _pair()
    for v in (torch.tensor([1.9, 2.2, 3.7]), np.array([1.5, 2.5, 3.5]), torch.tensor([True, False, True]), 2.5, True):
        ref[5, 0:3] = torch.as_tensor(v)      # torch takes each of them
        _refused(pool, (5, slice(0, 3)), v, TypeError, ["values"])
    for ix in ((True, slice(0, 3)), (None, slice(0, 3)), None):
        ref[ix] = 7
        _refused(pool, ix, 7, TypeError, ["indices"])


def _refused(pool, ix, v, exc, words):
    before = pool.req_to_token.clone()
    with pytest.raises(exc) as e:
        pool.write(ix, v)
    for w in words:
        assert w in str(e.value)
    assert torch.equal(pool.req_to_token, before)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_writes_raise_and_leave_the_table(kind):
    pool, ref = _pair()
    pool.write((1, slice(0, 5)), _values(kind, [1, 2, 3, 4, 5]))
    ref[1, 0:5] = torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32)
    # the torch reference refuses these too, with the same exception type
    for ix, v, exc, words in [
        ((ROWS + 1, slice(0, 3)), [1, 2, 3], IndexError, ["row", "indices"]),
        ((-(ROWS + 2), slice(0, 3)), [1, 2, 3], IndexError, ["row"]),
        ((1, slice(0, 3)), [1, 2], RuntimeError, ["values", "columns"]),
        ((1, slice(CTX - 2, CTX + 5)), [1, 2, 3, 4], RuntimeError, ["values"]),
        ((1, slice(0, 6, 2)), [1, 2, 3, 4], RuntimeError, ["values"]),
        ((1, slice(6, 0, -2)), [1, 2, 3], ValueError, ["step"]),   # torch's own refusal
        ((1, slice(0, 6, 0)), [1, 2, 3], ValueError, ["step"]),
    ]:
        with pytest.raises(exc):
            ref[ix] = torch.tensor(v, dtype=torch.int32)
        assert torch.equal(pool.req_to_token, ref)
        _refused(pool, ix, _values(kind, v), exc, words)
    # a value an int32 table cannot hold (torch would wrap it silently)
    for v in ([1, 2**31, 3], [-(2**31) - 1, 0, 0]):
        if kind in ("i32", "np32", "np32_reversed"):
            continue
        _refused(pool, (1, slice(0, 3)), _values(kind, v), OverflowError, ["values", "int32"])
    _refused(pool, (1, slice(0, 3)), 2**40, OverflowError, ["values"])
    _refused(pool, (1, slice(0, 3)), 2**70, OverflowError, ["values"])


def test_write_marks_the_columns_written():
    pool, _ = _pair()
    pool._rp.take_dirty()
    pool.write((3, slice(4, 10)), torch.arange(6, dtype=torch.int32))
    pool.write((5, slice(11, 21, 3)), np.arange(4, dtype=np.int64))
    rows, starts, ends = pool._rp.take_dirty()
    got = sorted(zip(rows.tolist(), starts.tolist(), ends.tolist()))
    assert got == [(3, 4, 10), (5, 11, 21)]


def test_write_index_declines_what_it_does_not_cover():
    pool, _ = _pair()
    rp = pool._rp
    assert rp.write_index((1, slice(0, 2)), np.array([1, 2], dtype=np.int64)) is True
    for ix, v in [((1, 2), 5), ([1, slice(0, 2)], 5), ((1, slice(0, 2)), array("q", [1, 2])),
                  ((1, slice(0, 2)), np.array([1.0, 2.0])), ((1, slice(0, 2)), np.zeros((1, 2), np.int64)),
                  ((np.int64(1), slice(0, 2)), 5), ((1, slice(0, 2)), None), ((1, slice(0, 2)), True)]:
        assert rp.write_index(ix, v) is False


def test_write_index_reads_values_after_the_slice_bounds():
    # the slice's __index__ runs before the values are read: one that
    # shrinks the values array leaves the write reading it as it is then
    # (one value, broadcast), never its freed memory
    from mambaradix import _C
    rp = _C.ReqPool(4, 64)
    held = [np.arange(40, dtype=np.int64) + 1000]

    class Start:
        def __index__(self):
            np.ndarray.resize(held.pop(), (1,))
            return 0

    ok = rp.write_index((1, slice(Start(), 40)), held[0])
    assert ok is True
    assert rp.table[1, :40].tolist() == [1000] * 40 and not rp.table[1, 40:].any()
