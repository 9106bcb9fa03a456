"""Every request-lifecycle decision of the C core against SGLang v0.5.15's own
decision code, read from the installed wheel (tests/dropin/sglang_source.py):

- ``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend``: the track
  mask, the track slot, ``track_seqlen`` (the ``+ 1`` that makes the kernel read
  the per-chunk ``h``), the tracked length, branching points, the ping-pong flip;
- ``ScheduleBatch.mamba_lazy_prealloc_at_boundary`` and the decode mask, then
  ``SchedulerBatchResultProcessor._mamba_prefix_cache_update`` with
  ``_mamba_check_track_boundary`` and ``mamba_lazy_post_decode_at_boundary``;
- ``HybridReqToTokenPool.get_mamba_ping_pong_other_idx`` / ``_keep_idx`` (the
  slot the tree is given);
- ``alloc_req_slots``' state headroom;
- ``Req._compute_max_prefix_len`` (the match cap).

Small grids are exhaustive; large ones are random with fixed seeds
(``MAMBARADIX_TEST_SEEDS=1,2,3`` overrides them).  The Python copies of
these rules (``mambaradix.driver``, ``mambaradix.sglang``) are compared too.
"""

from __future__ import annotations

import itertools
import random
import types
from dataclasses import dataclass

import pytest

import sglang_source as S
from seeds import seeds

pytestmark = pytest.mark.skipif(S.SKIP_REASON is not None, reason=str(S.SKIP_REASON))
torch = pytest.importorskip("torch")

from mambaradix import _C  # noqa: E402

# --------------------------------------------------------------------------
# SGLang's code, with stand-ins for what surrounds it

SA = types.SimpleNamespace(mamba_cache_chunk_size=64, mamba_track_interval=256, lazy=False)
SA.enable_mamba_extra_buffer = lambda: True
SA.enable_mamba_extra_buffer_lazy = lambda: SA.lazy


@dataclass
class EvictParams:
    num_tokens: int = 0
    mamba_num: int = 0


_ENVS = types.SimpleNamespace(SGLANG_TEST_MAMBA_LAZY_ALLOC_FAIL=types.SimpleNamespace(get=lambda: False))
_ENV = {"get_global_server_args": lambda: SA, "EvictParams": EvictParams, "envs": _ENVS, "torch": torch}

