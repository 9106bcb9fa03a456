"""Lifecycle calls whose arguments run Python code (an item's __index__)
that calls the same Lifecycle while the arguments are read.  The outer call
must work on its own arguments: the re-entrant call may not change the key
it already read, nor the request record it is about to change.  Reference:
the same two calls made one after the other (the re-entrant one first, as
it finishes first), on a second Lifecycle."""

from __future__ import annotations

import re
from array import array

import numpy as np
import pytest

from mambaradix import _C
from reentry import Calls as _Calls


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
    """A Lifecycle over its own pools: (lifecycle, state slots, KV, rows)."""
    st, kv, rp = _C.SlotAllocator(16), _C.SlotAllocator(64), _C.ReqPool(4, 64, 2)
    lc = _C.Lifecycle(st, kv, rp, extra_buffer=True, chunk_size=4, track_interval=4)
    return lc, st, kv, rp


def _hooked(reenter: bool, inner):
    """The wrapper for an argument read after the record: re-entrant, an int
    whose conversion runs `inner`; else `inner` runs now, before the call,
    and the plain value is passed."""
    if not reenter:
        inner()
        return lambda v: v
    return lambda v: _Calls(v, inner)


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
        lc, _, kv, rp = _pools()
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
        lc, _, kv, rp = _pools()
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


def test_cache_finished_reads_the_record_after_its_arrays() -> None:
    # over someone else's pools: reading the finishing request's tokens ends
    # its first chunk (cache_unfinished, which locks the node it
    # caches); the finish must unlock that node, not the record it saw
    # before
    tokens = list(range(1, 13))
    kv = np.arange(200, 212, dtype=np.int64)

    def run(reenter: bool):
        lc = _C.Lifecycle(chunk_size=4)
        rec = _C.ReqState(_rs(5))
        frees = []

        def first_chunk():
            out = lc.cache_unfinished(rec, tokens[:8], kv[:8], 6)
            frees.append((out[4].tolist(), out[5].tolist()))

        if reenter:
            key = [_Calls(tokens[0], first_chunk)] + tokens[1:]
        else:
            first_chunk()
            key = list(tokens)
        out = lc.cache_finished(rec, key, kv)
        frees.append((out[1].tolist(), out[2].tolist()))
        lc.check()
        return frees, rec.astuple(), _tree(lc, [tokens]), lc.sizes()

    got, want = run(True), run(False)
    assert got == want


def _outcome(fn, *objs):
    """fn()'s result or its exception, then each object's check()."""
    try:
        out = ("ok", fn())
    except Exception as e:  # the comparison is the test: both runs must raise alike
        out = (type(e).__name__, str(e))
    checks = []
    for o in objs:
        try:
            o.check()
            checks.append("ok")
        except Exception as e:
            checks.append(f"{type(e).__name__}: {e}")
    return out, checks


def test_match_keeps_its_converted_key_while_an_item_matches_another() -> None:
    # a list key is converted item by item; its fifth item matches another
    # key, whose tokens used to go into the same buffer over the first four
    lc = _C.Lifecycle(chunk_size=4)
    key, other = list(range(1, 9)), list(range(50, 58))
    lc.insert(key, list(range(100, 108)), 1)
    lc.insert(other, list(range(300, 308)), 2)
    got = lc.match(key[:4] + [_Calls(key[4], lambda: lc.match(list(other)))] + key[5:])
    assert got[0].tolist() == list(range(100, 108)) and got[3] == 1
    lc.check()


def _admitted_record():
    """Pools, and one request admitted (its row, its record)."""
    lc, st, kv, rp = _pools()
    rec = _C.ReqState()
    (row,), _ = lc.admit([-1], [rec])
    return lc, st, kv, rp, row, rec


def test_match_cow_checks_the_row_after_reading_the_key() -> None:
    # the key's reading frees the row the copy-on-write would give a slot
    # to; the call must refuse the row as a sequential call does (it used
    # to give a state slot to the freed row, which nobody could free)
    def run(reenter: bool):
        lc, st, kv, rp, row, rec = _admitted_record()
        key = list(range(1, 9))
        lc.insert(key, kv.alloc(8), int(st.alloc(1)[0]))
        free_row = lambda: (lc.free_states(rec), rp.free(row))  # noqa: E731
        if reenter:
            k = [_Calls(key[0], free_row)] + key[1:]
        else:
            free_row()
            k = key
        other = _C.ReqState()
        out = _outcome(lambda: lc.match(k, cow=True, owner=row, rs=other)[3], lc, rp, st)
        return out, rp.in_use(row), other.astuple(), st.counts()

    got = run(True)
    assert got == run(False)
    assert "not a request row in use" in got[0][0][1]
    assert got[3]["req"] == 0


