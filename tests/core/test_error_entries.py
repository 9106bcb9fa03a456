"""Refusals name the argument, the entry and why (issue 29, item 15).

The allocator's free / transfer / release_tree used to say "slot 5000 is out
of range or listed twice"; they now name the entry (indices[i] = v) and the
one reason: out of range (with the range), listed twice (with the other
entry), not allocated, or held by someone else (the prefix tree, a request
row, the open alloc group).  write_req_to_token names starts / ends and the
row an entry writes instead of calling an entry number a "row".  The batch
calls name the key or row: a key too long, a row not in use, a row listed
twice (which finish_batch used to finish once before refusing the second),
a key shorter than its row's committed tokens, a full row.  Expected
messages are written by hand; every refusal leaves the pools as they were."""

import re

import numpy as np
import pytest

from mambaradix import _C


def _raises(exc, msg, call):
    with pytest.raises(exc, match="^" + re.escape(msg) + "$"):
        call()


def test_free_names_the_entry_and_the_reason() -> None:
    a = _C.SlotAllocator(1024)
    held = a.alloc(20).tolist()                   # 1..20
    a.transfer([6], "tree")
    counts = a.counts()
    _raises(ValueError, "free(): indices[3] = 5000 is out of range [1, 1025)", lambda: a.free([1, 2, 3, 5000]))
    _raises(ValueError, "free(): indices[0] = 0 is out of range [1, 1025)", lambda: a.free([0]))
    _raises(ValueError, "free(): indices[1] = -3 is out of range [1, 1025)", lambda: a.free([1, -3]))
    _raises(ValueError, "free(): indices[7] = 12 is listed twice (also at indices[2])",
            lambda: a.free([1, 2, 12, 3, 4, 5, 7, 12, 9]))
    _raises(_C.OwnershipError, "free(): indices[1] = 900 is not allocated (already free: a double free)",
            lambda: a.free([1, 900]))
    _raises(_C.OwnershipError, "free(): indices[2] = 6 is not owned by the caller: the prefix tree holds it",
            lambda: a.free([1, 2, 6]))
    _raises(_C.OwnershipError, "transfer(): indices[1] = 1000 is not allocated (already free)",
            lambda: a.transfer([1, 1000], "tree"))
    _raises(_C.OwnershipError, "release_tree(): indices[1] = 2 is not the prefix tree's: a caller holds it",
            lambda: a.release_tree([6, 2]))
    assert a.counts() == counts and held == list(range(1, 21))
    a.check()


def test_free_names_pages_rows_and_groups() -> None:
    k = _C.SlotAllocator(64, 4)                   # pages 1..16: tokens 4..67
    toks = k.alloc(8).tolist()                    # pages 1, 2
    _raises(ValueError, "free(): indices[1] = 68 is out of range [4, 68)", lambda: k.free([toks[0], 68]))
    _raises(_C.OwnershipError, "free(): indices[0] = 60 (page 15) is not allocated (already free: a double free)",
            lambda: k.free([60]))
    k.free([toks[0], toks[1]])                    # one page listed twice: freed once
    r = _C.SlotAllocator(8)
    row3 = r.alloc(2, owner=3).tolist()           # [1, 2] owned by request row 3
    r.transfer(row3[:1], "tree")
    _raises(_C.OwnershipError, "release_tree(): indices[1] = 2 is not the prefix tree's: request row 3 owns it",
            lambda: r.release_tree(row3))
    g = _C.SlotAllocator(8)
    g.alloc_group_begin(3)
    first = int(g.alloc(1)[0])
    _raises(_C.OwnershipError, f"free(): indices[0] = {first + 1} is not owned by the caller: the open alloc "
                               "group holds it (not handed out yet)", lambda: g.free([first + 1]))
    for p in (k, r, g):
        p.check()


def test_write_req_to_token_names_starts_ends_and_the_row() -> None:
    t = np.zeros((4, 16), np.int32)
    _raises(IndexError, "write_req_to_token(): starts[1] = 10, ends[1] = 20: columns [10, 20) of rows[1] = 2 are "
                        "outside the table's [0, 16)",
            lambda: _C.write_req_to_token(t, [1, 2], [0, 10], [1] * 12, ends=[2, 20]))
    _raises(IndexError, "write_req_to_token(): ends[1] = 0 is before starts[1] = 5",
            lambda: _C.write_req_to_token(t, [1, 2], [0, 5], [1] * 7, ends=[2, 0]))
    _raises(IndexError, "write_req_to_token(): starts[1] = 12, 8 values: columns [12, 20) of rows[1] = 2 are "
                        "outside the table's [0, 16)",
            lambda: _C.write_req_to_token(t, [1, 2], [0, 12], np.ones((2, 8), np.int64)))
    assert not t.any()


def _batch():
    sa, ka, rp = _C.SlotAllocator(32), _C.SlotAllocator(256), _C.ReqPool(4, 16)
    lc = _C.Lifecycle(sa, ka, rp, page_size=1, chunk_size=4)
    out = lc.prefill_batch([[1, 2, 3], [4, 5, 6]])
    return lc, sa, ka, rp, out["rows"].tolist()


def test_batch_calls_name_the_key_or_row_and_change_nothing() -> None:
    lc, sa, ka, rp, (r1, r2) = _batch()
    before = (lc.dump(), sa.counts(), ka.counts(), rp.available_size(), rp.record(r1).astuple())
    keys = [[1, 2, 3, 9], [4, 5, 6, 9]]
    _raises(ValueError, f"finish_batch(): rows[1] = {r1} is listed twice (also at rows[0])",
            lambda: lc.finish_batch([r1, r1], keys))
    _raises(_C.OwnershipError, "finish_batch(): rows[1] = 3 is not a request row in use (finished twice?)",
            lambda: lc.finish_batch([r1, 3], keys))
    _raises(ValueError, f"unfinished_batch(): keys[1] has 2 tokens, fewer than the 3 that rows[1] = {r2} has "
                        "committed", lambda: lc.unfinished_batch([r1, r2], [[1, 2, 3], [4, 5]]))
    _raises(ValueError, f"decode_batch(): rows[2] = {r1} is listed twice (also at rows[0])",
            lambda: lc.decode_batch([r1, r2, r1]))
    _raises(ValueError, "finish_batch(): rows has 2 entries, keys 1", lambda: lc.finish_batch([r1, r2], keys[:1]))
    _raises(ValueError, "prefill_batch(): keys[1] has 17 tokens, more than max_context_len = 16",
            lambda: lc.prefill_batch([[1], list(range(17))]))
    assert (lc.dump(), sa.counts(), ka.counts(), rp.available_size(), rp.record(r1).astuple()) == before
    lc.check()
    for _ in range(13):
        lc.decode_batch([r2])
    _raises(ValueError, f"decode_batch(): rows[0] = {r2} is full: its 16 tokens fill max_context_len",
            lambda: lc.decode_batch([r2]))
    lc.finish_batch([r1, r2], [[1, 2, 3], list(range(4, 20))])
    lc.check()