if S.SKIP_REASON is None:
    MP = S.load_functions("srt/mem_cache/memory_pool.py", [
        "HybridReqToTokenPool.get_mamba_ping_pong_other_idx",
        "HybridReqToTokenPool.get_mamba_ping_pong_keep_idx",
        "HybridReqToTokenPool.set_mamba_ping_pong_slot",
        "HybridReqToTokenPool._alloc_ping_pong_buffer",
    ], _ENV)
    SB = S.load_functions("srt/managers/schedule_batch.py", [
        "_MambaRadixCacheV2TrackEntry",
        "ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend",
        "ScheduleBatch.mamba_lazy_prealloc_at_boundary",
        "Req._compute_max_prefix_len",
    ], dict(_ENV, NamedTuple=__import__("typing").NamedTuple))
    BR = S.load_functions("srt/managers/scheduler_components/batch_result_processor.py", [
        "SchedulerBatchResultProcessor._mamba_prefix_cache_update",
        "SchedulerBatchResultProcessor._mamba_check_track_boundary",
        "SchedulerBatchResultProcessor.mamba_lazy_post_decode_at_boundary",
    ], _ENV)

    class SGPool:
        """HybridReqToTokenPool's ping-pong methods over a list allocator."""

        get_mamba_ping_pong_other_idx = MP.get_mamba_ping_pong_other_idx
        get_mamba_ping_pong_keep_idx = MP.get_mamba_ping_pong_keep_idx
        set_mamba_ping_pong_slot = MP.set_mamba_ping_pong_slot
        _alloc_ping_pong_buffer = MP._alloc_ping_pong_buffer

        def __init__(self, pp: int, lazy: bool, free: int) -> None:
            self.mamba_ping_pong_track_buffer_size = pp
            self.enable_mamba_extra_buffer_lazy = lazy
            self.req_index_to_mamba_ping_pong_track_buffer_mapping = {}
            outer = self

            class Alloc:
                def __init__(self) -> None:
                    self.free_slots = list(range(1, free + 1))

                def alloc(self, n):
                    if len(self.free_slots) < n:
                        return None
                    out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
                    return torch.tensor(out, dtype=torch.int64)

                def free(self, t):
                    self.free_slots.extend(int(x) for x in t.reshape(-1).tolist())

                def available_size(self):
                    return len(self.free_slots)

            self.mamba_allocator = Alloc()
            del outer

    class SGBatch:
        _mamba_radix_cache_v2_req_prepare_for_extend = SB._mamba_radix_cache_v2_req_prepare_for_extend
        mamba_lazy_prealloc_at_boundary = SB.mamba_lazy_prealloc_at_boundary

        def __init__(self, pool, reqs=()) -> None:
            self.req_to_token_pool = pool
            self.reqs = list(reqs)
            self.tree_cache = types.SimpleNamespace(evict=lambda params: None)  # nothing cached to evict
            self.spec_algorithm = types.SimpleNamespace(is_none=lambda: True)
            self.seq_lens_cpu = None

    class SGProc:
        _mamba_prefix_cache_update = BR._mamba_prefix_cache_update
        _mamba_check_track_boundary = BR._mamba_check_track_boundary
        mamba_lazy_post_decode_at_boundary = BR.mamba_lazy_post_decode_at_boundary

    class SGReq:
        _compute_max_prefix_len = SB._compute_max_prefix_len

        def __init__(self, **kw) -> None:
            self.return_logprob = False
            self.logprob_start_len = -1
            self.req_pool_idx = 1
            self.mamba_lazy_is_insert = True
            self.mamba_last_track_seqlen = None
            self.mamba_branching_seqlen = None
            self._finished = False
            self.__dict__.update(kw)

        def finished(self) -> bool:
            return self._finished


MODES = {  # name: (lazy, track_buffer_size)
    "pp2": (False, 2),
    "pp1": (False, 1),
    "lazy": (True, 2),
}

# rs tuple fields (mambaradix/_C.pyi)
RUN, T0, T1, NEXT, LAST, BRANCH, COW, CLEAR, LAZY_INS = range(9)


def _rs(track=(101, 102), nxt=0, last=-1, branch=-1, pp=2):
    t1 = track[1] if pp == 2 else -1
    return (7, track[0], t1, nxt, last, branch, -1, 0, 1, 0, -1, 0, 0)


def _tree_lc(page_size: int, chunk: int, mode: str):
    lazy, pp = MODES[mode]
    return _C.Lifecycle(page_size=page_size, chunk_size=chunk, extra_buffer=True, lazy=lazy,
                        track_buffer_size=pp)


# --------------------------------------------------------------------------
# prefill: _mamba_radix_cache_v2_req_prepare_for_extend


def _compare_extend(lc, mode, C, P, E, B, nxt) -> None:
    lazy, pp = MODES[mode]
    SA.mamba_cache_chunk_size = C
    SA.lazy = lazy
    pool = SGPool(pp, lazy, 0)
    buf = [101, 102] if pp == 2 else [101]
    req = SGReq(prefix_indices=[0] * P, extend_range=types.SimpleNamespace(length=E),
                mamba_ping_pong_track_buffer=torch.tensor(buf, dtype=torch.int64),
                mamba_next_track_idx=nxt, mamba_branching_seqlen=B, mamba_last_track_seqlen=None)
    want = SGBatch(pool)._mamba_radix_cache_v2_req_prepare_for_extend(req)
    rs, slot, mask, seqlen = lc.prepare_extend(1, _rs(nxt=nxt, branch=-1 if B is None else B, pp=pp), P, E)
    ctx = dict(mode=mode, C=C, P=P, E=E, B=B, next=nxt)
    assert bool(mask) == bool(want.track_mask), ctx
    assert slot == int(want.track_index), ctx
    assert seqlen == int(want.track_seqlen), ctx
    last = req.mamba_last_track_seqlen
    assert rs[LAST] == (-1 if last is None else last), ctx
    assert rs[NEXT] == req.mamba_next_track_idx, ctx