_RECORD_CASES = {
    # the call, with the argument read after the record wrapped by `a`
    "prepare_extend(prefix_len)": lambda lc, row, rec, a: lc.prepare_extend(row, rec, a(0), 8),
    "prepare_extend(extend_len)": lambda lc, row, rec, a: lc.prepare_extend(row, rec, 0, a(8)),
    "decode_prepare(seq_len)": lambda lc, row, rec, a: lc.decode_prepare(row, rec, a(9)),
    "decode_finish(committed_len)": lambda lc, row, rec, a: lc.decode_finish(row, rec, a(8), False),
    "free_states(keep)": lambda lc, row, rec, a: lc.free_states(rec, keep=a(0)),
}


@pytest.mark.parametrize("case", sorted(_RECORD_CASES))
def test_per_request_calls_read_the_record_after_their_other_arguments(case) -> None:
    # an argument's __index__ frees the request's slots (a flag runs no
    # code: it must be a bool, test_bool_flags.py)
    # (free_states); the call used to write its earlier copy of the record
    # back, naming free slots again
    def run(reenter: bool):
        lc, st, kv, rp, row, rec = _admitted_record()
        a = _hooked(reenter, lambda: lc.free_states(rec))
        out = _outcome(lambda: _RECORD_CASES[case](lc, row, rec, a) and None, lc, rp, st)
        return out, rec.astuple(), lc.sizes(), st.counts()

    got = run(True)
    assert got == run(False)
    assert got[0][1] == ["ok", "ok", "ok"]


_FOREIGN_CASES = {
    "decode_prepare(seq_len)": lambda lc, rec, a: lc.decode_prepare(rec, a(9)),
    "decode_prepare(fresh)": lambda lc, rec, a: lc.decode_prepare(rec, 9, a(-1)),
    "decode_finish(committed_len)": lambda lc, rec, a: lc.decode_finish(rec, a(9), False),
}


@pytest.mark.parametrize("case", sorted(_FOREIGN_CASES))
def test_foreign_calls_read_the_record_after_their_other_arguments(case) -> None:
    # over someone else's pools: an argument's reading ends the request's
    # first chunk (cache_unfinished locks the node it caches and
    # notes the lock in the record); the call used to write its earlier
    # copy back, losing the lock for good
    tokens = list(range(1, 13))
    kv = np.arange(200, 212, dtype=np.int64)

    def run(reenter: bool):
        lc = _C.Lifecycle(chunk_size=4)
        rec = _C.ReqState(_rs(5))
        a = _hooked(reenter, lambda: lc.cache_unfinished(rec, tokens[:8], kv[:8], 6))
        out = _outcome(lambda: _FOREIGN_CASES[case](lc, rec, a) and None, lc)
        return out, rec.astuple(), lc.sizes()

    got = run(True)
    assert got == run(False)
    assert got[1][12] == 1   # the record still holds its lock on the cached node (locked)


def test_admit_reads_the_record_after_the_fresh_slots() -> None:
    # reading the fresh slot admits the request with another slot; the call
    # used to take the slot from its earlier copy (no running slot) and drop
    # the other from the record; as after the inner call, it must refuse
    def run(reenter: bool):
        lc = _C.Lifecycle(chunk_size=4)
        rec = _C.ReqState()
        inner = lambda: lc.admit(rec, [7])  # noqa: E731
        if not reenter:
            inner()
        out = _outcome(lambda: lc.admit(rec, [_Calls(9, inner) if reenter else 9]) and None, lc)
        return out, rec.astuple()

    got = run(True)
    assert got == run(False)
    assert got[1][0] == 7 and got[0][0][0] == "ValueError"


def test_cow_resolves_the_node_after_its_other_arguments() -> None:
    # `fresh`'s reading evicts the matched node; the call used to go on with
    # the freed node (a use after free; here a stale slot as cow_src)
    lc = _C.Lifecycle(chunk_size=4)
    keys = [list(range(1, 9)), list(range(50, 58))]
    lc.insert(keys[0], list(range(100, 108)), 3)
    _, nid, ngen, state, _, _ = lc.match(keys[0])
    assert state == 3

    def evict():
        lc.evict(8, 1)
        lc.insert(keys[1], list(range(300, 308)), 11)   # may reuse the freed node

    rec = _C.ReqState()
    with pytest.raises(_C.StaleNodeError):
        lc.cow(rec, nid, ngen, _Calls(7, evict))
    assert rec.cow_src == -1 and rec.running == -1
    lc.check()


def test_admit_reads_the_records_after_the_rows() -> None:
    # rows[1]'s reading admits rs_list[0] on its own; the batch admission
    # used to admit it again from its earlier copy, orphaning a row and its
    # slots
    def run(reenter: bool):
        lc, st, kv, rp, row, first = _admitted_record()
        a, b = _C.ReqState(), _C.ReqState()
        inner = lambda: lc.admit([-1], [a])  # noqa: E731
        if not reenter:
            inner()
        out = _outcome(lambda: lc.admit([-1, _Calls(-1, inner) if reenter else -1], [a, b]) and None, lc, rp, st)
        return out, a.astuple(), a.row, b.astuple(), rp.available_size(), st.counts()

    got = run(True)
    assert got == run(False)
    assert "rs_list[0] is the record of request row" in got[0][0][1]


