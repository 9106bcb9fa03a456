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
