"""The drop-in's per-request path reads nothing back from the pools'
device: a full batch (match, admission, copy-on-write, prefill tracking,
cache_unfinished_req, decode tracking, cache_finished_req) over
mambaradix's own pools makes no device-to-host conversion of a tensor.

On a GPU each such conversion (`.tolist()`, `.item()`, `int(t)`, `.cpu()`,
`.numpy()`, ...) is a stream synchronisation.  Here the pools live on the
CPU, so the guard counts the conversions themselves, on every tensor,
while a drop-in call runs; test_dropin_no_sync_gpu.py runs the same batch
under torch.cuda's sync debug mode.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, List

import pytest

torch = pytest.importorskip("torch")

from dropin_batch import MODES, run_batch  # noqa: E402

# every way a tensor's values reach the host as Python or NumPy values
CONVERSIONS = ["tolist", "item", "numpy", "cpu", "__int__", "__index__", "__float__", "__bool__", "__array__"]


class ConversionGuard:
    """Counts the conversions made while a guarded call runs (the calls the
    harness makes between them are not counted)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.active = 0
        self.seen: List[str] = []
        for name in CONVERSIONS:
            orig = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._wrap(name, orig))

    def _wrap(self, name: str, orig):
        guard = self

        def counted(self, *args, **kwargs):
            if guard.active:
                guard.seen.append(name)
            return orig(self, *args, **kwargs)

        return counted

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1