def test_admit_holds_its_own_references_to_the_records() -> None:
    # rows[0]'s reading empties the caller's rs_list: the records must stay
    # alive (they used to be read after being freed)
    lc, st, kv, rp, row, first = _admitted_record()
    rs_list = [_C.ReqState(), _C.ReqState()]
    keep = list(rs_list)
    rows, recs = lc.admit([_Calls(-1, rs_list.clear), -1], rs_list)
    assert recs == keep and [r.row for r in keep] == rows
    lc.check()
    rp.check()


@pytest.mark.parametrize("field,value", [("last_track_seqlen", 4), ("node_id", -1)])
def test_record_setters_convert_the_value_first(field, value) -> None:
    # the value's __index__ frees the request's slots; the setter used to
    # write its earlier copy of the whole record back
    def run(reenter: bool):
        lc, st, kv, rp, row, rec = _admitted_record()
        inner = lambda: lc.free_states(rec)  # noqa: E731
        if not reenter:
            inner()
        setattr(rec, field, _Calls(value, inner) if reenter else value)
        return _outcome(lambda: None, lc, rp, st), rec.astuple(), st.counts()

    got = run(True)
    assert got == run(False)
    assert got[0][1] == ["ok", "ok", "ok"]


@pytest.mark.parametrize("which", ["keys", "ns"])
def test_batch_calls_hold_their_own_references_to_keys_and_namespaces(which) -> None:
    # an item's __index__ empties the caller's list of keys (or of
    # namespaces) while it is read: the call reads the list as it was (it
    # used to read past its end)
    def run(reenter: bool):
        lc, st, kv, rp, row, rec = _admitted_record()
        keys = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
        ns = [0, 0, 0]
        if reenter and which == "keys":
            keys[0] = [_Calls(1, keys.clear), 2, 3, 4]
        elif reenter:
            ns[0] = _Calls(0, ns.clear)
        out = lc.prefill_batch(keys, ns=ns)
        lc.check()
        return out["prefix_len"].tolist(), out["rows"].tolist(), rp.available_size(), kv.available_size()

    got = run(True)
    assert got == run(False)
    assert len(got[1]) == 3


@pytest.mark.parametrize("call", ["unfinished_batch", "finish_batch"])
def test_batch_calls_keep_keys_read_in_place_alive(call) -> None:
    # int64 keys are read where they are; an output token's __index__ drops
    # the caller's only reference to such a key and fills a new array of the
    # same size (the freed memory's likely next use): the call still reads
    # the key it was given (it used to read freed memory)
    n = 1 << 16

    def run(reenter: bool):
        sa, ka, rp = _C.SlotAllocator(16), _C.SlotAllocator(n + 64), _C.ReqPool(4, n + 8, 2)
        lc = _C.Lifecycle(sa, ka, rp, extra_buffer=True, chunk_size=4, track_interval=4)
        rows = lc.prefill_batch([np.arange(1, n + 1, dtype=np.int64)])["rows"].tolist()
        keys = [np.arange(1, n + 1, dtype=np.int64)]
        junk = []

        def drop():
            keys.clear()
            junk.append(np.full(n, 7, dtype=np.int64))

        out = [[_Calls(5, drop) if reenter else 5]]
        if call == "unfinished_batch":
            lc.decode_batch(rows)
            getattr(lc, call)(rows, keys, outputs=out)
        else:
            getattr(lc, call)(rows, keys, outputs=out)
        lc.check()
        probe = array("q", range(1, n + 1))
        return len(lc.match(probe)[0]), lc.sizes()

    got = run(True)
    assert got == run(False)
    assert got[0] > n // 2          # the key went into the tree


def test_tuple_records_are_range_checked_like_the_setters() -> None:
    # a 13-tuple record (a request object that is not ours) is checked item
    # by item as the ReqState setters check a field: next_track indexes the
    # two-entry track buffer, an id or generation is 32-bit (they used to be
    # narrowed silently, and next_track = 2 read past the buffer)
    lc = _C.Lifecycle(extra_buffer=True, chunk_size=4, track_interval=4)
    base = [-1, 5, 6, 0, -1, -1, -1, 0, 0, 0, -1, 0, 0]
    for i, bad, where in ((3, 2, "rs[3] must be in [-1, 1]"), (3, 2**32 + 1, "rs[3] must be in [-1, 1]"),
                          (11, 2**40, "rs[11] must be in [0, 4294967295]"), (10, -2, "rs[10] must be in")):
        t = list(base)
        t[i] = bad
        with pytest.raises(ValueError, match=re.escape(where)):
            lc.prepare_extend(0, tuple(t), 0, 8)
        with pytest.raises(ValueError, match=re.escape(where)):
            _C.ReqState(tuple(t))
    rs = _C.ReqState(tuple(base))
    for v in (2, -2, 100000):
        with pytest.raises(ValueError, match=r"next_track must be in \[-1, 1\]"):
            rs.next_track = v
    assert rs.astuple() == tuple(base)
    # an item's __index__ empties the caller's list while it is read
    items = list(base)
    items[1] = _Calls(5, items.clear)
    assert _C.ReqState(items).astuple() == tuple(base)
