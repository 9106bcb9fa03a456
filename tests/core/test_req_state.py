"""ReqState: a request's record as the Lifecycle's per-request calls take
it.  The tuple form of the same calls is the reference: a call given a
ReqState must leave it equal to the tuple that call returns, hand back the
same object, and leave it unchanged when it fails."""

from __future__ import annotations

import pytest

from mambaradix import _C


def _lc():
    return _C.Lifecycle(_C.SlotAllocator(16), _C.SlotAllocator(64), _C.ReqPool(4, 64, 2),
                        extra_buffer=True, chunk_size=4, track_interval=4)


def test_round_trip_and_defaults() -> None:
    rs = _C.ReqState()
    assert rs.astuple() == (-1, -1, -1, -1, -1, -1, -1, 0, 1, 0, -1, 0, 0)
    t = (3, 4, 5, 1, 8, -1, 2, 1, 0, 4, 7, 2, 1)
    rs = _C.ReqState(t)
    assert rs.astuple() == t and (rs.running, rs.track1, rs.node_id, rs.locked) == (3, 5, 7, 1)
    rs.node_id = -1  # no node: no lock either
    assert rs.locked == 0 and rs.node_id == -1
    rs.reset()
    assert rs.astuple() == _C.ReqState().astuple()


def test_bad_input() -> None:
    with pytest.raises(TypeError):
        _C.ReqState(5)
    with pytest.raises(ValueError, match="13 items"):
        _C.ReqState((1, 2, 3))
    with pytest.raises(TypeError):
        _C.ReqState().running = "x"
    with pytest.raises(ValueError, match="node_id"):
        _C.ReqState().node_id = -5
    with pytest.raises(TypeError, match="rs must be a ReqState"):
        _lc().match([1, 2, 3], rs=(1,) * 13)


# SGLang's Req fields as the record holds them: mamba_next_track_idx picks one
# of the two ping-pong slots (or None); ids and generations are 32-bit
RANGES = {3: (-1, 1), 10: (-1, 2**32 - 1), 11: (0, 2**32 - 1)}
NAMES = {3: "next_track", 10: "node_id", 11: "node_gen"}


@pytest.mark.parametrize("i", sorted(RANGES))
def test_fields_take_their_range_only(i) -> None:
    lo, hi = RANGES[i]
    base = [-1, 5, 6, 0, -1, -1, -1, 0, 0, 0, 3, 0, 0]
    for v in (lo, hi):
        t = list(base)
        t[i] = v
        assert _C.ReqState(tuple(t)).astuple()[i] == v
        rs = _C.ReqState(tuple(base))
        setattr(rs, NAMES[i], v)
        assert rs.astuple()[i] == v
    for v in (lo - 1, hi + 1, hi + 2**32):
        t = list(base)
        t[i] = v
        with pytest.raises(ValueError, match=rf"rs\[{i}\] must be in"):
            _C.ReqState(tuple(t))
        rs = _C.ReqState(tuple(base))
        with pytest.raises(ValueError, match=f"{NAMES[i]} must be in"):
            setattr(rs, NAMES[i], v)
        assert rs.astuple() == tuple(base)


def test_calls_update_the_record_as_the_tuple_calls_do() -> None:
    a, b = _lc(), _lc()
    rows_a, (ta,) = a.admit([-1], [_C.ReqState().astuple()])
    rec = _C.ReqState()
    rows_b, (rb,) = b.admit([-1], [rec])
    assert rb is rec and rows_a == rows_b and rec.astuple() == ta
    row = rows_a[0]
    ta, *out_a = a.prepare_extend(row, ta, 0, 9)
    rb, *out_b = b.prepare_extend(row, rec, 0, 9)
    assert rb is rec and out_a == out_b and rec.astuple() == ta
    assert rec.last_track_seqlen == 8
    for seq in (10, 11, 12):
        ta, *out_a = a.decode_prepare(row, ta, seq)
        rb, *out_b = b.decode_prepare(row, rec, seq)
        assert out_a == out_b and rec.astuple() == ta
        ta, at_a = a.decode_finish(row, ta, seq, False)
        rb, at_b = b.decode_finish(row, rec, seq, False)
        assert at_a == at_b and rec.astuple() == ta


