"""Index arrays in the forms SGLang hands them: its req_to_token rows are
int32, read by the bindings' one integer reader (py_ints.c), which widens
them to int64 in one pass.  Reference: the same call with the int64 array
(an independent path through the reader: read in place), and the values
written out by hand."""

from __future__ import annotations

import numpy as np
import pytest

import mambaradix
from mambaradix import _C


def _rs(running: int, track=(-1, -1), nxt: int = -1, last_track: int = -1, protected: int = 0,
        node=(-1, 0), locked: int = 0) -> tuple:
    return (running, track[0], track[1], nxt, last_track, -1, -1, 0, 1, protected, node[0], node[1], locked)


def _finish(kv) -> tuple:
    lc = _C.Lifecycle(chunk_size=4)
    out = []
    # one cached request, then one that shares its first 4 tokens: its
    # duplicates and its tail come back to be freed
    rs, kvf, stf = lc.cache_finished(_rs(5), [1, 2, 3, 4, 9, 9, 9, 9], kv[:8])
    out.append((kvf.tolist(), stf.tolist()))
    rs, kvf, stf = lc.cache_finished(_rs(6), [1, 2, 3, 4, 7, 7, 7, 7, 8, 8], kv[8:18])
    out.append((kvf.tolist(), stf.tolist()))
    m = lc.match(np.array([1, 2, 3, 4, 7, 7, 7, 7, 8, 8], np.int64))
    return out, m[0].tolist()


def test_int32_kv_rows_are_the_same_indices_as_int64() -> None:
    big = 2**31 - 1                                  # the largest index an int32 table holds
    kv64 = np.array([0, 1, 2, 3, 4, 5, 6, big, 10, 11, 12, 13, 14, 15, 16, big - 1, 20, 21], np.int64)
    got = _finish(kv64.astype(np.int32))
    assert got == _finish(kv64)
    assert got[1] == [0, 1, 2, 3, 14, 15, 16, big - 1, 20, 21]   # the tree's prefix, then the second request's
    assert got[0][1][0] == [10, 11, 12, 13]                       # its duplicates: freed


def test_a_negative_int32_index_is_named() -> None:
    t = mambaradix.RadixTree(page_size=1)
    with pytest.raises(ValueError, match=r"value\[1\] = -7 is out of range"):
        t.insert([1, 2, 3], np.array([4, -7, 5], np.int32), 1)
    assert t.total_size() == (0, 0)
    t.insert([1, 2, 3], np.array([4, 2**31 - 1, 0], np.int32), 1)
    assert t.match_prefix([1, 2, 3]).indices.tolist() == [4, 2**31 - 1, 0]


def test_int32_kv_row_survives_a_reentrant_call_while_the_tokens_are_read() -> None:
    """The tokens are read after the KV row and may run Python code (an
    item's __index__) that calls the same Lifecycle: a large insert there
    grows the Lifecycle's scratch buffers.  The KV row widened from int32
    must not live in one of them (under ASan a dangling read fails; here the
    indices would be wrong)."""
    lc = _C.Lifecycle(chunk_size=4)
    n = 8

    class Token:
        def __init__(self, v: int, reenter: bool) -> None:
            self.v, self.reenter = v, reenter

        def __index__(self) -> int:
            if self.reenter:
                self.reenter = False
                big = 1 << 16
                lc.insert(np.arange(100, 100 + big, dtype=np.int32), np.arange(big, dtype=np.int64) + 10**6, 9)
            return self.v

    kv = np.arange(500, 500 + n, dtype=np.int32)
    tokens = [Token(i + 1, i == 0) for i in range(n)]
    rs, kvf, stf = lc.cache_finished(_rs(5), tokens, kv)
    assert kvf.tolist() == [] and stf.tolist() == []
    m = lc.match(np.arange(1, n + 1, dtype=np.int64))
    assert m[0].tolist() == kv.tolist()