@pytest.mark.parametrize("mode", list(MODES))
def test_full_batch_makes_no_host_conversion(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    guard = ConversionGuard(monkeypatch)
    hits = run_batch(mode, "cpu", guard)
    assert guard.seen == []
    # the batch did what it should: the second round hit what the first cached
    assert hits[:2] == [0, 0] and min(hits[3:]) >= 16


def test_guard_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard sees a conversion made inside it, and only there."""
    guard = ConversionGuard(monkeypatch)
    t = torch.tensor([3, 4])
    int(t[0])
    with guard():
        int(t[0])
        t.tolist()
        list(range(10))[t[1]]
    assert guard.seen == ["__int__", "tolist", "__index__"]


def test_request_fields_live_in_the_record() -> None:
    """The Req's state fields are the C record the lifecycle updates, which
    lives in the request's ReqPool row from admission on: the running slot
    and track buffer read through to the row, the buffer is the row of the
    pool's track map (no copy), a write through the pool writes the record
    and the map, and a write that bypasses the pool is caught by the check."""
    from mambaradix import _C
    from mambaradix.sglang import Req

    from dropin_batch import make

    cache, pool, _ = make("extra_buffer", "cpu")
    r = Req(rid=1, origin_input_ids=[1, 2, 3])
    r.init_next_round_input(cache)
    pool.alloc([r])
    rs, row = r._rs, r.req_pool_idx
    assert rs.row == row
    view = pool._rp.record(row)  # the pool's own view of the row's record
    assert rs.running >= 1 and int(r.mamba_pool_idx) == rs.running == view.running
    view_running = view.running
    assert r.mamba_ping_pong_track_buffer.tolist() == [view.track0, view.track1] == [rs.track0, rs.track1]
    assert pool._rp.state_map[row] == rs.running
    buf = r.mamba_ping_pong_track_buffer
    assert buf.data_ptr() == pool.req_index_to_mamba_ping_pong_track_buffer_mapping[row].data_ptr()
    t0, t1 = rs.track0, rs.track1
    pool.set_mamba_ping_pong_slot(r, 0, t1)  # swap the two slots through the pool
    pool.set_mamba_ping_pong_slot(r, 1, torch.tensor(t0))
    assert (view.track0, view.track1) == (rs.track0, rs.track1) == (t1, t0) and buf.tolist() == [t1, t0]
    cache.sanity_check()
    buf[1] = t1  # the buffer is the record's track entries: the check sees the slot twice
    assert rs.track1 == view.track1 == t1
    with pytest.raises(_C.InvariantError, match=f"Q2: row {row} holds slot {t1} twice"):
        cache.sanity_check()
    buf[1] = t0
    cache.sanity_check()
    pool.free(r)  # the record goes back to the request: its fields read as before
    assert rs.row == -1 and r.req_pool_idx is None and int(r.mamba_pool_idx) == view_running
    assert r.mamba_ping_pong_track_buffer.tolist() == [t1, t0]
    with pytest.raises(ReferenceError, match=f"request row {row}, which was freed"):
        view.running
    pool.free_mamba_cache(r)
    cache.sanity_check()
    assert r.mamba_pool_idx is None and r.mamba_ping_pong_track_buffer is None and r.mamba_next_track_idx is None


def test_slot_index_views_and_buffers() -> None:
    """SlotIndex hands out slot v as a view of one tensor (slot -1 included)
    and a track buffer as a new tensor, which a caller may overwrite."""
    from mambaradix import _C
    from mambaradix.sglang import SlotIndex

    ix = SlotIndex(4, "cpu", pp=2)
    assert [int(ix.slot(v)) for v in (-1, 0, 3, 4)] == [-1, 0, 3, 4]
    assert ix.slot1(2).tolist() == [2] and ix.slot(2).data_ptr() == ix.ids.data_ptr() + 3 * 8
    assert int(ix.slot(9)) == 9  # grows past the pool's size
    rs = _C.ReqState((1, 2, 3, 0, -1, -1, -1, 0, 1, 0, -1, 0, 0))
    buf = ix.buffer(rs, 2)
    assert buf.tolist() == [2, 3]
    buf[0] = 7
    assert int(ix.slot(2)) == 2
    assert ix.buffer(rs, 1).tolist() == [2]
    rs.track1 = -1  # lazy: one slot held
    assert ix.buffer(rs, 2).tolist() == [2, -1]


@pytest.mark.parametrize("mode", ["extra_buffer", "lazy"])
def test_ping_pong_slot_calls_make_no_host_conversion(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool calls SGLang's code makes on a request's ping-pong buffer
    (donate_mamba_ping_pong_slot in cache_unfinished_req; set_mamba_ping_pong_slot
    with the allocator's new_slot[0] at a lazy borrow, with -1 once that slot is
    given back) read our request's slots from its record and the
    allocator's index views, never from a tensor; the buffer, the row's
    track map and the slots' owners follow."""
    from mambaradix.sglang import Req

    from dropin_batch import make

    cache, pool, _ = make(mode, "cpu")
    r = Req(rid=1, origin_input_ids=[1, 2, 3])
    r.init_next_round_input(cache)
    pool.alloc([r])
    row, rs, slots = r.req_pool_idx, r._rs, pool.mamba_allocator._slots
    k = pool.get_mamba_ping_pong_keep_idx(r)
    other = pool.get_mamba_ping_pong_other_idx(r.mamba_next_track_idx)
    tracks = [rs.track0, rs.track1]
    guard = ConversionGuard(monkeypatch)
    with guard():
        new = pool.mamba_allocator.alloc(1)
        donated = pool.donate_mamba_ping_pong_slot(r, new)
    assert guard.seen == []
    new_v = new.tolist()[0]
    assert donated.tolist() == [tracks[k]] and slots.owner(new_v) == row
    tracks[k] = new_v
    assert [rs.track0, rs.track1] == tracks and pool._rp.track_map[row].tolist() == tracks
    pool.mamba_allocator.free(donated)   # the cache would insert it
    if tracks[other] != -1:              # give the other slot back, then borrow one again
        pool.mamba_allocator.free([tracks[other]])
    with guard():
        pool.set_mamba_ping_pong_slot(r, other, -1)
        fresh = pool.mamba_allocator.alloc(1)
        pool.set_mamba_ping_pong_slot(r, other, fresh[0])
    assert guard.seen == []
    tracks[other] = fresh.tolist()[0]
    assert [rs.track0, rs.track1] == tracks and r.mamba_ping_pong_track_buffer.tolist() == tracks
    assert pool._rp.track_map[row].tolist() == tracks and slots.owner(tracks[other]) == row
    cache.sanity_check()
    pool.free_mamba_cache(r)
    pool.free(r)
    assert pool.mamba_allocator.available_size() == pool.mamba_allocator.size
    cache.sanity_check()


def test_insert_reads_a_slot_our_pool_handed_out_without_a_conversion(monkeypatch: pytest.MonkeyPatch) -> None:
    """insert()'s mamba_value from the pool's own allocator (a view of its
    slot index) is read from the view's offset, not from the tensor; a
    tensor made elsewhere is still read, and both name the same slot."""
    import numpy as np

    from dropin_batch import make
    from mambaradix.sglang import InsertParams, MatchPrefixParams, RadixKey

    cache, pool, alloc = make("extra_buffer", "cpu")
    guard = ConversionGuard(monkeypatch)
    for key, own in (([5, 6, 7], True), ([8, 9], False)):
        slot = pool.mamba_allocator.alloc(1)
        value = alloc.alloc(len(key)).numpy().copy()   # a host array: no tensor read for the KV
        mamba_value = slot if own else torch.tensor([int(slot[0])])
        with guard():
            cache.insert(InsertParams(key=RadixKey(key), value=value, mamba_value=mamba_value))
        assert guard.seen == ([] if own else ["__index__"])
        guard.seen.clear()
        res = cache.match_prefix(MatchPrefixParams(key=RadixKey(key)))
        assert np.array_equal(res.device_indices.numpy(), value)
        assert int(res.last_device_node.mamba_value[0]) == int(slot[0])
    cache.sanity_check()