def test_a_failed_call_leaves_the_record() -> None:
    lc = _lc()
    rows, (rec,) = lc.admit([-1], [_C.ReqState()])
    lc.free_states(rec)
    before = rec.astuple()
    with pytest.raises(_C.OwnershipError):
        lc.free_states(rec)  # double free
    assert rec.astuple() == before
    with pytest.raises(_C.OwnershipError):
        lc.cache_finished(rows[0], rec, [1, 2, 3, 4], 0)
    assert rec.astuple() == before


def _pools():
    rp = _C.ReqPool(4, 64, 2)
    lc = _C.Lifecycle(_C.SlotAllocator(16), _C.SlotAllocator(64), rp, extra_buffer=True, chunk_size=4,
                      track_interval=4)
    return rp, lc


def test_the_record_moves_into_its_row_and_back() -> None:
    """admit moves a ReqState's record into its ReqPool row: the pool's view
    of the row (ReqPool.record) is the same record, the calls update the row,
    the track entries are the row of the pool's track map.  ReqPool.free
    moves it back into the ReqState (the request keeps its fields, as
    SGLang's Req does); the view of the freed row raises ReferenceError."""
    rp, lc = _pools()
    rec = _C.ReqState()
    assert rec.row == -1
    (row,), _ = lc.admit([-1], [rec])
    assert rec.row == row
    view = rp.record(row)
    assert view.row == row and view.astuple() == rec.astuple() and view.running == rec.running >= 1
    assert rp.state_map[row] == rec.running and rp.track_map[row].tolist() == [rec.track0, rec.track1]
    lc.prepare_extend(row, rec, 0, 9)
    assert view.last_track_seqlen == rec.last_track_seqlen == 8  # the call wrote the row
    view.branching_seqlen = 5
    assert rec.branching_seqlen == 5  # one record, not two
    t1 = rec.track1
    rp.track_map[row, 1] = 15
    assert rec.track1 == view.track1 == rec.astuple()[2] == 15  # the row's track entries are its track map
    assert lc.decode_prepare(row, rec, 3)[1] == 15  # and the calls read them there (track[next] = track1)
    rec.track1 = t1
    assert rp.track_map[row, 1] == t1
    lc.check()
    with pytest.raises(BufferError, match=f"request row {row}"):
        memoryview(rec)
    with pytest.raises(ValueError, match=f"rs is the record of request row {row}, not of row {row + 1}"):
        lc.prepare_extend(row + 1, rec, 0, 1)
    before = rec.astuple()
    rp.free(row)
    assert rec.row == -1 and rec.astuple() == before  # back in the ReqState
    assert bytes(memoryview(rec)) != b""  # its own buffer again
    with pytest.raises(ReferenceError, match=f"request row {row}, which was freed since"):
        view.running
    with pytest.raises(ReferenceError, match="stale handle"):
        lc.free_states(view)
    lc.free_states(rec)
    lc.check()


def test_cache_finished_hands_the_record_back() -> None:
    """A finished request's record leaves its row (which the scheduler frees
    next); it stays with the request."""
    rp, lc = _pools()
    rec = _C.ReqState()
    (row,), _ = lc.admit([-1], [rec])
    rp.write(row, 0, [1, 2, 3, 4])
    lc.cache_finished(row, rec, [1, 2, 3, 4], 0)
    assert rec.row == -1 and rec.running == -1
    assert rp.record(row).astuple() == _C.ReqState().astuple()  # the row keeps a reset record
    rp.free(row)
    lc.check()


