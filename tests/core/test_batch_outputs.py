"""unfinished_batch and finish_batch with outputs=: a request's tokens are
keys[i] followed by outputs[i], so that a scheduler passes its origin
tokens and its output tokens as it holds them instead of joining them.

The reference is the same call given the joined sequence (key + outputs,
as SGLang's fill_ids / origin_input_ids + output_ids): over seeded random
batches of requests that share prefixes, in each mode and page size,
every call's results, every row's table, the tree (dump, sizes), the stats
and the pools' counts must be equal after each call, with keys and outputs
given as array('q'), lists and int32 numpy arrays.  A token out of int32
in an output, or outputs shorter than the committed length, is refused
before any row changed, naming the entry."""

import random
import weakref
from array import array

import numpy as np
import pytest

from seeds import seeds

from mambaradix import _C


def _lifecycle(mode: str, page: int):
    extra = mode != "no_buffer"
    sa, ka, rp = _C.SlotAllocator(48), _C.SlotAllocator(3000 * page, page), _C.ReqPool(8, 400, 2)
    lc = _C.Lifecycle(sa, ka, rp, page_size=page, chunk_size=page * 2, extra_buffer=extra,
                      lazy=mode == "lazy", track_interval=page * 2)
    return lc, sa, ka, rp


def _state(lc, sa, ka, rp) -> tuple:
    return (lc.sizes(), lc.dump(), lc.stats(), sa.counts(), ka.counts(), rp.available_size(), rp.table.tolist())


def _as(kind: str, toks):
    if kind == "q":
        return array("q", toks)
    if kind == "list":
        return list(toks)
    return np.asarray(toks, dtype=np.int32)


@pytest.mark.parametrize("mode,page", [("extra", 1), ("no_buffer", 1), ("lazy", 1), ("extra", 4), ("lazy", 4)])
@pytest.mark.parametrize("seed", seeds(3))
def test_outputs_equal_the_joined_sequence(mode: str, page: int, seed: int) -> None:
    rng = random.Random(seed)
    a, b = _lifecycle(mode, page), _lifecycle(mode, page)
    prefixes = [[rng.randrange(1, 50) for _ in range(rng.randrange(0, 120))] for _ in range(4)]
    for _ in range(12):
        n = rng.randrange(1, 6)
        origin = [rng.choice(prefixes) + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 60))]
                  for _ in range(n)]
        outs = [[] for _ in range(n)]
        ra = a[0].prefill_batch([array("q", k) for k in origin])
        rb = b[0].prefill_batch([_as(rng.choice(("q", "list", "np")), k) for k in origin])
        assert (ra is None) == (rb is None)
        if ra is None:
            continue
        assert all((ra[f] == rb[f]).all() for f in ra)
        rows = ra["rows"]
        steps = rng.randrange(0, 12)
        for call in ["unfinished"] + ["decode"] * steps + ["finish"]:
            if call == "decode":
                da, db = a[0].decode_batch(rows), b[0].decode_batch(rows)
                assert (da is None) == (db is None)
                if da is None:
                    break
                assert all((x == y).all() for x, y in zip(da, db))
                outs = [o + [rng.randrange(1, 50)] for o in outs]
                continue
            # the output token the forward produced last is not committed yet
            extra = [o + [rng.randrange(1, 50)] for o in outs]
            joined = [array("q", k + o) for k, o in zip(origin, extra)]
            keys = [_as(rng.choice(("q", "list", "np")), k) for k in origin]
            given = [_as(rng.choice(("q", "list", "np")), o) for o in extra]
            if call == "unfinished":
                fa = a[0].unfinished_batch(rows, joined)
                fb = b[0].unfinished_batch(rows, keys, outputs=given)
                assert all((x == y).all() for x, y in zip(fa, fb))
            else:
                a[0].finish_batch(rows, joined)
                b[0].finish_batch(rows, keys, outputs=given)
            assert _state(*a) == _state(*b)
        else:
            a[0].check()
            b[0].check()
            continue
        a[0].finish_batch(rows, [array("q", k + o) for k, o in zip(origin, outs)])
        b[0].finish_batch(rows, origin, outputs=outs)
        assert _state(*a) == _state(*b)
    a[0].check()
    b[0].check()


def test_refusals_name_the_output_and_change_nothing() -> None:
    lc, sa, ka, rp = _lifecycle("extra", 1)
    origin = [list(range(1, 41)), list(range(100, 131))]
    rows = lc.prefill_batch(origin)["rows"]
    before = _state(lc, sa, ka, rp)
    short = [k[:-1] for k in origin]
    with pytest.raises(ValueError, match=r"outputs\[1\]\[0\] = 4294967296 is out of range"):
        lc.unfinished_batch(rows, short, outputs=[array("q", [7]), array("q", [2**32])])
    with pytest.raises(ValueError, match=r"outputs\[0\]\[0\] = 4294967296 is out of range"):
        lc.unfinished_batch(rows, short, outputs=[[2**32], [7]])
    with pytest.raises(ValueError, match=r"keys\[0\] with its outputs has 39 tokens, fewer than the 40"):
        lc.unfinished_batch(rows, short, outputs=[[], [7]])
    with pytest.raises(ValueError, match=r"rows has 2 entries, outputs 1"):
        lc.unfinished_batch(rows, origin, outputs=[[1]])
    assert _state(lc, sa, ka, rp) == before
    lc.unfinished_batch(rows, short, outputs=[[40], [130]])
    lc.decode_batch(rows)
    before = _state(lc, sa, ka, rp)
    with pytest.raises(ValueError, match=r"finish_batch\(\): outputs\[1\]\[0\] = -4294967296 is out of range"):
        lc.finish_batch(rows, origin, outputs=[array("q", [5]), array("q", [-2**32, 5])])
    assert _state(lc, sa, ka, rp) == before
    lc.finish_batch(rows, origin, outputs=[[5], [6]])
    lc.check()


def test_an_output_that_frees_the_callers_key_reads_the_key_given() -> None:
    # keys as int64 numpy arrays are read in place; the first output token's
    # __index__ drops the caller's only reference to its key and fills an
    # array of the same size with other tokens (where freed memory may go
    # next): the call must still cache the key it was given followed by the
    # output.  Reference: the joined sequence, as int32, on a second
    # lifecycle.
    n = 1 << 16

    def world():
        sa, ka, rp = _C.SlotAllocator(16), _C.SlotAllocator(2 * n + 64), _C.ReqPool(4, n + 16, 2)
        return _C.Lifecycle(sa, ka, rp, extra_buffer=True, chunk_size=4, track_interval=4), rp

    key = np.arange(1, n + 1, dtype=np.int64)
    lc, rp = world()
    rows = lc.prefill_batch([key])["rows"].tolist()
    keys, junk, alive = [key.copy()], [], []
    del key
    held = weakref.ref(keys[0])

    class Frees:
        def __index__(self):
            keys.clear()
            junk.append(np.full(n, 9, dtype=np.int64))
            alive.append(held() is not None)     # the call still holds the key
            return 77

    lc.decode_batch(rows)
    lc.finish_batch(rows, keys, outputs=[[Frees(), 78]])
    lc.check()
    assert alive == [True] and held() is None
    ref, ref_rp = world()
    joined = np.concatenate([np.arange(1, n + 1), [77, 78]]).astype(np.int32)
    ref_rows = ref.prefill_batch([joined[:n]])["rows"].tolist()
    ref.decode_batch(ref_rows)
    ref.finish_batch(ref_rows, [joined])
    assert lc.dump() == ref.dump() and lc.sizes() == ref.sizes()
