"""A refused batch call admits nothing and loses nothing.

prefill_batch decides whether the whole batch can be admitted before it
evicts anything: rows, a running slot and track buffer per request, and KV
pages for the extends, against what is free plus what eviction could free
around the batch's matched prefixes (SGLang's PrefillAdder admits against
available + evictable, and only the admitted requests evict).  It used to
evict the whole tree for the headroom of a batch that then did not get its
rows.  decode_batch and unfinished_batch decide first the same way.  A
refused call leaves the tree (dump, sizes, stats), the pools' owners and
the rows' records and tables exactly as they were."""

import random
from array import array

import pytest

from seeds import seeds

from mambaradix import _C


def _lifecycle(mode: str, slots: int, kv_pages: int, rows: int, page: int):
    extra = mode != "no_buffer"
    sa, ka, rp = _C.SlotAllocator(slots), _C.SlotAllocator(kv_pages * page, page), _C.ReqPool(rows, 256, 2)
    lc = _C.Lifecycle(sa, ka, rp, page_size=page, chunk_size=page * 2, extra_buffer=extra,
                      lazy=mode == "lazy", track_interval=page * 2)
    return lc, sa, ka, rp


def _snapshot(lc, sa, ka, rp, rows) -> tuple:
    rows = [int(r) for r in rows]
    return (lc.sizes(), lc.dump(), lc.stats(), sa.counts(), ka.counts(), rp.available_size(),
            [rp.record(r).astuple() for r in rows], [rp.table[r].tolist() for r in rows])


def test_the_issue_reproducer_keeps_its_cache() -> None:
    """Issue 29, item 9: 20 requests for 8 rows.  The batch is refused and
    the cached key stays (sizes (8, 0, 1, 0, 1): 8 evictable tokens, one
    evictable state, one node); a batch of 8 is then admitted without
    evicting it (8 running slots and no KV eviction are needed: 31 slots and
    1016 tokens are free) and the cached key still matches whole."""
    sa, ka, rp = _C.SlotAllocator(32), _C.SlotAllocator(1024), _C.ReqPool(8, 256)
    lc = _C.Lifecycle(sa, ka, rp, page_size=1, chunk_size=4)
    lc.insert(list(range(1, 9)), ka.alloc(8), lc.alloc_state())
    assert lc.sizes() == (8, 0, 1, 0, 1)
    before = _snapshot(lc, sa, ka, rp, [])
    assert lc.prefill_batch([[i + 100, i + 200] for i in range(20)]) is None
    assert _snapshot(lc, sa, ka, rp, []) == before
    lc.check()
    out = lc.prefill_batch([[i + 100, i + 200] for i in range(8)])
    assert out is not None and out["prefix_len"].tolist() == [0] * 8
    assert lc.sizes() == (8, 0, 1, 0, 1)
    assert lc.match(list(range(1, 10)))[0].tolist() == list(range(1, 9))
    lc.check()


def test_a_refused_batch_does_not_split_or_refresh() -> None:
    """The refused batch's keys end inside a cached node and hit an older
    key: no split (the dump keeps its nodes) and no LRU refresh (the next
    state evicted is still the older key's)."""
    sa, ka, rp = _C.SlotAllocator(8), _C.SlotAllocator(64), _C.ReqPool(1, 64)
    lc = _C.Lifecycle(sa, ka, rp, page_size=1, chunk_size=4)
    old, new = [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]
    for k in (old, new):
        lc.insert(k, ka.alloc(6), lc.alloc_state())
    before = _snapshot(lc, sa, ka, rp, [])
    # two requests for one row: refused; one of them would split `old` at 3
    assert lc.prefill_batch([old[:3] + [50, 51], old + [52]]) is None
    assert _snapshot(lc, sa, ka, rp, []) == before
    tokens, states, _, _ = lc.evict(0, 1)
    assert (tokens, states) == (6, 1)
    assert lc.match(new)[0].tolist() != [] and lc.match(old)[0].tolist() == []


def test_refused_decode_and_end_of_prefill_change_nothing() -> None:
    """decode_batch with the KV pool full and nothing evictable: None, and
    the tree, pools and rows as they were.  unfinished_batch for rows that
    cache when no state slot is free or evictable: RuntimeError before any
    row changed (it used to cache the rows before the one short of a
    slot)."""
    # no_buffer: each request takes one running slot; each row that caches
    # its prefix at the end of prefill takes one more (the fork)
    sa, ka, rp = _C.SlotAllocator(2), _C.SlotAllocator(8), _C.ReqPool(2, 64)
    lc = _C.Lifecycle(sa, ka, rp, page_size=1, chunk_size=4)
    keys = [[1, 2, 3, 4], [5, 6, 7, 8]]
    out = lc.prefill_batch(keys)
    rows = out["rows"]
    assert sa.available_size() == 0 and ka.available_size() == 0
    before = _snapshot(lc, sa, ka, rp, rows)
    assert lc.decode_batch(rows) is None
    assert _snapshot(lc, sa, ka, rp, rows) == before
    with pytest.raises(RuntimeError, match=r"^unfinished_batch\(\): the rows that cache need more state slots"):
        lc.unfinished_batch(rows, [array("q", k) for k in keys])
    assert _snapshot(lc, sa, ka, rp, rows) == before
    lc.check()
    lc.finish_batch(rows, keys)
    lc.check()