def test_a_row_freed_behind_a_handle_makes_it_stale() -> None:
    """A row freed by a call that does not know the ReqState (a batched
    call) leaves it stale: every use raises ReferenceError naming the row,
    nothing reads the row's next record."""
    rp, lc = _pools()
    rec = _C.ReqState()
    (row,), _ = lc.admit([-1], [rec])
    lc.finish_batch([row], [[1, 2, 3]])
    others = [_C.ReqState() for _ in range(4)]
    rows, _ = lc.admit([-1] * 4, others)
    other = others[rows.index(row)]  # the row is reused, for another record
    for use in (lambda: rec.running, lambda: rec.astuple(), lambda: setattr(rec, "cow_src", 3), rec.reset,
                lambda: lc.free_states(rec)):
        with pytest.raises(ReferenceError, match=f"request row {row}"):
            use()
    assert other.row == row and other.running >= 1
    lc.check()


def test_admission_keeps_one_record_per_row() -> None:
    rp, lc = _pools()
    a, b = _C.ReqState(), _C.ReqState()
    with pytest.raises(ValueError, match=r"rs_list\[1\] is rs_list\[0\]"):
        lc.admit([-1, -1], [a, a])
    (row,), _ = lc.admit([-1], [a])
    with pytest.raises(ValueError, match=f"request row {row} holds another request's record"):
        lc.admit([row], [b])
    with pytest.raises(ValueError, match=f"rs_list\\[0\\] is the record of request row {row}, not of row"):
        lc.admit([-1], [a])
    assert b.row == -1 and rp.available_size() == 3
    lc.check()


def test_a_copy_on_write_match_for_a_row_keeps_the_rows_record() -> None:
    """match(cow=True, owner=row) gives the row's request a running slot and
    the row's maps follow that request's record.  A call whose record is not
    the row's (none, another row's, one outside the row while the row holds
    one), or whose owner is not a row in use, would rewrite a row's maps
    from it: it raises ValueError naming rs / owner, and the row keeps what
    admit gave it (its maps equal to its record, the slots owned as they
    were; a free row's maps untouched)."""
    states, kv, rp = _C.SlotAllocator(16), _C.SlotAllocator(64), _C.ReqPool(4, 64, 2)
    lc = _C.Lifecycle(states, kv, rp, extra_buffer=True, chunk_size=4, track_interval=4)
    rec, other = _C.ReqState(), _C.ReqState()
    (row, row2), _ = lc.admit([-1, -1], [rec, other])
    lc.insert([1, 2, 3, 4], kv.alloc(4), int(states.alloc(1)[0]))
    key = [1, 2, 3, 4, 5]

    def held():
        return (int(rp.state_map[row]), rp.track_map[row].tolist(), rec.astuple(), states.counts())

    before = held()
    assert before[0] == rec.running >= 1 and before[1] == [rec.track0, rec.track1] and -1 not in before[1]
    for owner, kw, msg in ((row, {}, f"owner={row} .*needs rs"),
                           (row, {"rs": other}, f"rs is the record of request row {row2}, not of owner={row}"),
                           (row, {"rs": _C.ReqState()}, f"owner={row} holds another request's record"),
                           (3, {"rs": _C.ReqState()}, "owner=3 is not a request row in use"),
                           (99, {"rs": _C.ReqState()}, "owner=99 is not a request row in use")):
        free_maps = (rp.state_map[3:].tolist(), rp.track_map[3:].tolist())
        with pytest.raises(ValueError, match=msg):
            lc.match(key, cow=True, owner=owner, **kw)
        assert held() == before and (rp.state_map[3:].tolist(), rp.track_map[3:].tolist()) == free_maps
        lc.check()
    assert lc.match(key, cow=True)[5] >= 1   # held (owner -2): the slot is only in the result
    assert held()[:3] == before[:3]
    # the row's own record: a hit records the source; a record that lost its
    # slots gets a fresh running slot, and the row's maps follow the record
    lc.match(key, cow=True, owner=row, rs=rec)
    assert rec.cow_src == lc.match(key)[3] and held()[:2] == before[:2]
    lc.free_states(rec)
    lc.match(key, cow=True, owner=row, rs=rec)
    assert rec.running >= 1 and (rec.track0, rec.track1) == (-1, -1)
    assert (int(rp.state_map[row]), rp.track_map[row].tolist()) == (rec.running, [-1, -1])
    # a row that keeps no record (its caller keeps it, a 13-tuple): any
    # record outside a row is the request's
    (row3,), (t,) = lc.admit([-1], [_C.ReqState().astuple()])
    mine = _C.ReqState(t)
    lc.free_states(mine)
    lc.match(key, cow=True, owner=row3, rs=mine)
    assert (int(rp.state_map[row3]), rp.track_map[row3].tolist()) == (mine.running, [-1, -1])