@pytest.mark.parametrize("form", ["array", "numpy"])
def test_an_in_place_batch_key_outside_int32_is_refused_wherever_it_is(form) -> None:
    """prefill_batch reads int64 keys where they are and only matches them:
    a token outside int32 is refused (ValueError naming it, nothing taken)
    whether it sits past what matched the tree or within the cap, as the
    narrowing of a list key refuses it (the reference)."""
    from array import array

    make = (lambda k: array("q", k)) if form == "array" else (lambda k: np.array(k, np.int64))
    cached = list(range(1, 13))
    for bad_at, bad in ((10, 2**31), (3, -(2**31) - 1), (0, 2**40)):
        st, kv, rp = _C.SlotAllocator(32), _C.SlotAllocator(256), _C.ReqPool(4, 64, 2)
        lc = _C.Lifecycle(st, kv, rp, chunk_size=4, extra_buffer=True)
        out = lc.prefill_batch([cached])
        lc.finish_batch(out["rows"], [cached])
        key = cached[:11] + [99]
        key[bad_at] = bad
        before = (st.available_size(), kv.available_size(), rp.available_size())
        msgs = []
        for k in (key, make(key)):
            with pytest.raises(ValueError, match=r"out of range") as e:
                lc.prefill_batch([[5, 6, 7], k])
            msgs.append(str(e.value))
        assert msgs[0] == msgs[1] == f"prefill_batch(): keys[1][{bad_at}] = {bad} is out of range [-2147483648, 2147483647]"
        assert (st.available_size(), kv.available_size(), rp.available_size()) == before
        lc.check()


@pytest.mark.parametrize("form", ["array", "numpy"])
def test_an_in_place_end_of_request_key_outside_int32_is_refused_before_any_row(form) -> None:
    """unfinished_batch and finish_batch read int64 keys where they are, from
    each row's locked prefix on: a token outside int32 in what they read is
    refused with the message the narrowing of a list key gives (the
    reference), and before any row of the batch changed: the first row, whose
    key is good, keeps its record, its table and its lock."""
    from array import array

    make = (lambda k: array("q", k)) if form == "array" else (lambda k: np.array(k, np.int64))
    cached = list(range(1, 13))
    st, kv, rp = _C.SlotAllocator(32), _C.SlotAllocator(256), _C.ReqPool(4, 64, 2)
    lc = _C.Lifecycle(st, kv, rp, chunk_size=4, extra_buffer=True)
    out = lc.prefill_batch([cached])
    lc.finish_batch(out["rows"], [cached])
    good, other = cached + [40, 41, 42, 43, 44], [50 + i for i in range(9)]
    out = lc.prefill_batch([good, other])
    rows = out["rows"]
    assert out["prefix_len"].tolist() == [12, 0]
    for bad_at, bad in ((7, 2**31), (2, -(2**31) - 1)):
        key = list(other)
        key[bad_at] = bad
        for call in ("unfinished_batch", "finish_batch"):
            before = ([rp.record(int(r)).astuple() for r in rows], rp.table[rows].tolist(), lc.sizes(),
                      st.available_size(), kv.available_size(), rp.available_size())
            msgs = []
            for k in (key, make(key)):
                with pytest.raises(ValueError, match=r"out of range") as e:
                    getattr(lc, call)(rows, [make(good), k])
                msgs.append(str(e.value))
            assert msgs[0] == msgs[1] == f"{call}(): keys[1][{bad_at}] = {bad} is out of range [-2147483648, 2147483647]"
            assert ([rp.record(int(r)).astuple() for r in rows], rp.table[rows].tolist(), lc.sizes(),
                    st.available_size(), kv.available_size(), rp.available_size()) == before
            lc.check()


@pytest.mark.parametrize("form", ["array", "numpy"])
def test_cache_unfinished_reads_an_int64_key_in_place_as_a_list(form) -> None:
    """Lifecycle.cache_unfinished reads an array('q') / int64 numpy key in
    place (the drop-in passes SGLang's array('q') fill ids): the same
    result, record and tree as the list form (the reference, narrowed by the
    binding), and a token outside int32 in what its insert reads is refused
    with the list form's message, nothing changed."""
    from array import array

    make = (lambda k: array("q", k)) if form == "array" else (lambda k: np.array(k, np.int64))
    base, ext = list(range(1, 17)), list(range(1, 17)) + list(range(40, 50))

    def run(conv, bad_at=None):
        st, kv, rp = _C.SlotAllocator(32), _C.SlotAllocator(256), _C.ReqPool(4, 64, 2)
        lc = _C.Lifecycle(st, kv, rp, chunk_size=4, extra_buffer=True)
        out = lc.prefill_batch([base])
        lc.finish_batch(out["rows"], [base])
        row = int(lc.prefill_batch([ext])["rows"][0])
        assert rp.record(row).protected_len == 16 and rp.record(row).last_track_seqlen == 24
        if bad_at is not None:
            key = list(ext)
            key[bad_at] = 2**35
            before = (rp.record(row).astuple(), rp.table[row].tolist(), lc.sizes(), st.available_size(),
                      kv.available_size())
            with pytest.raises(ValueError) as e:
                lc.cache_unfinished(row, rp.record(row), conv(key), len(ext))
            assert (rp.record(row).astuple(), rp.table[row].tolist(), lc.sizes(), st.available_size(),
                    kv.available_size()) == before
            lc.check()
            return str(e.value)
        rs, prefix, fs, fd = lc.cache_unfinished(row, rp.record(row), conv(ext), len(ext))
        lc.check()
        return (rs.astuple(), prefix.tolist(), fs, fd, rp.table[row].tolist(), lc.sizes(),
                lc.match(array("q", ext))[0].tolist())

    want = run(list)
    assert want[1][:24] == want[6] and len(want[6]) == 24   # the tree's indices up to the tracked 24
    assert run(make) == want
    msg = run(list, bad_at=20)
    assert msg == "cache_unfinished(): tokens[20] = 34359738368 is out of range [-2147483648, 2147483647]"
    assert run(make, bad_at=20) == msg


