"""Lifecycle.cache_finished(..., tail=...): the key is tokens + tail, read
without building the sum (SGLang's origin_input_ids + output_ids).  The
reference is the same call given the concatenated tokens."""

from __future__ import annotations

from array import array

import numpy as np
import pytest

from mambaradix import _C


def _finish(tokens, committed, split):
    kv = _C.SlotAllocator(64)
    rp = _C.ReqPool(4, 64, 2)
    lc = _C.Lifecycle(_C.SlotAllocator(16), kv, rp, extra_buffer=True, chunk_size=4, track_interval=4)
    rec = _C.ReqState()
    (row,), _ = lc.admit([-1], [rec])
    lc.prepare_extend(row, rec, 0, committed)
    rp.write(row, 0, kv.alloc(committed))
    if split is None:
        lc.cache_finished(row, rec, array("q", tokens), committed)
    else:
        lc.cache_finished(row, rec, array("q", tokens[:split]), committed, tail=list(tokens[split:]))
    rp.free(row)
    lc.check()
    m = lc.match(array("q", tokens))
    return m[0].tolist(), m[3], kv.available_size(), rec.astuple()


@pytest.mark.parametrize("split", [0, 3, 8, 9, 13, 20])
@pytest.mark.parametrize("committed", [4, 9, 12])
def test_tail_is_the_concatenation(split, committed):
    rng = np.random.default_rng(split * 31 + committed)
    tokens = rng.integers(1, 1000, size=20).tolist()
    assert _finish(tokens, committed, split) == _finish(tokens, committed, None)


def test_short_or_bad_tail_is_refused():
    kv = _C.SlotAllocator(64)
    rp = _C.ReqPool(4, 64, 2)
    lc = _C.Lifecycle(_C.SlotAllocator(16), kv, rp, extra_buffer=True, chunk_size=4, track_interval=4)
    rec = _C.ReqState()
    (row,), _ = lc.admit([-1], [rec])
    rp.write(row, 0, kv.alloc(8))
    before = rec.astuple()
    with pytest.raises(ValueError, match="7 tokens for committed_len 8"):
        lc.cache_finished(row, rec, [1, 2, 3, 4], 8, tail=[5, 6, 7])
    with pytest.raises(TypeError, match="tail"):
        lc.cache_finished(row, rec, [1, 2, 3, 4], 8, tail=["x"] * 4)
    with pytest.raises(ValueError, match="tail"):
        lc.cache_finished(row, rec, [1, 2, 3, 4], 8, tail=[2**40] * 4)
    assert rec.astuple() == before
    lc.check()