def _interesting(C: int, page: int):
    vals = {0, 1, page, C - 1, C, C + 1, 2 * C - 1, 2 * C, 2 * C + 1, 3 * C, 3 * C + page, 5 * C - 1}
    return sorted(v for v in vals if v >= 0)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("C", [1, 2, 3, 4, 8])
def test_prepare_extend_exhaustive_small_chunks(mode, C) -> None:
    """Every prefix length, extend length (0 .. 3C + 2: one chunk, chunk +- 1,
    pieces that are no multiple of C), branching point (none, or any multiple
    of C up to the end + C: the match aligns it down to C, and SGLang asserts
    that) and ping-pong index."""
    lc = _tree_lc(1, C, mode)
    pp = MODES[mode][1]
    for P, E in itertools.product(range(0, 2 * C + 3), range(0, 3 * C + 3)):
        for B in [None] + list(range(0, P + E + C + 1, C)):
            for nxt in range(pp):
                _compare_extend(lc, mode, C, P, E, B, nxt)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("page,C", [(1, 64), (16, 16), (16, 64), (64, 64), (64, 128)])
def test_prepare_extend_page_sizes_grid(mode, page, C) -> None:
    """Page sizes 1, 16 and 64: prefix, extend and branching lengths around
    every chunk and page boundary."""
    lc = _tree_lc(page, C, mode)
    pts = _interesting(C, page)
    for P, E in itertools.product(pts, pts):
        bs = {(P + k * C + d) // C * C for k in range(0, 5) for d in (-C, 0, C)} | {(P + E) // C * C}
        for B in [None] + sorted(b for b in bs if b >= 0):
            for nxt in range(MODES[mode][1]):
                _compare_extend(lc, mode, C, P, E, B, nxt)


@pytest.mark.parametrize("seed", seeds(3))
def test_prepare_extend_random_large(seed) -> None:
    rng = random.Random(seed)
    lcs = {}
    for _ in range(3000):
        mode = rng.choice(sorted(MODES))
        page = rng.choice([1, 16, 64])
        C = page * rng.choice([1, 2, 4]) if page > 1 else rng.choice([1, 7, 64, 256])
        key = (mode, page, C)
        if key not in lcs:
            lcs[key] = _tree_lc(page, C, mode)
        P = rng.randrange(0, 1 << 20)
        E = rng.choice([rng.randrange(0, 1 << 20), rng.randrange(0, 3 * C + 2), C, C - 1, C + 1])
        B = rng.choice([None, (P + C * rng.randrange(0, E // C + 2)) // C * C, rng.randrange(0, P + E + 2) // C * C])
        _compare_extend(lcs[key], mode, C, P, E, B, rng.randrange(MODES[mode][1]))


def test_driver_prefill_track_point_matches_sglang() -> None:
    """mambaradix.driver.prefill_track_point (the replay engine's copy) is
    SGLang's tracked length."""
    from mambaradix.driver import prefill_track_point

    pool = SGPool(2, False, 0)
    SA.lazy = False
    for C in (1, 3, 8):
        SA.mamba_cache_chunk_size = C
        for P, E in itertools.product(range(0, 2 * C + 2), range(0, 3 * C + 2)):
            for B in [None] + list(range(0, P + E + C + 1, C)):
                req = SGReq(prefix_indices=[0] * P, extend_range=types.SimpleNamespace(length=E),
                            mamba_ping_pong_track_buffer=torch.tensor([1, 2]), mamba_next_track_idx=0,
                            mamba_branching_seqlen=B)
                SGBatch(pool)._mamba_radix_cache_v2_req_prepare_for_extend(req)
                assert prefill_track_point(P, E, C, B) == req.mamba_last_track_seqlen, (C, P, E, B)


# --------------------------------------------------------------------------
# decode: prealloc, mask, boundary, lazy post-decode


def _pools_lc(mode, interval, slots):
    lazy, pp = MODES[mode]
    st = _C.SlotAllocator(slots)
    lc = _C.Lifecycle(st, _C.SlotAllocator(64), _C.ReqPool(4, 1 << 16, pp), extra_buffer=True, lazy=lazy,
                      track_buffer_size=pp, track_interval=interval)
    return lc, st


def _run_decode(mode, interval, start, steps, spare) -> None:
    """One request decoding from `start` tokens for `steps` steps (the last
    one finishes it), with `spare` free state slots beyond its own."""
    lazy, pp = MODES[mode]
    own = 1 + (1 if lazy else pp)
    SA.lazy = lazy
    SA.mamba_track_interval = interval
    # C side: a row with its running slot and ping-pong buffer
    lc, st = _pools_lc(mode, interval, own + spare)
    rows, (rs,) = lc.admit([-1], [(-1, -1, -1, -1, -1, -1, -1, 0, 1, 0, -1, 0, 0)])
    row = rows[0]
    # SGLang side: the same buffer layout from SGLang's _alloc_ping_pong_buffer
    pool = SGPool(pp, lazy, own + spare)
    pool.mamba_allocator.alloc(1)  # the running slot
    req = SGReq(req_pool_idx=row, kv_committed_len=start, mamba_last_track_seqlen=None)
    pool._alloc_ping_pong_buffer(req)
    batch = SGBatch(pool, [req])
    proc = SGProc()

    def shape(buf):
        return [b == -1 for b in buf]

    for k in range(steps):
        seq = start + k + 1
        finished = k == steps - 1
        # before the forward
        batch.seq_lens_cpu = torch.tensor([seq])
        if lazy:
            batch.mamba_lazy_prealloc_at_boundary(interval)
        sg_buf = req.mamba_ping_pong_track_buffer.tolist()
        sg_slot = sg_buf[req.mamba_next_track_idx]
        sg_mask = seq % interval == 0  # prepare_for_decode: seq_lens_cpu % interval == 0
        rs, slot, mask = lc.decode_prepare(row, rs, seq)
        c_buf = [rs[T0], rs[T1]][:pp]
        ctx = dict(mode=mode, interval=interval, start=start, step=k, spare=spare)
        assert bool(mask) == sg_mask, ctx
        assert shape(c_buf) == shape(sg_buf), ctx
        assert rs[NEXT] == req.mamba_next_track_idx, ctx
        assert c_buf.index(slot) == sg_buf.index(sg_slot), ctx
        # after the result
        req.kv_committed_len = seq
        req._finished = finished
        proc._mamba_prefix_cache_update(req, batch, None, 0)
        rs, at = lc.decode_finish(row, rs, seq, finished)
        sg_buf = req.mamba_ping_pong_track_buffer.tolist()
        c_buf = [rs[T0], rs[T1]][:pp]
        assert bool(at) == (seq % interval == 0), ctx
        assert shape(c_buf) == shape(sg_buf), ctx
        assert rs[NEXT] == req.mamba_next_track_idx, ctx
        last = req.mamba_last_track_seqlen
        assert rs[LAST] == (-1 if last is None else last), ctx
        assert bool(rs[LAZY_INS]) == bool(req.mamba_lazy_is_insert), ctx
        assert st.available_size() == pool.mamba_allocator.available_size(), ctx
        # the slot the tree would be given: SGLang's keep index
        keep = pool.get_mamba_ping_pong_keep_idx(req)
        assert c_buf[keep] != -1 or sg_buf[keep] == -1, ctx


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("interval", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("spare", [0, 3])
def test_decode_boundaries_exhaustive(mode, interval, spare) -> None:
    """Every start length up to 3 intervals, 3 intervals of decode; spare 0:
    lazy mode cannot borrow its second slot (the failure path)."""
    for start in range(0, 3 * interval + 1):
        _run_decode(mode, interval, start, 3 * interval + 1, spare)


@pytest.mark.parametrize("seed", seeds(3))
def test_decode_boundaries_random(seed) -> None:
    rng = random.Random(seed)
    for _ in range(40):
        interval = rng.choice([16, 64, 256, 100])
        _run_decode(rng.choice(sorted(MODES)), interval, rng.randrange(0, 4096), rng.randrange(1, 3 * interval),
                    rng.choice([0, 1, 5]))


def test_driver_decode_track_due_matches_sglang() -> None:
    from mambaradix.driver import decode_track_due

    for interval in (1, 2, 7, 64, 256):
        SA.mamba_track_interval = interval
        for seq in range(0, 3 * interval + 2):
            req = SGReq(kv_committed_len=seq)
            at, ln = SGProc()._mamba_check_track_boundary(req, SGBatch(None), None, 0)
            assert decode_track_due(seq, interval) == at
            if at:
                assert ln == seq


# --------------------------------------------------------------------------
# keep / other ping-pong indices: the slot cache_unfinished_req donates


@pytest.mark.parametrize("mode,nxt", [(m, n) for m in sorted(MODES) for n in range(MODES[m][1])])
def test_donated_slot_is_sglangs_keep_index(mode, nxt) -> None:
    """cache_unfinished gives the tree track[keep] with SGLang's keep index,
    and the request's buffer gets a fresh slot in that place only."""
    lazy, pp = MODES[mode]
    SA.lazy = lazy
    st, kv, rp = _C.SlotAllocator(32), _C.SlotAllocator(64), _C.ReqPool(4, 1 << 16, pp)
    lc = _C.Lifecycle(st, kv, rp, extra_buffer=True, lazy=lazy, track_buffer_size=pp, track_interval=256,
                      chunk_size=4)
    rows, (rs,) = lc.admit([-1], [(-1, -1, -1, -1, -1, -1, -1, 0, 1, 0, -1, 0, 0)])
    row = rows[0]
    if lazy and nxt == 1:
        rs = rs[:T1] + (lc.alloc_state(owner=row),) + rs[T1 + 1:]
    rs = rs[:NEXT] + (nxt, 8) + rs[NEXT + 2:]
    toks = list(range(1, 11))
    idx = kv.alloc(10, owner=row)
    rp.write(row, 0, idx)
    before = [rs[T0], rs[T1]][:pp]
    pool = SGPool(pp, lazy, 0)
    req = SGReq(mamba_ping_pong_track_buffer=torch.tensor(before), mamba_next_track_idx=nxt)
    keep = pool.get_mamba_ping_pong_keep_idx(req)
    assert pool.get_mamba_ping_pong_other_idx(nxt) == (1 - nxt if pp == 2 else nxt)
    rs2, _, _, _ = lc.cache_unfinished(row, rs, toks, 10)
    node = lc.match(toks[:8])
    assert node[3] == before[keep]
    after = [rs2[T0], rs2[T1]][:pp]
    assert [a == b for a, b in zip(after, before)] == [i != keep for i in range(pp)]


# --------------------------------------------------------------------------
# alloc_req_slots' headroom


def _sg_headroom(avail: int, n: int, lazy: bool) -> int:
    """States SGLang's alloc_req_slots asks the tree to evict."""
    ns = {"MAMBA_STATE_PER_REQ_PREFIX_CACHE": S.module_constant("srt/mem_cache/common.py",
                                                               "MAMBA_STATE_PER_REQ_PREFIX_CACHE"),
          "MAMBA_STATE_PER_REQ_PREFIX_CACHE_LAZY": S.module_constant(
              "srt/mem_cache/common.py", "MAMBA_STATE_PER_REQ_PREFIX_CACHE_LAZY"),
          "MAMBA_STATE_PER_REQ_NO_CACHE": S.module_constant("srt/mem_cache/common.py",
                                                           "MAMBA_STATE_PER_REQ_NO_CACHE"),
          "EvictParams": EvictParams, "BasePrefixCache": object, "ReqToTokenPool": object}

    class HybridReqToTokenPool:
        enable_mamba_extra_buffer_lazy = lazy
        mamba_allocator = types.SimpleNamespace(schedulable_available_size=lambda: avail)

        def alloc(self, reqs):
            return list(range(len(reqs)))

    asked = []
    tree = types.SimpleNamespace(supports_mamba=lambda: True, evict=lambda p: asked.append(p.mamba_num))
    ns["HybridReqToTokenPool"] = HybridReqToTokenPool
    fn = S.load_functions("srt/mem_cache/common.py", ["alloc_req_slots"], ns).alloc_req_slots
    fn(HybridReqToTokenPool(), [None] * n, tree)
    return asked[0] if asked else 0


@pytest.mark.parametrize("lazy", [False, True])
def test_admission_headroom_matches_alloc_req_slots(lazy) -> None:
    """Lifecycle.admit(headroom=True) evicts exactly the states SGLang asks
    for (as many as the tree has), for every free count and batch size."""
    from mambaradix.driver import state_headroom

    cached = 12
    for n in range(1, 5):
        for free in range(0, 3 * n + 3):
            want = _sg_headroom(free, n, lazy)
            assert state_headroom(free, n, lazy) == want
            total = cached + free
            st = _C.SlotAllocator(total)
            kv = _C.SlotAllocator(4 * cached, 1)
            lc = _C.Lifecycle(st, kv, _C.ReqPool(8, 64, 2), extra_buffer=True, lazy=lazy,
                              track_buffer_size=2, chunk_size=4)
            for i in range(cached):  # `cached` unlocked states in the tree
                s = lc.alloc_state()
                lc.insert([1000 + i, 1], kv.alloc(2), s)
            assert st.available_size() == free
            lc.admit([-1] * n, [(-1, -1, -1, -1, -1, -1, -1, 0, 1, 0, -1, 0, 0)] * n, headroom=True)
            assert lc.stats()["states_evicted"] == min(want, cached), (n, free, lazy)
            lc.check()


# --------------------------------------------------------------------------
# decode retraction order


def _sg_retract_order(reqs: list, keep: int) -> list:
    """The requests SGLang's ScheduleBatch.retract_decode retracts, in order,
    when decode memory fits once ``keep`` requests are left."""
    ns = {"FINISH_ABORT": lambda *a, **k: None, "HTTPStatus": types.SimpleNamespace(
        INTERNAL_SERVER_ERROR=500), "logger": types.SimpleNamespace(warning=lambda *a, **k: None),
        "NewTokenRatioTracker": types.SimpleNamespace(
            estimate_new_token_ratio_after_retract=lambda reqs: 0.0)}
    fn = S.load_functions("srt/managers/schedule_batch.py", ["ScheduleBatch.retract_decode"],
                          ns).retract_decode
    batch = types.SimpleNamespace(
        reqs=list(reqs), check_decode_mem=lambda selected_indices: len(selected_indices) <= keep,
        release_req=lambda idx, n, server_args: None, filter_batch=lambda keep_indices: None)
    retracted, _, aborted = fn(batch, types.SimpleNamespace(speculative_algorithm=None))
    assert not aborted
    return retracted


@pytest.mark.parametrize("seed", seeds())
def test_retract_victim_matches_sglang(seed) -> None:
    """The scheduler's retraction order (mambaradix.scheduler.retract_victim,
    one request at a time while decode memory is short) is SGLang's: fewest
    outputs first, then the longest prompt, ties by batch order."""
    from mambaradix.scheduler import retract_victim

    rng = random.Random(seed)
    for _ in range(200):
        n = rng.randint(2, 9)
        reqs = [types.SimpleNamespace(output_ids=[0] * rng.randint(0, 3),
                                      origin_input_ids=[0] * rng.randint(1, 4), i=i)
                for i in range(n)]
        for r in reqs:
            r.n_out, r.prompt_len = len(r.output_ids), len(r.origin_input_ids)
        keep = rng.randint(1, n - 1)
        want = _sg_retract_order(reqs, keep)
        running, got = list(reqs), []
        while len(running) > keep:
            v = retract_victim(running)
            running.remove(v)
            got.append(v)
        assert [r.i for r in got] == [r.i for r in want]


# --------------------------------------------------------------------------
# the match cap


def test_match_cap_matches_sglang() -> None:
    """SGLang's _compute_max_prefix_len against the C batch call (a tree with
    a state at every length), the drop-in Req and the driver's copy."""
    from mambaradix.driver import match_key_limit
    from mambaradix.sglang._api import Req as OurReq

    L = 40
    for page in (1, 4):
        st = _C.SlotAllocator(4 * L)
        kv = _C.SlotAllocator(64 * L, page)
        rp = _C.ReqPool(8, 4 * L, 2)
        lc = _C.Lifecycle(st, kv, rp, page_size=page, chunk_size=max(4, page),
                          extra_buffer=True, track_buffer_size=2)
        toks = list(range(1, L + 1))
        state_at = {}
        for n in range(page, L + 1, page):
            state_at[n] = lc.alloc_state()
            lc.insert(toks[:n], kv.alloc(n), state_at[n])
        for n in range(0, L + 3):
            cap = SGReq()._compute_max_prefix_len(n)
            assert match_key_limit(n, True) == cap
            ours = OurReq.__new__(OurReq)
            ours.return_logprob, ours.logprob_start_len = False, -1
            assert ours._compute_max_prefix_len(n) == cap
            if n == 0:
                continue
            key = toks[:n] if n <= L else toks + [999] * (n - L)
            out = lc.prefill_batch([key])
            assert out is not None
            hit = min(cap, L) // page * page
            assert int(out["prefix_len"][0]) == hit, (page, n)
            # the deferred copy-on-write: the node's state into the request's
            # running slot (SGLang: mamba_cow_src_index = the node's mamba_value)
            row = int(out["rows"][0])
            if hit:
                assert int(out["cow_src"][0]) == state_at[hit]
                assert int(out["cow_dst"][0]) == int(rp.state_map[row]) and out["clear"][0] == -1
            else:
                assert out["cow_src"][0] == -1 and out["clear"][0] == int(rp.state_map[row])
            lc.finish_batch(out["rows"], [key], is_insert=False)
            lc.check()
    # the logprob cap of the drop-in Req
    for n, start in itertools.product(range(0, 12), range(-1, 12)):
        sg = SGReq(return_logprob=True, logprob_start_len=start)
        ours = OurReq.__new__(OurReq)
        ours.return_logprob, ours.logprob_start_len = True, start
        assert ours._compute_max_prefix_len(n) == sg._compute_max_prefix_len(n)


def test_sglang_source_is_the_wheels() -> None:
    """The functions compared above are v0.5.15's text, not a paraphrase."""
    src = S.source_of("srt/managers/schedule_batch.py", "ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend")
    assert "_force_track_h(req.mamba_branching_seqlen)" in src


# --------------------------------------------------------------------------
# what the forward does with track_seqlen (tests/tensor/kernel_inputs.py)


def test_kernel_inputs_model_matches_sglangs_backend() -> None:
    """tracked_length, which the lifecycle tests' stand-in forward uses, is
    what SGLang's MambaAttnBackendBase._init_track_ssm_indices makes of the
    same inputs: the final state when track_seqlen - prefix is a multiple of
    C, else h[(track_seqlen - prefix) // C] (the state after prefix + that
    many chunks)."""
    from kernel_inputs import tracked_length

    class GDNBackend:  # not Mamba2AttnBackend: h holds one state per started chunk
        device = "cpu"

    fn = S.load_functions("srt/layers/attention/hybrid_linear_attn_backend.py",
                          ["MambaAttnBackendBase._init_track_ssm_indices"],
                          dict(_ENV, Mamba2AttnBackend=type("Mamba2AttnBackend", (), {})))._init_track_ssm_indices
    for C in (1, 4, 8):
        SA.mamba_cache_chunk_size = C
        for P, E in itertools.product(range(0, 2 * C + 2), range(C, 4 * C + 2)):
            seqlens = {P + E} | {b + 1 for b in range(C, P + E, C) if P < b < P + E and (b - P) % C == 0}
            for tsl in sorted(seqlens):
                fb = types.SimpleNamespace(
                    mamba_track_mask=torch.tensor([True]), extend_seq_lens=torch.tensor([E]),
                    mamba_track_indices=torch.tensor([5]), mamba_track_seqlens=torch.tensor([tsl]),
                    extend_prefix_lens=torch.tensor([P]))
                h_src, h_dst, f_src, f_dst = fn(GDNBackend(), torch.tensor([9]), fb)
                if len(f_src):
                    got = P + E                                   # last_recurrent_state
                else:
                    assert len(h_src) == 1
                    got = P + int(h_src[0]) * C                   # h[k]: state after k chunks
                assert tracked_length(P, E, tsl, C) == got, (C, P, E, tsl)
