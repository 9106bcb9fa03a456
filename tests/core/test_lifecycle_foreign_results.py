"""What the tree-only Lifecycle's per-request calls hand back, as the
simulator's replay uses them: the cache calls' results (``cache_len``,
``kv_free_ends`` by name, the old items unpacked), a keys-only Lifecycle
(``values=False``, KV as a count) and ``admit`` with a slot counter.

References: the tree itself (a first insert into an empty tree adds exactly
the tokens a call cached), a Lifecycle that keeps KV values (the same calls
with real indices), and the two-call form of ``admit``."""

from __future__ import annotations

import random

import numpy as np
import pytest

from mambaradix import _C

SEEDS = (1, 7, 23)


def _lc(mode: str, page: int, values: bool = True, eot: bool = False) -> _C.Lifecycle:
    return _C.Lifecycle(page_size=page, chunk_size=4 * page, extra_buffer=mode != "no_buffer",
                        lazy=mode == "lazy", track_buffer_size=1 if mode == "pp1" else 2,
                        track_interval=8 * page, end_of_turn_states=eot, values=values)


@pytest.mark.parametrize("seed", SEEDS)
def test_cache_len_is_what_the_tree_took(seed: int) -> None:
    """Into an empty tree a call inserts exactly the tokens it cached: the
    tree's KV size after it is the call's cache_len."""
    rng = random.Random(seed)
    for _ in range(60):
        mode = rng.choice(("pp2", "pp1", "lazy", "no_buffer"))
        page = 1 if mode == "no_buffer" else rng.choice((1, 2, 4))
        eot = rng.random() < 0.5
        lc = _lc(mode, page, eot=eot)
        view = lc.tree_view()
        rs = _C.ReqState()
        assert lc.admit(rs, 1)[1] == (1 if mode == "no_buffer" else 2 if mode == "lazy" else
                                              2 if mode == "pp1" else 3)
        n = rng.randint(1, 12) * page
        tokens = np.array([rng.randint(1, 50) for _ in range(n + 2 * page)], np.int32)
        kv = np.arange(1000, 1000 + len(tokens))
        if rng.random() < 0.5:
            # an unfinished request: its tracked length (extra_buffer), or all of it
            lc.prepare_extend(0, rs, 0, n)
            res = lc.cache_unfinished(rs, tokens[:n], kv[:n], 100, prefix=False)
            assert len(res) == 7 and res[0] is rs and res.table_end == res[6]
        else:
            if mode != "no_buffer" and rng.random() < 0.7:
                rs.last_track_seqlen = rng.randint(0, n // page) * page
            res = lc.cache_finished(rs, tokens[:n], kv[:n], is_insert=rng.random() < 0.8,
                                            state_available=rng.choice((-1, 0, 3)))
            assert len(res) == 3 and res[0] is rs
        assert res.cache_len == view.total_size()[0]
        assert res.kv_free_ends.tolist() == lc.kv_free_ends.tolist()
        assert (res.kv_free_ends[-1] if res.kv_free_ends.size else 0) == len(res.kv_to_free)


def _run(lc: _C.Lifecycle, values: bool, seed: int, mode: str) -> list:
    """A random sequence of requests (shared prefixes, chunks, decodes,
    finishes, aborts) through the tree-only calls; what each call handed
    back, with the KV indices counted, not read."""
    rng = random.Random(seed)
    out = []
    sid = 1
    kv_next = 1
    stems = [[rng.randint(1, 9) for _ in range(rng.randint(4, 40))] for _ in range(4)]
    live = []
    for step in range(120):
        if not live or (len(live) < 4 and rng.random() < 0.4):
            toks = rng.choice(stems) + [rng.randint(1, 9) for _ in range(rng.randint(1, 30))]
            rs = _C.ReqState()
            n = lc.admit(rs, sid)[1]
            sid += n
            live.append([rs, np.array(toks, np.int32), np.arange(kv_next, kv_next + len(toks) + 40), 0])
            kv_next += len(toks) + 40
            out.append(("admit", n))
        i = rng.randrange(len(live))
        rs, toks, kv, done = live[i]
        what = rng.random()
        if done < len(toks) and what < 0.6:
            step_len = min(len(toks) - done, rng.randint(1, 24))
            _, slot, mask, seqlen = lc.prepare_extend(0, rs, done, step_len)
            done += step_len
            res = lc.cache_unfinished(rs, toks, kv[:done] if values else done, sid, prefix=False)
            sid += 1
            out.append(("unfinished", slot, mask, seqlen, res.cache_len, res.table_end, len(res.kv_to_free),
                        res.slots_to_free.tolist(), res.kv_free_ends.tolist(), res.fork_src, res.fork_dst))
            live[i][3] = done
        else:
            c = max(done, 1)
            fin = lc.decode_finish(rs, c, True)
            res = lc.cache_finished(rs, np.concatenate([toks, toks])[:c], kv[:c] if values else c,
                                            is_insert=what < 0.9, state_available=rng.choice((-1, 3)))
            out.append(("finished", fin[1], fin[2].tolist(), res.cache_len, len(res.kv_to_free),
                        res.slots_to_free.tolist(), res.kv_free_ends.tolist()))
            if not values:
                assert not res.kv_to_free.any()
            live.pop(i)
        out.append(rs.astuple())
        out.append(tuple(lc.sizes()))
    return out


@pytest.mark.parametrize("mode", ["pp2", "pp1", "lazy", "no_buffer"])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_keys_only_lifecycle_runs_as_the_one_with_values(mode: str, seed: int) -> None:
    """values=False: the same records, frees (as counts), cached lengths and
    tree as a Lifecycle keeping real KV indices."""
    with_values = _run(_lc(mode, 1), True, seed, mode)
    keys_only = _run(_lc(mode, 1, values=False), False, seed, mode)
    assert keys_only == with_values


def test_values_false_is_for_a_lifecycle_without_pools_and_takes_a_count() -> None:
    with pytest.raises(ValueError, match="values=False"):
        _C.Lifecycle(_C.SlotAllocator(4), _C.SlotAllocator(16), _C.ReqPool(2, 8, 2), values=False)
    lc = _lc("pp2", 1, values=False)
    rs = _C.ReqState((1, 2, 3, 0, 4, -1, -1, 0, 1, 0, -1, 0, 0))
    before = rs.astuple()
    with pytest.raises(TypeError, match=r"cache_finished\(\): kv"):
        lc.cache_finished(rs, [1, 2, 3, 4], np.arange(4))
    with pytest.raises(ValueError, match=r"cache_unfinished\(\): kv"):
        lc.cache_unfinished(rs, [1, 2, 3, 4], -1, 9)
    with pytest.raises(ValueError, match="tokens for"):
        lc.cache_finished(rs, [1, 2, 3], 4)
    assert rs.astuple() == before and lc.sizes()[0] == 0
    res = lc.cache_finished(rs, [1, 2, 3, 4, 5], 5)
    assert res.cache_len == 4 and res.kv_to_free.tolist() == [0] and lc.tree_view().total_size() == (4, 1)


@pytest.mark.parametrize("mode", ["pp2", "pp1", "lazy", "no_buffer"])
@pytest.mark.parametrize("running", [-1, 5])
@pytest.mark.parametrize("has_track", [False, True])
def test_admit_with_a_counter_is_the_two_call_form(mode: str, running: int, has_track: bool) -> None:
    lc = _lc(mode, 1)
    track = (6, 7 if mode in ("pp2",) else -1) if has_track and mode != "no_buffer" else (-1, -1)
    nxt = 0 if track[0] >= 0 else -1
    rec = (running, track[0], track[1], nxt, -1, -1, -1, 0, 1, 0, -1, 0, 0)
    two = _C.ReqState(rec)
    _, need = lc.admit(two)
    if need:
        lc.admit(two, list(range(20, 20 + need)))
    one = _C.ReqState(rec)
    assert lc.admit(one, 20) == (one, need)
    assert one.astuple() == two.astuple()


def test_admit_counter_refuses_ids_the_request_holds() -> None:
    lc = _lc("pp2", 1)
    rs = _C.ReqState((-1, 6, 7, 0, -1, -1, -1, 0, 1, 0, -1, 0, 0))   # wants a running slot
    before = rs.astuple()
    with pytest.raises(ValueError, match="admit"):
        lc.admit(rs, 7)
    assert rs.astuple() == before
    with pytest.raises(ValueError, match=r"admit\(\): fresh"):
        lc.admit(rs, 0)
    assert rs.astuple() == before
    assert lc.admit(rs, 8)[1] == 1 and rs.running == 8
    # it wants nothing now: no id is taken, whatever the counter says
    assert lc.admit(rs, 6)[1] == 0 and rs.running == 8


@pytest.mark.parametrize("protected", (-1, -3, -40))
@pytest.mark.parametrize("is_insert", (False, True))
def test_cache_finished_never_hands_back_an_index_outside_kv(protected: int, is_insert: bool) -> None:
    """A record whose protected_len is negative (ReqState.protected_len
    takes any int64) protects nothing: what cache_finished hands back to
    free is drawn from the caller's kv only, as SGLang frees
    kv[cache_protected_len:] of the request's own indices, and with
    is_insert=False it is all of kv.  Before, the tree-only call read kv
    from protected_len on, before the array's first entry."""
    lc = _lc("pp2", 1)
    rec = list(_C.ReqState().astuple())
    rec[9] = protected
    rs = _C.ReqState(tuple(rec))
    lc.admit(rs, 1)
    kv = np.arange(1000, 1009, dtype=np.int64)
    res = lc.cache_finished(rs, list(range(9)), kv, is_insert=is_insert)
    freed = res[1].tolist()
    assert set(freed) <= set(kv.tolist()), freed
    if not is_insert:
        assert freed == kv.tolist()


@pytest.mark.parametrize("seed", SEEDS)
def test_unfinished_cache_len_says_what_the_call_caches(seed: int) -> None:
    """SGLang's cache_unfinished_req caches the tracked length with
    extra_buffer (nothing at all, not even a fresh slot taken, when nothing
    was tracked: mamba_last_track_seqlen is None) and every fill token
    without: unfinished_cache_len says so before the call, and the call's
    own cache_len (into an empty tree) agrees."""
    rng = random.Random(seed)
    for _ in range(40):
        mode = rng.choice(("pp2", "pp1", "lazy", "no_buffer"))
        page = 1 if mode == "no_buffer" else rng.choice((1, 2, 4))
        lc = _lc(mode, page)
        rs = _C.ReqState()
        lc.admit(rs, 1)
        n = rng.randint(1, 12) * page
        tracked = mode != "no_buffer" and rng.random() < 0.6
        if tracked:
            rs.last_track_seqlen = rng.randint(1, n // page) * page
        want = n if mode == "no_buffer" else rs.last_track_seqlen if tracked else -1
        before = rs.astuple()
        assert lc.unfinished_cache_len(rs, n) == want
        assert rs.astuple() == before          # a question, not a call
        tokens = np.arange(1, n + 1, dtype=np.int32)
        res = lc.cache_unfinished(rs, tokens, np.arange(1000, 1000 + n), 100, prefix=False)
        assert res.cache_len == max(want, 0) == lc.tree_view().total_size()[0]
        assert (100 in res[5].tolist()) == (want < 0)     # an untaken fresh slot comes back
    with pytest.raises(ValueError, match="fill_len"):
        lc.unfinished_cache_len(_C.ReqState(), -1)
    with pytest.raises(ValueError, match="rs must have 13 items"):
        lc.unfinished_cache_len((1, 2), 3)