@pytest.mark.parametrize("call", ["prepare_extend", "decode_prepare", "decode_finish"])
@pytest.mark.parametrize("rs_kind", ["tuple", "unbound ReqState"])
def test_a_row_call_takes_only_a_row_in_use_and_its_own_record(call, rs_kind) -> None:
    """With pools, the per-row calls write the row's maps from rs: a free row,
    or a row whose bound record is another request's, is refused before
    anything changes (the row's record, the slots, the checks all stay)."""
    sa, ka, rp = _C.SlotAllocator(16), _C.SlotAllocator(256), _C.ReqPool(4, 64, 2)
    lc = _C.Lifecycle(sa, ka, rp, page_size=1, chunk_size=4, extra_buffer=True, lazy=True, track_interval=4)
    b = _C.ReqState()
    rows, _ = lc.admit([-1], [b])
    row = rows[0]
    other = (-1, 9, -1, 0, -1, -1, -1, 0, 1, 0, -1, 0, 0)
    rs = other if rs_kind == "tuple" else _C.ReqState(other)
    args = {"prepare_extend": (rs, 0, 8), "decode_prepare": (rs, 8), "decode_finish": (rs, 8, False)}[call]
    free_row = next(r for r in range(1, 5) if not rp.in_use(r))
    before, avail = b.astuple(), sa.available_size()
    with pytest.raises(ValueError, match=f"{call}\\(\\): row {row} holds another request's record"):
        getattr(lc, call)(row, *args)
    with pytest.raises(ValueError, match=f"{call}\\(\\): row {free_row} is not a request row in use"):
        getattr(lc, call)(free_row, *args)
    assert b.astuple() == before and sa.available_size() == avail
    lc.check()
    # the row's own record is taken
    getattr(lc, call)(row, b, *args[1:])
    lc.check()


def _batch_row(keys_ns=None):
    sa, ka, rp = _C.SlotAllocator(16), _C.SlotAllocator(256), _C.ReqPool(2, 64)
    lc = _C.Lifecycle(sa, ka, rp, page_size=1, chunk_size=4)
    lc.insert([1, 2, 3, 4], ka.alloc(4), lc.alloc_state())       # cached in namespace 0
    key = [1, 2, 3, 4, 5, 6, 7, 8]
    row = int(lc.prefill_batch([key])["rows"][0])                  # matched and locked there
    return lc, sa, rp, row, key


@pytest.mark.parametrize("rs_kind", ["tuple of its record", "unbound ReqState"])
def test_a_batch_row_takes_only_its_own_record(rs_kind) -> None:
    """A row that prefill_batch admitted keeps its record itself: match(cow,
    owner=row) and the per-row calls refuse a record from outside the row
    (even a copy of the row's own), and change nothing; the row's view is
    taken."""
    lc, sa, rp, row, key = _batch_row()
    own = rp.record(row)
    outside = own.astuple() if rs_kind.startswith("tuple") else _C.ReqState(own.astuple())
    before, avail, smap = own.astuple(), sa.available_size(), rp.state_map[row]
    with pytest.raises(ValueError, match=f"owner={row} holds another request's record"):
        lc.match([1, 2, 3, 4, 5], cow=True, owner=row, rs=_C.ReqState())
    with pytest.raises(ValueError, match=f"cache_unfinished\\(\\): row {row} holds another request's record"):
        lc.cache_unfinished(row, outside, key, 8)
    with pytest.raises(ValueError, match=f"decode_finish\\(\\): row {row} holds another request's record"):
        lc.decode_finish(row, outside, 8, False)
    assert (own.astuple(), sa.available_size(), rp.state_map[row]) == (before, avail, smap)
    lc.check()
    lc.cache_unfinished(row, own, key, 8)       # the row's own record (its view)
    lc.check()