@pytest.mark.parametrize("form", ["array", "numpy"])
def test_a_long_int64_key_outside_int32_is_refused_wherever_it_sits(form) -> None:
    """An int64 key (array('q'), numpy) is narrowed to the tree's int32
    tokens a cache line (8 tokens) at a time, with a tail of fewer: a token
    outside int32 is refused wherever it sits -- first, last, either side of
    a line -- with the message the list form gives (the reference: each
    item converted on its own), and the tree is left as it was."""
    from array import array

    make = (lambda k: array("q", k)) if form == "array" else (lambda k: np.array(k, np.int64))
    n = 67   # 8 lines and a tail of 3
    for bad_at in (0, 7, 8, 9, 31, 32, 63, 64, 66):
        for bad in (2**31, -(2**31) - 1):
            key = list(range(1, n + 1))
            key[bad_at] = bad
            tree, lc = _C.RadixTree(), _C.Lifecycle(chunk_size=4)
            tree.insert(list(range(1, 9)), np.arange(8), 1)
            lc.insert(list(range(1, 9)), np.arange(1, 9), 1)
            calls = (("tree", lambda k: tree.insert(k, np.arange(n), 2)),
                     ("lifecycle", lambda k: lc.insert(k, np.arange(1, n + 1), 2)))
            for name, call in calls:
                msgs = []
                for k in (key, make(key)):
                    with pytest.raises(ValueError, match="out of range") as e:
                        call(k)
                    msgs.append(str(e.value))
                assert msgs[0] == msgs[1], (name, bad_at)
                assert f"key[{bad_at}] = {bad} is out of range" in msgs[1], (name, bad_at)
            assert tree.total_size()[0] == 8 and lc.match(list(range(1, 9)))[0].tolist() == list(range(1, 9))
            tree.sanity_check()
            lc.check()


def test_an_integer_torch_tensor_is_a_key_like_its_list() -> None:
    """Issue 29: an int64 / int32 CPU torch tensor given as tokens (SGLang's
    RadixKey may hold one) was taken for a lone int (it has __index__) and
    failed with torch's "only integer tensors of a single element can be
    converted to an index".  It is read through numpy, as the list of its
    values would be: the same matches, inserts and batch prefixes.  A
    tensor that is not 1-D integers is named as any array is."""
    torch = pytest.importorskip("torch")

    def run(form):
        sa, ka, rp = _C.SlotAllocator(32), _C.SlotAllocator(1024), _C.ReqPool(8, 256)
        lc = _C.Lifecycle(sa, ka, rp, page_size=1, chunk_size=4)
        key = list(range(1, 9))
        res = lc.insert(form(key), ka.alloc(8), lc.alloc_state())
        got = [tuple(res[:2]), lc.match(form(key + [9]))[0].tolist(), lc.match(form(key + [9]), limit=8)[0].tolist()]
        got.append(lc.prefill_batch([form(key + [10, 11])])["prefix_len"].tolist())
        lc.check()
        return got

    want = run(list)
    assert want[1] == want[2] == list(range(1, 9)) and want[3] == [8]
    for dtype in (torch.int64, torch.int32):
        assert run(lambda k: torch.tensor(k, dtype=dtype)) == want
    lc = _C.Lifecycle(chunk_size=4)
    assert lc.match(torch.tensor(5))[0].tolist() == []            # a 0-d tensor: one token, as an int is
    with pytest.raises(TypeError, match=r"^match\(\): key must hold integers, not buffer format 'f'$"):
        lc.match(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"^match\(\): key must be 1-dimensional, not 2-dimensional$"):
        lc.match(torch.tensor([[1, 2]]))
