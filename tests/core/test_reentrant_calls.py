"""Lifecycle calls whose arguments run Python code (an item's __index__)
that calls the same Lifecycle while the arguments are read.  The outer call
must work on its own arguments: the re-entrant call may not change the key
it already read, nor the request record it is about to change.  Reference:
the same two calls made one after the other (the re-entrant one first, as
it finishes first), on a second Lifecycle."""

from __future__ import annotations

from array import array

import numpy as np

from mambaradix import _C


class _Calls:
    """An int whose __index__ first runs `fn` once."""

    def __init__(self, v: int, fn) -> None:
        self.v, self.fn = v, fn

    def __index__(self) -> int:
        fn, self.fn = self.fn, None
        if fn is not None:
            fn()
        return self.v


def _tree(lc, keys):
    """What the tree answers for each key: (indices, matched length)."""
    out = []
    for k in keys:
        m = lc.match(array("q", k))
        out.append((m[0].tolist(), len(m[0])))
    return out


def test_insert_keeps_its_key_while_a_reentrant_insert_runs() -> None:
    # the value is read after the key; an item of it inserts another key
    # of the same length, which used to land in the buffer holding the
    # outer key: the outer values went in under the inner tokens
    outer_key, outer_val = [1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15]
    inner_key, inner_val = [7, 8, 9, 7, 8, 9], [20, 21, 22, 23, 24, 25]
    lc = _C.Lifecycle(chunk_size=4)
    value = [_Calls(outer_val[0], lambda: lc.insert(list(inner_key), inner_val, 3))] + outer_val[1:]
    lc.insert(list(outer_key), value, 2)
    lc.check()
    ref = _C.Lifecycle(chunk_size=4)
    ref.insert(list(inner_key), inner_val, 3)
    ref.insert(list(outer_key), outer_val, 2)
    assert _tree(lc, [outer_key, inner_key]) == _tree(ref, [outer_key, inner_key])
    assert _tree(lc, [outer_key])[0][0] == outer_val


def _pools():
    kv = _C.SlotAllocator(64)
    rp = _C.ReqPool(4, 64, 2)
    lc = _C.Lifecycle(_C.SlotAllocator(16), kv, rp, extra_buffer=True, chunk_size=4, track_interval=4)
    return lc, kv, rp


def _admitted(lc, kv, rp, n, extend):
    """A request admitted with n KV indices in its row, its first prefill
    chunk of `extend` tokens decided."""
    rec = _C.ReqState()
    (row,), _ = lc.admit([-1], [rec])
    lc.prepare_extend(row, rec, 0, extend)
    vals = kv.alloc(n)
    rp.write(row, 0, vals)
    return row, rec, vals


def test_cache_finished_keeps_its_key_while_the_tail_runs_a_reentrant_match() -> None:
    # the tail is read after the tokens; an item of it matches a longer
    # list key, which is read into the buffer holding the tokens
    tokens = [5, 6, 7, 8, 9, 10, 11, 12]
    other = list(range(100, 140))

    def run(reenter: bool):
        lc, kv, rp = _pools()
        row, rec, vals = _admitted(lc, kv, rp, 8, 8)
        tail = tokens[4:]
        if reenter:
            tail = [_Calls(tail[0], lambda: lc.match(list(other)))] + tail[1:]
        lc.cache_finished(row, rec, array("q", tokens[:4]), 8, tail=tail)
        rp.free(row)
        lc.check()
        return _tree(lc, [tokens, other]), vals.tolist(), kv.available_size(), rec.astuple()

    got, want = run(True), run(False)
    assert got == want
    assert got[0][0] == (got[1], 8)   # the request's tokens map to its KV


def test_cache_unfinished_reads_the_request_record_after_its_tokens() -> None:
    # reading the second chunk's tokens ends the same request's first chunk
    # (cache_unfinished) and decides the second (prepare_extend); the outer
    # call must then see the record those calls left, as if the three had
    # run one after the other
    tokens = list(range(1, 13))

    def run(reenter: bool):
        lc, kv, rp = _pools()
        row, rec, vals = _admitted(lc, kv, rp, 12, 8)

        def first_chunk():
            lc.cache_unfinished(row, rec, tokens[:8], 8)
            lc.prepare_extend(row, rec, 8, 4)

        if reenter:
            key = [_Calls(tokens[0], first_chunk)] + tokens[1:]
        else:
            first_chunk()
            key = list(tokens)
        out = lc.cache_unfinished(row, rec, key, 12)
        lc.check()
        return out[1].tolist(), rec.astuple(), _tree(lc, [tokens]), kv.available_size(), vals.tolist()

    got, want = run(True), run(False)
    assert got == want
    assert got[0] == got[4]   # the whole row is the tree's now


def _rs(running: int) -> tuple:
    # (running, track pair, next track, last tracked, cow source, branching,
    #  needs_clear, flags, protected_len, node id, node generation, locked)
    return (running, -1, -1, -1, -1, -1, -1, 0, 1, 0, -1, 0, 0)


def test_cache_finished_foreign_reads_the_record_after_its_arrays() -> None:
    # over someone else's pools: reading the finishing request's tokens ends
    # its first chunk (cache_unfinished_foreign, which locks the node it
    # caches); the finish must unlock that node, not the record it saw
    # before
    tokens = list(range(1, 13))
    kv = np.arange(200, 212, dtype=np.int64)

    def run(reenter: bool):
        lc = _C.Lifecycle(chunk_size=4)
        rec = _C.ReqState(_rs(5))
        frees = []

        def first_chunk():
            out = lc.cache_unfinished_foreign(rec, tokens[:8], kv[:8], 6)
            frees.append((out[4].tolist(), out[5].tolist()))

        if reenter:
            key = [_Calls(tokens[0], first_chunk)] + tokens[1:]
        else:
            first_chunk()
            key = list(tokens)
        out = lc.cache_finished_foreign(rec, key, kv)
        frees.append((out[1].tolist(), out[2].tolist()))
        lc.check()
        return frees, rec.astuple(), _tree(lc, [tokens]), lc.sizes()

    got, want = run(True), run(False)
    assert got == want