@pytest.mark.parametrize("call", ["unfinished_batch", "finish_batch", "cache_unfinished", "cache_finished"])
def test_cache_calls_refuse_another_namespace_than_the_match(call) -> None:
    """A request matched (and locked) in namespace 0 cannot be cached under
    another: the tree's KV of its prefix would go to a second path.  Refused
    before anything changes, naming both namespaces."""
    lc, sa, rp, row, key = _batch_row()
    ns1 = lc.namespace("x")
    dump, avail = lc.dump(), sa.available_size()
    with pytest.raises(ValueError, match="but .*matched under namespace 0"):
        if call.endswith("_batch"):
            getattr(lc, call)([row], [key], ns=[ns1])
        elif call == "cache_unfinished":
            lc.cache_unfinished(row, rp.record(row), key, 8, ns=ns1)
        else:
            lc.cache_finished(row, rp.record(row), key, 8, ns=ns1)
    assert (lc.dump(), sa.available_size()) == (dump, avail)
    lc.check()
    getattr(lc, call)([row], [key], ns=[0]) if call.endswith("_batch") else None
    lc.check()


@pytest.mark.parametrize("values", [True, False])
def test_a_stale_lock_refuses_cache_finished_before_the_insert(values) -> None:
    """A record whose locked node handle names no node: cache_finished is
    refused (StaleNodeError) before it inserts anything, as it could not
    drop that lock afterwards."""
    import numpy as np
    lc = _C.Lifecycle(chunk_size=4, extra_buffer=True, values=values)
    rs = _C.ReqState()
    nid, ngen = lc.root()
    lc.cow(rs, nid, ngen)
    lc.lock(nid, ngen)
    rs.node_id, rs.node_gen, rs.locked = nid, ngen, 1
    lc.admit(rs, 1)
    toks = np.arange(1, 21, dtype=np.int64)
    kv = np.arange(100, 120, dtype=np.int64) if values else 20
    lc.prepare_extend(0, rs, 0, 20)
    t = list(rs.astuple())
    t[10] = 12345                          # node_id: names no node
    before = (lc.sizes(), lc.dump())
    with pytest.raises(_C.StaleNodeError if hasattr(_C, "StaleNodeError") else ValueError, match="stale"):
        lc.cache_finished(_C.ReqState(tuple(t)), toks, kv)
    assert (lc.sizes(), lc.dump()) == before
    lc.cache_finished(rs, toks, kv)        # the record as it is: accepted
    assert lc.sizes() != before[0]


def test_a_match_that_finds_nothing_caches_under_the_requests_namespace() -> None:
    """A miss locks the root, which belongs to no namespace: the request's
    cache calls under its own namespace are accepted (batch and per row)."""
    sa, ka, rp = _C.SlotAllocator(16), _C.SlotAllocator(256), _C.ReqPool(2, 64)
    lc = _C.Lifecycle(sa, ka, rp, page_size=1, chunk_size=4)
    ns = lc.namespace("tenant")
    key = [1, 2, 3, 4, 5, 6, 7, 8]
    row = int(lc.prefill_batch([key], ns=[ns])["rows"][0])
    lc.unfinished_batch([row], [key], ns=[ns])
    lc.finish_batch([row], [key], ns=[ns])
    lc.check()
    assert len(lc.match(key, ns=ns)[0]) == 8 and len(lc.match(key)[0]) == 0   # cached under ns only