def test_a_refused_decode_step_keeps_what_it_could_not_use() -> None:
    """Three running requests need three KV tokens for a step; one is free
    and the tree holds one evictable token (a cached key): the step is
    refused and the key stays cached.  (SGLang's check_decode_mem evicts
    before it finds the step short and retracts; here the refusal comes
    first, the caller retracts and steps again, evicting only what that
    step needs.)"""
    sa, ka, rp = _C.SlotAllocator(32), _C.SlotAllocator(8), _C.ReqPool(4, 64)
    lc = _C.Lifecycle(sa, ka, rp, page_size=1, chunk_size=4)
    lc.insert([9], ka.alloc(1), lc.alloc_state())
    rows = lc.prefill_batch([[1, 2], [3, 4], [5, 6]])["rows"].tolist()
    assert ka.available_size() == 1 and lc.sizes()[0] == 1
    before = _snapshot(lc, sa, ka, rp, rows)
    assert lc.decode_batch(rows) is None
    assert _snapshot(lc, sa, ka, rp, rows) == before
    assert lc.match([9, 0])[0].tolist() != []
    lc.finish_batch(rows[2:], [[5, 6]])         # one request done: two steps fit, the key goes for the second
    assert lc.decode_batch(rows[:2]) is not None
    assert lc.sizes()[0] == 0 and lc.match([9, 0])[0].tolist() == []
    lc.check()


@pytest.mark.parametrize("mode,page", [("no_buffer", 1), ("extra_buffer", 4), ("lazy", 4)])
@pytest.mark.parametrize("seed", seeds(2))
def test_random_refused_batches_change_nothing(mode: str, page: int, seed: int) -> None:
    """Random prefill batches (shared prefixes, so they hit and split),
    decode steps, ends of prefill and finishes over small pools.  Every
    refused call leaves everything as it was; the accounting holds after
    every call.  The runs must refuse batches for each cause while the tree
    held something evictable (what the old code evicted before refusing)."""
    rng = random.Random(seed)
    lc, sa, ka, rp = _lifecycle(mode, slots=rng.randint(8, 14), kv_pages=rng.randint(20, 40) * 4 // page, rows=6,
                                page=page)
    bases = [[rng.randint(1, 20) for _ in range(40)] for _ in range(3)]
    running: dict = {}
    seen = {"rows": 0, "slots_or_kv": 0, "decode": 0, "unfinished": 0, "admitted": 0}
    for _ in range(400):
        k = rng.randint(1, 4) if rng.random() < 0.9 else 7
        keys = []
        for _ in range(k):
            b = rng.choice(bases)
            keys.append(b[: rng.randint(0, len(b))] + [rng.randint(1, 20) for _ in range(rng.randint(1, 3 * page))])
        live = list(running)
        before = _snapshot(lc, sa, ka, rp, live)
        evictable = lc.sizes()[0] > 0
        out = lc.prefill_batch(keys)
        if out is None:
            assert _snapshot(lc, sa, ka, rp, live) == before
            if evictable:
                seen["rows" if k > rp.available_size() else "slots_or_kv"] += 1
        else:
            seen["admitted"] += 1
            for r, key in zip(out["rows"].tolist(), keys):
                running[r] = list(key)
        lc.check()
        if running and rng.random() < 0.5:
            rows = list(running)
            before = _snapshot(lc, sa, ka, rp, rows)
            if lc.decode_batch(rows) is None:
                assert _snapshot(lc, sa, ka, rp, rows) == before
                seen["decode"] += 1
            else:
                for r in rows:
                    running[r].append(rng.randint(1, 20))
            lc.check()
        if running and rng.random() < 0.3:
            rows = rng.sample(list(running), rng.randint(1, len(running)))
            before = _snapshot(lc, sa, ka, rp, rows)
            try:
                lc.unfinished_batch(rows, [running[r] for r in rows])
            except RuntimeError:
                assert _snapshot(lc, sa, ka, rp, rows) == before
                seen["unfinished"] += 1
            lc.check()
        if running and rng.random() < 0.35:
            done = rng.sample(list(running), rng.randint(1, len(running)))
            lc.finish_batch(done, [running[r] + [0] for r in done])
            for r in done:
                del running[r]
            lc.check()
    assert seen["rows"] >= 5 and seen["slots_or_kv"] >= 5 and seen["unfinished"] >= 1 and seen["admitted"] >= 20, seen
